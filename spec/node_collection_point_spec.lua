local cp = require "nodes.collection_point"
local fx = require "node_fixtures"

local online = { base_url = "http://127.0.0.1:8080", api_key = "cp-key", online = true }

describe("collection_point node", function()
  it("follows the node contract", function()
    assert.are.equal("collection_point", cp.name)
    assert.are.equal("fail_open", cp.policy)
  end)

  it("detects bin types from the question", function()
    assert.are.same({ "battery" }, cp.detect("폐건전지 어디에 버려?"))
    assert.are.same({ "lamp", "medicine" }, cp.detect("형광등이랑 약 버리는 곳"))
    assert.are.same({ "clothes" }, cp.detect("헌옷 수거함 어디야"))
    assert.are.same({}, cp.detect("종이 어떻게 버려? 그리고 수거함도 알려줘"))
  end)

  it("builds the request around a point", function()
    local req = cp.build_request(online, { type = "battery", lat = 37.5172, lon = 127.0473, address = "서울특별시 강남구" })
    assert.are.equal("http://127.0.0.1:8080/v1/collection-points", req.url)
    assert.are.equal("Bearer cp-key", req.headers.Authorization)
    assert.are.same({ type = "battery", lat = "37.517200", lon = "127.047300", radius = 2000,
                      address = "서울특별시 강남구" }, req.query)
  end)

  it("parses points", function()
    local pts = cp.parse_response(fx.load("collection_points.json"))
    assert.are.equal(2, #pts)
    assert.are.equal(620, pts[1].distance)
    assert.is_nil(pts[2].note)
    assert.matches("1%. %[battery%] 테스트 주민센터 폐건전지 수거함 — 서울 강남구 테스트로 10 %(약 620m%)",
      cp.summarize(pts, "수거함:"))
  end)

  it("rejects a body without points", function()
    assert.has_error(function() cp.parse_response({}) end, "collection_point: response has no points[] array")
  end)

  it("lists sample bins near the user for the seed's question", function()
    local c = cp.run({ message = "종이 어떻게 버려? 그리고 수거함도 알려줘", user_location = "서울특별시 강남구" },
      fx.offline_ctx()).contexts.collection_point
    assert.is_true(c.ok and c.sample)
    assert.matches("샘플 데이터", c.text)
    assert.is_true(#c.data.points >= 3)
    for _, p in ipairs(c.data.points) do assert.matches("강남구", p.address) end
  end)

  it("filters by the bin type asked and explains what goes in", function()
    local c = cp.run({ message = "폐건전지 어디에 버려?", user_location = "서울특별시 강남구" },
      fx.offline_ctx()).contexts.collection_point
    assert.are.same({ "battery" }, c.data.types)
    assert.is_true(#c.data.points > 0)
    for _, p in ipairs(c.data.points) do assert.are.equal("battery", p.type) end
    assert.matches("보조배터리", c.text)
  end)
end)
