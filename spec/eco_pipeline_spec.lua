-- The Eco² chat pipeline end to end, in process: the compiled graph of
-- scripts/eco/chat.lua with the real nodes, the offline defaults, and the
-- local test server standing in for upstream services and the LLM.
local mg = require "moongraph"
local llm = require "moongraph.llm"
local cjson = require "cjson"
local testserver = require "testserver"
local fx = require "node_fixtures"
local tmp = require "tmp"
local chat = require "scripts.eco.chat"

-- 2024-06-15 14:30 KST, the time of the recorded KMA forecast
local FORECAST_TIME = 1718429400
local SEED = "종이 어떻게 버려? 그리고 수거함도 알려줘"
local GANGNAM = "서울특별시 강남구"

-- Every service offline unless `online` names it: {service = {base_url=...}}.
local function config(extra)
  local cfg = fx.offline_ctx().config
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return cfg
end

-- Run one turn, collecting the stream: tokens, the nodes that ran (from the
-- engine's `tasks` events: {node, step, t0, t1, fallback_of}, a fallback
-- chain's failed nodes first), final state.
local function turn(app, message, cfg, opts)
  opts = opts or {}
  cfg.stream_mode = { "values", "messages", "tasks" }
  return mg.run(function()
    local out = { tokens = {}, nodes = {} }
    local started = {}
    local ok, err = pcall(function()
      for ev in app:stream(chat.input(message, { location = opts.location }), cfg) do
        if ev.mode == "messages" then
          out.tokens[#out.tokens + 1] = ev.data
          out.token_nodes = out.token_nodes or {}
          out.token_nodes[ev.node] = true
        elseif ev.mode == "tasks" and ev.data.event == "start" then
          started[ev.data.id] = ev.data.time
        elseif ev.mode == "tasks" then
          local d, t0 = ev.data, started[ev.data.id]
          local prev = nil
          for _, c in ipairs(d.chain or {}) do
            out.nodes[#out.nodes + 1] = { node = c.node, step = ev.step + 1, t0 = t0,
              t1 = t0 + c.duration, fallback_of = prev }
            prev, t0 = c.node, t0 + c.duration
          end
          out.nodes[#out.nodes + 1] = { node = d.ran or d.name, step = ev.step + 1, t0 = t0,
            t1 = started[d.id] + d.duration, fallback_of = prev }
        elseif ev.mode == "values" then
          out.state = ev.data
        end
      end
    end)
    if not ok then out.error = err end
    return out
  end)
end

local function step_of(out, node)
  for _, e in ipairs(out.nodes) do if e.node == node then return e.step end end
end

describe("Eco² chat pipeline", function()
  local app = chat.build()

  describe("the seed's multi-intent example, offline", function()
    local out = turn(app, SEED, config(), { location = GANGNAM })
    local s = out.state

    it("classifies waste with collection_point and routes weather by enrichment", function()
      assert.is_nil(out.error)
      assert.are.equal("waste", s.intent)
      assert.are.same({ "collection_point" }, s.additional_intents)
      assert.are.same({ "waste_rag", "collection_point", "weather" }, s.nodes_run)
    end)

    it("runs the three nodes in one parallel step, between intent and aggregator", function()
      local st = step_of(out, "waste_rag")
      assert.is_number(st)
      assert.are.equal(st, step_of(out, "collection_point"))
      assert.are.equal(st, step_of(out, "weather"))
      assert.are.equal(st - 1, step_of(out, "intent"))
      assert.are.equal(st + 1, step_of(out, "aggregator"))
      assert.are.equal(st + 2, step_of(out, "answer"))
      assert.are.equal(st + 3, step_of(out, "feedback"))
      assert.are.equal(st + 4, step_of(out, "summarize"))
    end)

    it("maps every node that ran to its result", function()
      assert.is_true(s.contexts.waste_rag.ok)
      assert.is_true(s.contexts.collection_point.ok)
      assert.is_true(s.contexts.collection_point.sample)
      assert.is_true(s.contexts.weather.unavailable)
    end)

    it("streams an offline answer that says what it lacks and what is a sample", function()
      assert.are.equal("offline", s.answer_source)
      assert.are.equal(s.answer, table.concat(out.tokens))
      assert.are.same({ answer = true }, out.token_nodes)
      assert.matches("^%[오프라인 답변%]", s.answer)
      assert.matches("종이류: 물기에 젖지 않게", s.answer)
      assert.matches("의류수거함", s.answer)
      assert.matches("※ 날씨 정보: 오프라인이라 날씨를 제공할 수 없습니다", s.answer)
      assert.matches("※ 샘플 데이터: 수거함 위치", s.answer)
    end)

    it("scores the answer and keeps the history", function()
      assert.are.equal("heuristic", s.quality.method)
      assert.is_true(s.quality.overall > 0.8)
      assert.are.equal(2, #s.messages)
      assert.are.equal("user", s.messages[1].role)
      assert.are.equal("assistant", s.messages[2].role)
      assert.is_number(s.context_tokens)
    end)
  end)

  describe("with upstream services on the test server", function()
    local srv
    setup(function() srv = testserver.start() end)
    teardown(function() srv:stop() end)
    before_each(function() mg.run(function() srv:reset() end) end)

    local function record(path, body, extra)
      local reply = { path = path, status = 200, body = body }
      for k, v in pairs(extra or {}) do reply[k] = v end
      mg.run(function() srv:record(reply) end)
    end

    local function online(service, extra)
      local c = { base_url = srv.url, api_key = "k", timeout = 1 }
      for k, v in pairs(extra or {}) do c[k] = v end
      return c
    end

    it("runs the seed example's upstream lookups at the same time", function()
      record("/v1/collection-points", fx.raw("collection_points.json"), { delay_ms = 150 })
      record("/getVilageFcst", fx.raw("kma_vilage_fcst.json"), { delay_ms = 150 })
      local cfg = config { collection_point = online(), kma = online() }
      cfg.clock = function() return FORECAST_TIME end
      local out = turn(app, SEED, cfg, { location = GANGNAM })
      assert.is_nil(out.error)
      local s = out.state
      assert.are.equal("collection_point", s.contexts.collection_point.source)
      assert.are.equal("kma", s.contexts.weather.source)
      assert.matches("■ 날씨 정보", s.answer)
      -- each of the two waiting nodes started before the other finished
      local ev = {}
      for _, e in ipairs(out.nodes) do ev[e.node] = e end
      assert.is_true(ev.collection_point.t0 < ev.weather.t1)
      assert.is_true(ev.weather.t0 < ev.collection_point.t1)
    end)

    describe("a failing fail_open node never breaks the answer", function()
      local faults = {
        { "HTTP 500", { status = 500 }, "HTTP 500" },
        { "a malformed body", {}, "malformed response body", "{\"response\": " },
        { "a timeout", { delay_ms = 1500 }, "timeout" },
      }
      for _, f in ipairs(faults) do
        local name, extra, pattern, body = f[1], f[2], f[3], f[4]

        it("weather with " .. name, function()
          record("/getVilageFcst", body or "{}", extra)
          local cfg = config { kma = online(nil, { timeout = 0.3 }) }
          cfg.clock = function() return FORECAST_TIME end
          local out = turn(app, SEED, cfg, { location = GANGNAM })
          assert.is_nil(out.error)
          local s = out.state
          assert.is_false(s.contexts.weather.ok)
          assert.matches("^weather: .*" .. pattern, s.contexts.weather.error)
          assert.are.equal("weather", s.errors[1].node)
          assert.are.same({ "waste_rag", "collection_point", "weather" }, s.nodes_run)
          assert.matches("종이류: 물기에 젖지 않게", s.answer)
          -- the user reads that it failed, never the upstream's error
          assert.matches("※ 날씨 정보: 가져오지 못했습니다\n", s.answer .. "\n")
          assert.is_nil(s.answer:find("weather:", 1, true))
        end)

        it("web_search with " .. name, function()
          record("/search", body or "{}", extra)
          local out = turn(app, "최근 일회용컵 보증금제 뉴스 알려줘",
            config { tavily = online(nil, { timeout = 0.3 }) })
          assert.is_nil(out.error)
          local s = out.state
          assert.are.equal("web_search", s.intent)
          assert.matches("^web_search: .*" .. pattern, s.contexts.web_search.error)
          assert.is_string(s.answer)
          assert.matches("※ 웹 검색 결과: 가져오지 못했습니다\n", s.answer .. "\n")
          assert.is_nil(s.answer:find("web_search:", 1, true))
        end)

        it("waste_rag's fallback web_search with " .. name, function()
          record("/search", body or "{}", extra)
          local out = turn(app, "뷁뷁 어떻게 버려?", config { tavily = online(nil, { timeout = 0.3 }) })
          assert.is_nil(out.error)
          local s = out.state
          -- the chain goes on with general, which without an LLM gives way to clarify
          assert.are.same({ "waste_rag", "web_search", "weather", "general", "clarify" }, s.nodes_run)
          assert.are.equal("web_search", s.contexts.waste_rag.fallback)
          assert.matches("^web_search: .*" .. pattern, s.contexts.web_search.error)
          assert.are.equal("waste_rag", s.errors[1].fallback_of)
          -- the end of the chain asks to rephrase and names both failures
          assert.are.equal("clarify", s.answer_source)
          assert.matches("다시 말씀해 주시겠어요", s.answer)
          assert.matches("※ 분리배출 방법: ", s.answer)
          assert.matches("※ 웹 검색 결과: 가져오지 못했습니다", s.answer)
        end)
      end
    end)

    it("waste_rag falls back to web search, whose results answer", function()
      record("/search", fx.raw("tavily_search.json"))
      local out = turn(app, "뷁뷁 어떻게 버려?", config { tavily = online() })
      local s = out.state
      assert.are.same({ "waste_rag", "web_search", "weather" }, s.nodes_run)
      assert.is_true(s.contexts.web_search.ok)
      assert.is_false(s.contexts.waste_rag.ok)
      assert.matches("no disposal rule matches", s.contexts.waste_rag.error)
      assert.are.equal("answer", s.aggregate.next)
      assert.matches("■ 웹 검색 결과 — 분리배출 방법을 찾지 못해 대신 가져왔습니다", s.answer)
      assert.matches("※ 분리배출 방법: 찾지 못해 웹 검색 결과로 대신했습니다", s.answer)
      -- the fallback ran in the same task, in the same step
      assert.is_number(step_of(out, "waste_rag"))
      assert.are.equal(step_of(out, "waste_rag"), step_of(out, "web_search"))
      local fallbacks = 0
      for _, e in ipairs(out.nodes) do
        if e.node == "web_search" then
          assert.are.equal("waste_rag", e.fallback_of)
          fallbacks = fallbacks + 1
        end
      end
      assert.are.equal(1, fallbacks)
    end)

    it("a failing character service (fail_close) ends the run with the node's error", function()
      record("/v1/characters", "{}", { status = 503 })
      local out = turn(app, "캐릭터 어떻게 얻어?", config { character = online() })
      assert.is_nil(out.state.answer)
      assert.matches("node 'character' failed: character: HTTP 503", out.error)
    end)

    describe("with an LLM", function()
      local function client()
        return assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m",
                                max_retries = 0, timeout = 5 })
      end

      it("continues the fallback chain with general, then answers with the LLM", function()
        mg.run(function() srv:script {
          { content = cjson.encode { intent = "waste", additional_intents = {}, confidence = 0.9 } },
          { content = "뷁뷁은 알 수 없는 품목이에요. 어떤 재질인지 알려 주세요." },
          { chunks = { "재질을 ", "알려 주시면 ", "안내할게요." } },
          { content = cjson.encode { faithfulness = 1, groundedness = 1, context_relevance = 0.5,
                                     answer_relevance = 0.8 } },
        } end)
        local cfg = config()
        cfg.llm = client()
        local out = turn(app, "뷁뷁 어떻게 버려?", cfg)
        assert.is_nil(out.error)
        local s = out.state
        assert.are.equal("llm", s.intent_source)
        assert.are.same({ "waste_rag", "web_search", "weather", "general" }, s.nodes_run)
        assert.are.equal("llm", s.contexts.general.source)
        assert.are.equal("llm", s.answer_source)
        assert.matches("^재질을 알려 주시면 안내할게요.", s.answer)
        assert.are.same({ "재질을 ", "알려 주시면 ", "안내할게요." },
          { out.tokens[1], out.tokens[2], out.tokens[3] })
        assert.are.equal("llm", s.quality.method)
      end)

      it("general falls back to clarify when the LLM fails", function()
        mg.run(function() srv:record { status = 500, body = "{}" } end)
        local cfg = config()
        cfg.llm = client()
        local out = turn(app, "안녕", cfg)
        assert.is_nil(out.error)
        local s = out.state
        assert.are.equal("general", s.intent)
        assert.are.same({ "general", "clarify" }, s.nodes_run)
        assert.matches("general: LLM call failed", s.contexts.general.error)
        assert.are.equal("clarify", s.answer_source)
        assert.matches("대화용 LLM 호출에 실패했습니다", s.answer)
        assert.are.equal("heuristic", s.quality.method)
      end)
    end)
  end)

  describe("a thread across turns", function()
    local threaded = chat.build { checkpointer = mg.checkpoint.memory() }

    it("feeds the previous intent into the transition boost (the seed's three turns)", function()
      local cfg = function() return config { thread_id = "seed-3" } end
      local t1 = turn(threaded, "냉장고 버리려면 어떻게 해?", cfg()).state
      assert.are.equal("bulk_waste", t1.intent)
      local t2 = turn(threaded, "팔 수 있어?", cfg()).state
      assert.are.equal("bulk_waste", t2.prev_intent)
      assert.are.equal("recyclable_price", t2.intent)
      assert.are.equal(0.08, t2.transition_boost)
      local t3 = turn(threaded, "근처에 어디서 팔아?", cfg()).state
      assert.are.equal("recyclable_price", t3.prev_intent)
      assert.are.equal("location", t3.intent)
      assert.are.equal(0.1, t3.transition_boost)
      assert.are.equal(3, t3.turn)
      assert.are.equal(6, #t3.messages)
      -- each turn's contexts are its own
      assert.are.same({ "location" }, t3.nodes_run)
      assert.is_nil(t3.contexts.bulk_waste)
      assert.is_nil(t3.contexts.recyclable_price)
    end)

    it("keeps the user's location for later turns", function()
      local cfg = function() return config { thread_id = "loc" } end
      turn(threaded, "페트병 어떻게 버려?", cfg(), { location = GANGNAM })
      local s = turn(threaded, "폐건전지 수거함 어디 있어?", cfg()).state
      assert.are.equal(GANGNAM, s.user_location)
      assert.matches("강남구", s.contexts.collection_point.text)
    end)
  end)

  it("writes a Chrome trace of the run", function()
    local path = tmp.path("trace.json")
    local cfg = config()
    cfg.trace = path
    local out = turn(app, SEED, cfg, { location = GANGNAM })
    assert.is_nil(out.error)
    local f = assert(io.open(path))
    local doc = cjson.decode(f:read("a"))
    f:close()
    local names = {}
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == "X" and e.cat == "task" then names[e.name] = true end
    end
    for _, n in ipairs({ "intent", "waste_rag", "collection_point", "weather", "aggregator",
                         "answer", "feedback", "summarize" }) do
      assert.is_true(names[n], n)
    end
  end)

  it("draws the graph with the fan-out and the fallback edges", function()
    local m = app:mermaid()
    for _, edge in ipairs {
      "n_intent -.-> n_waste_rag", "n_intent -.-> n_collection_point", "n_intent -.-> n_weather",
      "n_waste_rag --> n_aggregator", "n_aggregator -.-> n_answer", "n_aggregator -.-> n_clarify",
      'n_waste_rag -.->|"fallback"| n_web_search', 'n_general -.->|"fallback"| n_clarify',
    } do
      assert.matches(edge, m, 1, true)
    end
  end)
end)
