local bulk = require "nodes.bulk_waste"
local fx = require "node_fixtures"

local online = { base_url = "http://127.0.0.1:8080", api_key = "b-key", online = true }

describe("bulk_waste node", function()
  it("follows the node contract", function()
    assert.are.equal("bulk_waste", bulk.name)
    assert.are.equal("fail_open", bulk.policy)
  end)

  it("detects items and free-pickup appliances", function()
    local items, appliances = bulk.detect("쇼파랑 냉장고 버리려면 얼마야?")
    assert.are.same({ "소파" }, items)
    assert.are.same({ "냉장고" }, appliances)
  end)

  it("builds the fee request", function()
    local req = bulk.build_request(online, "서울특별시 강남구", "소파")
    assert.are.equal("http://127.0.0.1:8080/v1/bulk-waste/fees", req.url)
    assert.are.equal("Bearer b-key", req.headers.Authorization)
    assert.are.same({ district = "서울특별시 강남구", item = "소파" }, req.query)
  end)

  it("parses fees and formats won amounts", function()
    local res = bulk.parse_response(fx.load("bulk_waste_fees.json"))
    assert.are.equal("서울특별시 강남구", res.district)
    assert.are.same({ item = "소파", spec = "3인용 이상", fee = 15000 }, res.fees[1])
    local text = bulk.summarize(res, "수수료:", {}, nil)
    assert.matches("%- 소파 %(3인용 이상%): 15,000원", text)
    assert.matches("신고: https://example.org/bulk", text)
    assert.are.equal("1,234,567원", bulk.won(1234567))
  end)

  it("rejects a body without fees", function()
    assert.has_error(function() bulk.parse_response({ district = "x" }) end, "bulk_waste: response has no fees[] array")
  end)

  it("gives sample fees offline, labelled as a sample district", function()
    local c = bulk.run({ message = "소파 버리려면 얼마야?", user_location = "서울특별시 강남구" },
      fx.offline_ctx()).contexts.bulk_waste
    assert.is_true(c.ok and c.sample)
    assert.are.equal(3, #c.data.fees)
    assert.matches("샘플 데이터", c.text)
    assert.matches("실제 수수료가 아닙니다", c.text)
    assert.matches("소파 %(3인용 이상%): 12,000원", c.text)
  end)

  it("points large appliances to the free pickup instead of a fee", function()
    local c = bulk.run({ message = "냉장고 버리는 법" }, fx.offline_ctx()).contexts.bulk_waste
    assert.are.same({}, c.data.fees)
    assert.matches("1599%-0903", c.text)
  end)
end)
