local price = require "nodes.recyclable_price"
local fx = require "node_fixtures"

local online = { base_url = "http://127.0.0.1:8080", api_key = "p-key", online = true }

describe("recyclable_price node", function()
  it("follows the node contract", function()
    assert.are.equal("recyclable_price", price.name)
    assert.are.equal("fail_open", price.policy)
  end)

  it("builds the price request", function()
    local req = price.build_request(online, "고철(중량)", "서울특별시")
    assert.are.equal("http://127.0.0.1:8080/v1/recyclable-prices", req.url)
    assert.are.same({ item = "고철(중량)", region = "서울특별시" }, req.query)
  end)

  it("parses prices, taking the unit from the body when a row has none", function()
    local res = price.parse_response(fx.load("recyclable_prices.json"))
    assert.are.equal("2024-06-01", res.as_of)
    assert.are.same({ item = "폐골판지", grade = "압축", price = 90, unit = "원/kg" }, res.prices[2])
  end)

  it("rejects a body without prices", function()
    assert.has_error(function() price.parse_response({}) end, "recyclable_price: response has no prices[] array")
  end)

  it("gives dated sample prices offline for the items asked", function()
    local c = price.run({ message = "고철 시세 얼마야?" }, fx.offline_ctx()).contexts.recyclable_price
    assert.is_true(c.ok and c.sample)
    assert.is_true(c.data.matched)
    assert.are.equal(2, #c.data.prices)
    assert.matches("샘플 값", c.text)
    assert.matches("기준일 2024%-06", c.text)
  end)

  it("lists every sample price when no item is named", function()
    local c = price.run({ message = "팔 수 있어?" }, fx.offline_ctx()).contexts.recyclable_price
    assert.is_false(c.data.matched)
    assert.matches("알루미늄캔 %(압축%): 1,200원/kg", c.text)
  end)
end)
