-- The nodes' online adapters against the local test server, which replays
-- the recorded responses of spec/fixtures/ in the documented formats
-- (docs/adapters.md). Each case runs the node's own run() through
-- moongraph.http and checks both the request it sent and what it made of the
-- reply; a second group checks that a 500, a malformed body and a timeout
-- become errors that name the node (the pipeline's policies act on them).
local mg = require "moongraph"
local llm = require "moongraph.llm"
local cjson = require "cjson"
local testserver = require "testserver"
local fx = require "node_fixtures"
local registry = require "nodes.registry"

-- 2024-06-15 14:30 KST, the time of the recorded KMA forecast
local FORECAST_TIME = 1718429400

describe("node adapters online", function()
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)
  before_each(function() mg.run(function() srv:reset() end) end)

  local function record(path, body, extra)
    local reply = { path = path, status = 200, body = body,
                    headers = { ["Content-Type"] = "application/json" } }
    for k, v in pairs(extra or {}) do reply[k] = v end
    mg.run(function() srv:record(reply) end)
  end

  local function requests(path)
    return mg.run(function() return srv:requests(path) end)
  end

  -- ctx with every service offline except `service`, which points at the server
  local function ctx_for(service, extra)
    local ctx = fx.offline_ctx()
    ctx.config[service] = { base_url = srv.url, api_key = "KEY-123", timeout = 2 }
    for k, v in pairs(extra or {}) do ctx.config[service][k] = v end
    return ctx
  end

  local function run_node(name, state, ctx)
    local node = registry.load(name)
    return mg.run(function() return node.run(state, ctx) end)
  end

  it("location: Kakao Local keyword search with KakaoAK and the user's point", function()
    record("/v2/local/search/keyword.json", fx.raw("kakao_keyword.json"))
    local out = run_node("location", { message = "근처 제로웨이스트샵 어디야?",
      user_location = "서울특별시 강남구" }, ctx_for("kakao"))
    local c = out.contexts.location
    assert.is_true(c.ok)
    assert.are.equal("kakao", c.source)
    assert.is_false(c.sample)
    assert.is_true(#c.data.places > 0)
    assert.matches("카카오 지도", c.text)
    local req = requests("/v2/local/search/keyword.json")[1]
    assert.are.equal("GET", req.method)
    assert.are.equal("KakaoAK KEY-123", req.headers.authorization)
    assert.matches("query=", req.query)
    assert.matches("radius=", req.query)
    assert.matches("x=127%.", req.query)
    assert.matches("y=37%.", req.query)
  end)

  it("weather: KMA getVilageFcst with the grid point and the latest issue", function()
    record("/getVilageFcst", fx.raw("kma_vilage_fcst.json"))
    local ctx = ctx_for("kma")
    ctx.config.clock = function() return FORECAST_TIME end
    local c = run_node("weather", { message = "x", user_location = "서울특별시 강남구" }, ctx).contexts.weather
    assert.is_true(c.ok)
    assert.are.equal("kma", c.source)
    assert.are.equal("20240615", c.data.base_date)
    assert.are.equal("1400", c.data.base_time)
    assert.matches("기상청 단기예보", c.text)
    local req = requests("/getVilageFcst")[1]
    assert.matches("serviceKey=KEY%-123", req.query)
    assert.matches("dataType=JSON", req.query)
    assert.matches("base_date=20240615", req.query)
    assert.matches("base_time=1400", req.query)
    assert.matches("nx=" .. c.data.nx, req.query)
    assert.matches("ny=" .. c.data.ny, req.query)
  end)

  it("weather: a KMA error code is an error naming the node", function()
    record("/getVilageFcst", fx.raw("kma_no_data.json"))
    local ctx = ctx_for("kma")
    ctx.config.clock = function() return FORECAST_TIME end
    local ok, err = pcall(run_node, "weather", { message = "x", user_location = "서울특별시 강남구" }, ctx)
    assert.is_false(ok)
    assert.matches("^weather: KMA error 03: NO_DATA", err)
  end)

  it("web_search: Tavily POST /search with a bearer key and the question", function()
    record("/search", fx.raw("tavily_search.json"))
    local c = run_node("web_search", { message = "일회용컵 보증금제 최근 소식" },
      ctx_for("tavily")).contexts.web_search
    assert.is_true(c.ok)
    assert.are.equal("tavily", c.source)
    assert.matches("웹 검색 결과", c.text)
    local req = requests("/search")[1]
    assert.are.equal("POST", req.method)
    assert.are.equal("Bearer KEY-123", req.headers.authorization)
    local body = cjson.decode(req.body)
    assert.are.equal("일회용컵 보증금제 최근 소식", body.query)
    assert.is_number(body.max_results)
  end)

  it("image_generation: OpenAI-compatible POST /v1/images/generations (url and b64)", function()
    record("/v1/images/generations", fx.raw("image_url.json"))
    local c = run_node("image_generation", { message = "분리배출 인포그래픽 만들어줘" },
      ctx_for("image")).contexts.image_generation
    assert.is_true(c.ok)
    local req = requests("/v1/images/generations")[1]
    local body = cjson.decode(req.body)
    assert.is_string(body.model)
    assert.is_string(body.size)
    assert.matches("분리배출 인포그래픽", body.prompt)
    mg.run(function() srv:reset() end)
    record("/v1/images/generations", fx.raw("image_b64.json"))
    c = run_node("image_generation", { message = "포스터 그려줘" }, ctx_for("image")).contexts.image_generation
    assert.is_true(c.ok)
  end)

  it("character: GET /v1/characters with the question", function()
    record("/v1/characters", fx.raw("character_search.json"))
    local c = run_node("character", { message = "페티 어떻게 얻어?" }, ctx_for("character")).contexts.character
    assert.is_true(c.ok)
    assert.are.equal("character", c.source)
    assert.is_false(c.sample)
    local req = requests("/v1/characters")[1]
    assert.are.equal("Bearer KEY-123", req.headers.authorization)
    assert.matches("query=", req.query)
    assert.matches("limit=5", req.query)
  end)

  it("bulk_waste: GET /v1/bulk-waste/fees with district and item", function()
    record("/v1/bulk-waste/fees", fx.raw("bulk_waste_fees.json"))
    local c = run_node("bulk_waste", { message = "소파 버리는 수수료 얼마야?",
      user_location = "서울특별시 강남구" }, ctx_for("bulk_waste")).contexts.bulk_waste
    assert.is_true(c.ok)
    assert.are.equal("bulk_waste", c.source)
    assert.is_false(c.sample)
    local req = requests("/v1/bulk-waste/fees")[1]
    assert.matches("district=", req.query)
    assert.matches("item=", req.query)
  end)

  it("recyclable_price: GET /v1/recyclable-prices", function()
    record("/v1/recyclable-prices", fx.raw("recyclable_prices.json"))
    local c = run_node("recyclable_price", { message = "고철 시세 얼마야?", user_location = "서울특별시 강남구" },
      ctx_for("recyclable_price")).contexts.recyclable_price
    assert.is_true(c.ok)
    assert.are.equal("recyclable_price", c.source)
    assert.is_false(c.sample)
    assert.are.equal(1, #requests("/v1/recyclable-prices"))
  end)

  it("collection_point: GET /v1/collection-points with type and point", function()
    record("/v1/collection-points", fx.raw("collection_points.json"))
    local c = run_node("collection_point", { message = "폐건전지 수거함 어디 있어?",
      user_location = "서울특별시 강남구" }, ctx_for("collection_point")).contexts.collection_point
    assert.is_true(c.ok)
    assert.are.equal("collection_point", c.source)
    assert.is_false(c.sample)
    local req = requests("/v1/collection-points")[1]
    assert.matches("type=battery", req.query)
    assert.matches("lat=", req.query)
    assert.matches("radius=", req.query)
  end)

  it("general: the LLM's reply through moongraph.llm", function()
    mg.run(function() srv:script { content = "안녕하세요! 분리배출이 궁금하면 물어보세요." } end)
    local client = assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m", max_retries = 0 })
    local ctx = fx.offline_ctx { llm = client }
    local c = run_node("general", { message = "안녕?" }, ctx).contexts.general
    assert.is_true(c.ok)
    assert.are.equal("llm", c.source)
    assert.are.equal("안녕하세요! 분리배출이 궁금하면 물어보세요.", c.text)
    local req = requests("/v1/chat/completions")[1]
    local body = cjson.decode(req.body)
    assert.are.equal("system", body.messages[1].role)
    assert.are.equal("안녕?", body.messages[#body.messages].content)
  end)

  describe("failing upstreams raise errors that name the node", function()
    local cases = {
      { "location", "kakao", "/v2/local/search/keyword.json", { message = "근처 제로웨이스트샵", user_location = "서울특별시 강남구" } },
      { "web_search", "tavily", "/search", { message = "최신 분리배출 정책" } },
      { "collection_point", "collection_point", "/v1/collection-points", { message = "폐건전지 수거함", user_location = "서울특별시 강남구" } },
      { "weather", "kma", "/getVilageFcst", { message = "x", user_location = "서울특별시 강남구" } },
      { "character", "character", "/v1/characters", { message = "캐릭터 어떻게 얻어?" } },
    }
    for _, case in ipairs(cases) do
      local node, service, path, state = case[1], case[2], case[3], case[4]
      it(node .. ": HTTP 500", function()
        record(path, '{"error":"boom"}', { status = 500 })
        local ok, err = pcall(run_node, node, state, ctx_for(service))
        assert.is_false(ok)
        assert.matches("^" .. node .. ": HTTP 500", err)
      end)
      it(node .. ": malformed body", function()
        record(path, '{"documents": [ {"place_name": ')
        local ok, err = pcall(run_node, node, state, ctx_for(service))
        assert.is_false(ok)
        assert.matches("^" .. node .. ": malformed response body", err)
      end)
      it(node .. ": timeout", function()
        record(path, "{}", { delay_ms = 2000 })
        local ok, err = pcall(run_node, node, state, ctx_for(service, { timeout = 0.2 }))
        assert.is_false(ok)
        assert.matches("^" .. node .. ": request failed: .*timeout", err)
      end)
    end
  end)
end)
