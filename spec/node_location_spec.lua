local location = require "nodes.location"
local fx = require "node_fixtures"
local cjson = require "cjson"

local online = { base_url = "http://127.0.0.1:8080", api_key = "test-key", online = true }

describe("location node", function()
  it("follows the node contract", function()
    assert.are.equal("location", location.name)
    assert.are.equal("fail_open", location.policy)
    assert.is_number(location.timeout)
  end)

  it("picks the search keyword from the question", function()
    assert.are.equal("제로웨이스트샵", (location.search_target("근처 제로웨이스트 가게 알려줘")))
    assert.are.equal("고물상", (location.search_target("근처에 어디서 팔아?")))
    assert.are.equal("리필스테이션", (location.search_target("세제 리필 어디서 해?")))
    assert.are.equal("재활용센터", (location.search_target("근처 재활용센터는?")))
    assert.are.equal("재활용센터", (location.search_target("어디로 가야 돼?")))
  end)

  describe("Kakao request", function()
    it("searches around a point, nearest first", function()
      local req = location.build_request(online, { query = "재활용센터", lat = 37.5172, lon = 127.0473 })
      assert.are.equal("GET", req.method)
      assert.are.equal("http://127.0.0.1:8080/v2/local/search/keyword.json", req.url)
      assert.are.equal("KakaoAK test-key", req.headers.Authorization)
      assert.are.same({ query = "재활용센터", x = "127.047300", y = "37.517200", radius = 3000,
                        sort = "distance", size = 5 }, req.query)
    end)

    it("searches by keyword alone without a point", function()
      local req = location.build_request(online, { query = "강남구 재활용센터" })
      assert.are.same({ query = "강남구 재활용센터", size = 5 }, req.query)
    end)

    it("caps the radius at Kakao's 20 km", function()
      local req = location.build_request(online, { query = "q", lat = 37, lon = 127, radius = 50000 })
      assert.are.equal(20000, req.query.radius)
    end)

    it("rejects an empty query", function()
      assert.has_error(function() location.build_request(online, { query = "" }) end,
        "bad argument #2 to 'build_request': table with a non-empty query expected")
    end)
  end)

  describe("Kakao response", function()
    it("reads documents[] into places", function()
      local places = location.parse_response(fx.load("kakao_keyword.json"))
      assert.are.equal(2, #places)
      assert.are.same({
        name = "테스트 재활용센터 역삼점", address = "서울 강남구 역삼동 000-1",
        road_address = "서울 강남구 테스트로 1", lon = 127.036512, lat = 37.500812,
        distance = 418, phone = "02-000-0001", url = "http://place.map.kakao.com/1000001",
        category = "서비스,산업 > 재활용센터",
      }, places[1])
      -- empty phone and road address are absent, not empty strings
      assert.is_nil(places[2].phone)
      assert.is_nil(places[2].road_address)
    end)

    it("summarises places with distance and phone", function()
      local text = location.summarize(location.parse_response(fx.load("kakao_keyword.json")), "결과:")
      assert.matches("1%. 테스트 재활용센터 역삼점 — 서울 강남구 테스트로 1 %(약 418m%), ☎ 02%-000%-0001", text)
      assert.matches("2%. 테스트 자원순환센터 — 서울 강남구 논현동 000%-2 %(약 1%.5km%)", text)
    end)

    it("rejects a body without documents", function()
      assert.has_error(function() location.parse_response({ meta = {} }) end,
        "location: Kakao response has no documents[] array")
    end)
  end)

  describe("offline", function()
    it("lists sample places in the user's district, labelled as samples", function()
      local out = location.run({ message = "근처 재활용센터는?", user_location = "서울특별시 강남구" }, fx.offline_ctx())
      local c = out.contexts.location
      assert.is_true(c.ok)
      assert.is_true(c.sample)
      assert.are.equal("sample", c.source)
      assert.matches("샘플 데이터", c.text)
      assert.are.equal("강남 재활용센터 (샘플)", c.data.places[1].name)
      for _, p in ipairs(c.data.places) do assert.is_true(p.sample) end
      assert.is_string(cjson.encode(out))
    end)

    it("sorts by distance from coordinates", function()
      local out = location.run({ message = "제로웨이스트샵 어디 있어", user_location = { lat = 37.556, lon = 126.905 } },
        fx.offline_ctx())
      assert.are.equal("망원 제로웨이스트샵 (샘플)", out.contexts.location.data.places[1].name)
    end)

    it("asks for a location when none is given", function()
      local out = location.run({ message = "근처에 어디서 팔아?" }, fx.offline_ctx())
      assert.matches("위치를 알려주시면", out.contexts.location.text)
      assert.are.equal("고물상", out.contexts.location.data.category)
    end)

    it("says the sample has nothing instead of inventing a place", function()
      local out = location.run({ message = "리필 어디서 해", user_location = "대전" }, fx.offline_ctx())
      assert.are.same({}, out.contexts.location.data.places)
      assert.matches("샘플 데이터에는 대전광역시 근처 리필스테이션 정보가 없습니다", out.contexts.location.text)
    end)
  end)
end)
