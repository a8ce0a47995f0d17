local aggregator = require "nodes.aggregator"
local clarify = require "nodes.clarify"

local function routing(...)
  local out = {}
  for i, n in ipairs({ ... }) do
    out[i] = { node = n, rule = i == 1 and "primary" or "multi_intent" }
  end
  return out
end

local function emitted()
  local events = {}
  return { emit = function(e) events[#events + 1] = e end }, events
end

describe("aggregator node", function()
  it("collects the contexts that arrived, in routing order, and logs them", function()
    local ctx, events = emitted()
    local up = aggregator.run({
      routing = { { node = "waste_rag", rule = "primary" }, { node = "collection_point", rule = "multi_intent" },
                  { node = "weather", rule = "enrichment:waste->weather" } },
      contexts = {
        weather = { ok = false, unavailable = true, text = "날씨 정보: 오프라인이라 날씨를 제공할 수 없습니다." },
        collection_point = { ok = true, sample = true, text = "수거함" },
        waste_rag = { ok = true, text = "종이류" },
      },
    }, ctx)
    assert.are.same({ "waste_rag", "collection_point", "weather" }, up.nodes_run)
    assert.are.same({ "waste_rag", "collection_point" }, up.aggregate.collected)
    assert.are.same({ "collection_point" }, up.aggregate.samples)
    assert.are.equal(1, #up.aggregate.missing)
    assert.are.equal("weather", up.aggregate.missing[1].node)
    assert.are.equal("unavailable", up.aggregate.missing[1].status)
    assert.are.equal("answer", up.aggregate.next)
    assert.is_nil(up.contexts)
    assert.are.equal("log", events[1].type)
    assert.matches("arrived: waste_rag, collection_point; missing: weather %(unavailable%)", events[1].text)
  end)

  -- records as the engine gives them in ctx.previous_tasks (engine/task.lua)
  -- (a branch node runs as a Send task; {edge = true}: an edge-triggered one)
  local function rec(node, extra)
    local r = { node = node, ran = node, send = 1, status = "ok", attempts = 1, duration = 0.001 }
    for k, v in pairs(extra or {}) do r[k] = v end
    if r.edge then r.send, r.edge = nil, nil end
    return r
  end

  it("writes an error entry for each node that failed under fail_open", function()
    local up = aggregator.run({
      routing = routing("location", "collection_point"),
      contexts = { location = { ok = true, text = "장소" } },
    }, { previous_tasks = { rec("intent", { edge = true }), rec("location"),
      rec("collection_point", { status = "failed", error = "collection_point: HTTP 500: boom\nstack traceback:\n..." }) } })
    assert.are.same({ ok = false, error = "collection_point: HTTP 500: boom" }, up.contexts.collection_point)
    assert.are.same({ "location", "collection_point" }, up.nodes_run)
    assert.are.equal("failed", up.aggregate.missing[1].status)
    assert.are.equal("answer", up.aggregate.next)
  end)

  it("places a fallback right after the node it stood in for, with both errors", function()
    local up = aggregator.run({
      routing = { { node = "waste_rag", rule = "primary" }, { node = "weather", rule = "enrichment:waste->weather" } },
      contexts = { web_search = { ok = true, text = "검색 결과" },
                   weather = { ok = false, unavailable = true, text = "x: y" } },
    }, { previous_tasks = {
      rec("waste_rag", { ran = "web_search",
        chain = { { node = "waste_rag", error = "waste_rag: no disposal rule matches \"뷁\"", attempts = 1 } } }),
      rec("weather") } })
    assert.are.same({ "waste_rag", "web_search", "weather" }, up.nodes_run)
    assert.are.equal("web_search", up.contexts.waste_rag.fallback)
    assert.matches("no disposal rule", up.contexts.waste_rag.error)
    assert.are.equal("answer", up.aggregate.next)   -- the fallback answered
  end)

  it("knows the start of a chain whose last step failed under fail_open", function()
    local rep = aggregator.report({ routing = routing("waste_rag"), contexts = {} }, {
      rec("waste_rag", { ran = "web_search", status = "failed", error = "web_search: HTTP 500: x",
        chain = { { node = "waste_rag", error = "waste_rag: no disposal rule matches", attempts = 1 } } }) })
    assert.are.same({ "waste_rag", "web_search" }, rep.order)
    assert.are.equal("failed", rep.status.waste_rag)
    assert.are.equal("failed", rep.status.web_search)
    assert.are.equal("web_search", rep.failures.waste_rag.fallback)
    assert.are.equal("waste_rag", rep.failures.web_search.fallback_of)
  end)

  describe("the fallback chain after the node policies", function()
    local failed_rag = {
      routing = routing("waste_rag"),
      contexts = { web_search = { ok = false, unavailable = true, text = "웹 검색: 오프라인" } },
    }
    local rag_records = {
      rec("waste_rag", { ran = "web_search",
        chain = { { node = "waste_rag", error = "waste_rag: no disposal rule matches", attempts = 1 } } }),
    }

    it("goes on with general when RAG and web search gave nothing", function()
      assert.are.equal("general", (aggregator.next_step(aggregator.report(failed_rag, rag_records))))
    end)

    it("stops once the chain has run, and counts general giving way to clarify as the chain", function()
      local s = {}
      for k, v in pairs(failed_rag) do s[k] = v end
      s.contexts = { web_search = failed_rag.contexts.web_search, clarify = { ok = true, text = "다시" } }
      local records = { rag_records[1], rec("aggregator", { edge = true }),
        rec("general", { ran = "clarify", chain = { { node = "general",
          error = "general: no LLM configured to answer in place of waste_rag", attempts = 1 } } }) }
      local rep = aggregator.report(s, records)
      assert.is_true(rep.chained)
      assert.are.equal("answer", (aggregator.next_step(rep)))
      assert.are.same({ "waste_rag", "web_search", "general", "clarify" }, rep.order)
      local up = aggregator.run(s, { previous_tasks = records })
      local missing = {}
      for _, m in ipairs(up.aggregate.missing) do missing[#missing + 1] = m.node end
      assert.are.same({ "waste_rag", "web_search" }, missing)
    end)

    it("answers when the primary only lacks services that are not configured", function()
      local rep = aggregator.report({
        routing = routing("web_search"),
        contexts = { web_search = { ok = false, unavailable = true, text = "웹 검색: 오프라인" } },
      }, { rec("web_search") })
      assert.are.equal("answer", (aggregator.next_step(rep)))
    end)

    it("reads the engine's records from ctx.previous_tasks", function()
      local up = aggregator.run(failed_rag, { previous_tasks = rag_records })
      assert.are.equal("general", up.aggregate.next)
      assert.are.equal("waste_rag", up.aggregate.primary)
    end)
  end)

  it("sees what the engine recorded in a real run: a fallback and a fail_open failure", function()
    local mg = require "moongraph"
    local g = mg.graph { contexts = mg.reducers.merge }
    g:add_node("route", function() return { routing = routing("a", "c") } end)
    g:add_node("a", function() error("a: nothing found", 0) end, { policy = { fallback = "b" } })
    g:add_node("b", function() return { contexts = { b = { ok = true, text = "B" } } } end)
    g:add_node("c", function() error("c: HTTP 500", 0) end, { policy = "fail_open" })
    g:add_node("aggregator", aggregator.run)
    g:add_edge(mg.START, "route")
    g:add_conditional_edges("route", function() return { mg.Send("a", {}), mg.Send("c", {}) } end)
    g:add_edge("a", "aggregator")
    g:add_edge("c", "aggregator")
    local state = assert(g:compile():invoke({}))
    assert.are.same({ "a", "b", "c" }, state.nodes_run)
    assert.are.same({ ok = false, error = "a: nothing found", fallback = "b" }, state.contexts.a)
    assert.are.same({ ok = false, error = "c: HTTP 500" }, state.contexts.c)
    assert.are.same({ "b" }, state.aggregate.collected)
  end)
end)

describe("clarify node", function()
  it("asks the user to rephrase and says why", function()
    local c = clarify.run({ chain_failures = {
      { node = "waste_rag", error = "waste_rag: no disposal rule matches \"뷁\"" } } }, {}).contexts.clarify
    assert.is_true(c.ok)
    assert.matches("다시 말씀해 주시겠어요", c.text)
    assert.matches("분리배출 규정에서 질문에 맞는 품목을 찾지 못했습니다", c.text)
    assert.not_matches("잠시 후 다시 시도", c.text)
  end)

  it("suggests trying later when a service failed, including earlier steps of its own task", function()
    local ctx = { failures = { { node = "general", error = "general: LLM call failed: HTTP 500" } } }
    local c = clarify.run({ message = "x" }, ctx).contexts.clarify
    assert.matches("대화용 LLM 호출에 실패했습니다", c.text)
    assert.matches("잠시 후 다시 시도", c.text)
  end)

  it("does not count general giving way for want of an LLM as a failure", function()
    local ctx = { failures = { { node = "general", error = "general: no LLM configured to answer in place of waste_rag" } } }
    local c = clarify.run({ chain_failures = {
      { node = "waste_rag", error = "waste_rag: no disposal rule matches \"뷁\"" } } }, ctx).contexts.clarify
    assert.not_matches("LLM", c.text)
    assert.not_matches("잠시 후 다시 시도", c.text)
  end)

  it("never fails, even without input", function()
    assert.is_true(clarify.run({}, nil).contexts.clarify.ok)
  end)
end)
