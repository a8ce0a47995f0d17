-- The engine reports what happened: every task's node, the node that ran,
-- its attempts, time, error and fallback chain, in the `tasks` stream mode
-- and to later nodes through ctx.previous_tasks; a fallback sees the
-- failures before it in ctx.failures; each task has a ctx of its own.
local mg = require "moongraph"

local function run(fn) return mg.run(fn) end

-- START -> flaky (retried once) -> fan (Sends to a, c) ; a falls back to b,
-- c fails under fail_open ; both -> report, which returns what it saw
local function build(report, saver)
  local tries = 0
  local g = mg.graph { seen = mg.reducers.append }
  g:add_node("flaky", function()
    tries = tries + 1
    if tries == 1 then error("flaky: first try fails", 0) end
    return {}
  end, { retry = { max_attempts = 2, initial_interval = 0, jitter = false } })
  g:add_node("fan", function() return {} end)
  g:add_node("a", function() error("a: nothing found", 0) end, { policy = { fallback = "b" } })
  g:add_node("b", function(_, ctx) return { seen = { ctx.failures } } end)
  g:add_node("c", function() error("c: HTTP 500", 0) end, { policy = "fail_open" })
  g:add_node("report", report)
  g:add_edge(mg.START, "flaky")
  g:add_edge("flaky", "fan")
  g:add_conditional_edges("fan", function() return { mg.Send("a", {}), mg.Send("c", {}) } end)
  g:add_edge("a", "report")
  g:add_edge("c", "report")
  return g:compile { checkpointer = saver }
end

describe("task records", function()
  it("reach later nodes through ctx.previous_tasks, oldest first", function()
    local got
    local app = build(function(_, ctx) got = ctx.previous_tasks; return {} end)
    local state = assert(app:invoke({}))
    assert.are.equal(4, #got)
    local flaky, fan, a, c = got[1], got[2], got[3], got[4]
    assert.are.same({ "flaky", "fan", "a", "c" }, { flaky.node, fan.node, a.node, c.node })
    assert.are.equal(2, flaky.attempts)
    assert.are.equal("ok", flaky.status)
    assert.are.equal(1, flaky.step)
    assert.are.equal("b", a.ran)
    assert.are.equal("ok", a.status)
    assert.are.equal(1, #a.chain)
    assert.are.equal("a", a.chain[1].node)
    assert.are.equal("a: nothing found", a.chain[1].error)
    assert.are.equal(1, a.send)
    assert.are.equal("failed", c.status)
    assert.are.equal("c: HTTP 500", c.error)
    for _, r in ipairs(got) do
      assert.is_number(r.duration)
      assert.is_true(r.duration >= 0)
    end
    -- the fallback saw the failure before it
    assert.are.same({ { node = "a", error = "a: nothing found", attempts = 1, duration = a.chain[1].duration } },
      state.seen[1])
  end)

  it("are copies: a node changing them changes nothing for the next one", function()
    local second
    local g = mg.graph()
    g:add_node("x", function() return {} end)
    g:add_node("y", function(_, ctx) ctx.previous_tasks[1].node = "changed"; return {} end)
    g:add_node("z", function(_, ctx) second = ctx.previous_tasks; return {} end)
    g:add_edge(mg.START, "x")
    g:add_edge("x", "y")
    g:add_edge("y", "z")
    assert(g:compile():invoke({}))
    assert.are.equal("x", second[1].node)
  end)

  it("are streamed in the tasks mode: attempts, time, chain, a fail_open failure", function()
    local results = {}
    run(function()
      local app = build(function() return {} end)
      for ev in app:stream({}, { stream_mode = "tasks" }) do
        if ev.data.event == "result" then results[ev.data.name] = ev.data end
      end
    end)
    assert.are.equal(2, results.flaky.attempts)
    assert.are.equal("b", results.a.ran)
    assert.are.equal("a", results.a.chain[1].node)
    assert.is_true(results.c.failed)
    assert.are.equal("c: HTTP 500", results.c.error)
    assert.is_number(results.report.duration)
  end)

  it("are read back from the checkpoints when a run resumes", function()
    local got
    local saver = mg.checkpoint.memory()
    local g = mg.graph()
    g:add_node("a", function() error("a: down", 0) end, { policy = { fallback = "b" } })
    g:add_node("b", function() return {} end)
    g:add_node("ask", function(_, ctx) return { answer = ctx.interrupt("ok?") } end)
    g:add_node("report", function(_, ctx) got = ctx.previous_tasks; return {} end)
    g:add_edge(mg.START, "a")
    g:add_edge("a", "ask")
    g:add_edge("ask", "report")
    local cfg = { thread_id = "records-resume" }
    run(function()
      local first = assert(g:compile { checkpointer = saver }:invoke({}, cfg))
      assert.is_table(first.__interrupt__)
      -- a new compiled graph, as another process would have
      assert(g:compile { checkpointer = saver }:invoke(mg.Command { resume = "yes" }, cfg))
    end)
    assert.are.same({ "a", "ask" }, { got[1].node, got[2].node })
    assert.are.equal("b", got[1].ran)
    assert.are.equal("a: down", got[1].chain[1].error)
    assert.are.equal("ok", got[2].status)
  end)
end)

describe("ctx", function()
  it("is a table of its own for each task, so what a node keeps speaks for that node", function()
    local kept, events = {}, {}
    local g = mg.graph()
    g:add_node("x", function(_, ctx) kept.x = ctx; ctx.mine = "x"; return {} end)
    g:add_node("y", function(_, ctx) kept.y = ctx; kept.y_saw = ctx.mine; return {} end)
    g:add_node("z", function() kept.x.emit("late"); return {} end)
    g:add_edge(mg.START, "x")
    g:add_edge("x", "y")
    g:add_edge("y", "z")
    run(function()
      for ev in g:compile():stream({}, { stream_mode = "custom" }) do events[#events + 1] = ev end
    end)
    assert.are_not.equal(kept.x, kept.y)
    assert.is_nil(kept.y_saw)
    assert.are.equal(1, #events)
    assert.are.equal("x", events[1].node)
    assert.are.equal("late", events[1].data)
  end)

  it("holds no engine internals a node could reach by name", function()
    -- the documented fields (engine/context.lua); anything else a node can
    -- name is an internal
    local PUBLIC = { node = true, task_id = true, step = true, ns = true, config = true, attempt = true,
      failures = true, previous_tasks = true, emit = true, stream_token = true, interrupt = true,
      run_subgraph = true }
    local keys, probed, public = {}, {}, nil
    local g = mg.graph()
    g:add_node("x", function(_, ctx)
      for k in pairs(ctx) do keys[#keys + 1] = k end
      for _, name in ipairs { "run", "task", "attempt_state", "sink", "records", "plan", "saver", "cfg",
                              "_run", "_task", "RUN", "TASK", "ATTEMPT" } do
        probed[name] = ctx[name]
      end
      public = { ctx.node, type(ctx.config), type(ctx.emit), ctx.step }
      return {}
    end)
    g:add_edge(mg.START, "x")
    assert(g:compile():invoke({}))
    assert.is_true(#keys > 0)
    for _, k in ipairs(keys) do
      if type(k) == "string" then assert.is_true(PUBLIC[k], "ctx has the field " .. k) end
    end
    assert.same({}, probed)
    assert.same({ "x", "table", "function", 1 }, public)   -- the public ones are there
  end)
end)
