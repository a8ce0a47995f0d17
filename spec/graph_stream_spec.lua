local mg = require "moongraph"
local G = require "moongraph.graph"
local json = require "moongraph.json"
local tmp = require "tmp"
local START = G.START
local R = G.reducers

local function run(fn) return mg.run(fn) end

local function collect(app, input, cfg)
  local events = {}
  for ev in app:stream(input, cfg) do events[#events + 1] = ev end
  return events
end

local function of_mode(events, mode)
  local out = {}
  for _, ev in ipairs(events) do if ev.mode == mode then out[#out + 1] = ev end end
  return out
end

local function two_writers()
  local g = G.new { answer = R.append }
  g:add_node("fan", function() end)
  for _, name in ipairs { "left", "right" } do
    g:add_node(name, function(_, ctx)
      for i = 1, 3 do
        ctx.stream_token(name .. i)
        mg.sleep(0)    -- let the other branch stream too
      end
      ctx.emit { progress = name }
      return { answer = name }
    end)
  end
  g:add_edge(START, "fan"):add_edge("fan", "left"):add_edge("fan", "right")
  return g:compile()
end

describe("streaming", function()
  it("values: the state after the input and after every step", function()
    local g = G.new()
    g:add_node("a", function() return { n = 1 } end)
    g:add_node("b", function(s) return { n = s.n + 1 } end)
    g:add_edge(START, "a"):add_edge("a", "b")
    local events = run(function() return collect(g:compile(), { n = 0 }, { modes = "values" }) end)
    assert.equal(3, #events)
    assert.same({ 0, 1, 2 }, { events[1].data.n, events[2].data.n, events[3].data.n })
    for _, ev in ipairs(events) do assert.equal("values", ev.mode) end
  end)

  it("updates: one event per finished task with its node, task id and update", function()
    local events = run(function() return collect(two_writers(), {}, { modes = { "updates" } }) end)
    local by = {}
    for _, ev in ipairs(events) do by[ev.node] = ev end
    assert.same({ answer = "left" }, by.left.data)
    assert.same({ answer = "right" }, by.right.data)
    assert.matches(":left$", by.left.task_id)
    assert.equal("", by.left.ns)
  end)

  it("messages: tokens from parallel branches, each attributed to its task", function()
    local events = run(function() return collect(two_writers(), {}, { modes = { "messages" } }) end)
    assert.equal(6, #events)
    local order = {}
    for _, ev in ipairs(events) do
      order[#order + 1] = ev.data
      assert.equal(ev.node, ev.data:match("^(%a+)"))
      assert.matches(":" .. ev.node .. "$", ev.task_id)
    end
    -- interleaved: the branches really streamed at the same time
    assert.same({ "left1", "right1", "left2", "right2", "left3", "right3" }, order)
  end)

  it("custom: ctx.emit values", function()
    local events = run(function() return collect(two_writers(), {}, { modes = "custom" }) end)
    assert.equal(2, #events)
    local got = {}
    for _, ev in ipairs(events) do got[ev.data.progress] = ev.node end
    assert.same({ left = "left", right = "right" }, got)
  end)

  it("tasks: a start and a result event per task", function()
    local events = run(function() return collect(two_writers(), {}, { modes = "tasks" }) end)
    assert.equal(6, #events)
    local starts, results = 0, 0
    for _, ev in ipairs(events) do
      if ev.data.event == "start" then starts = starts + 1 end
      if ev.data.event == "result" then
        results = results + 1
        assert.equal("done", ev.data.status)
      end
    end
    assert.same({ 3, 3 }, { starts, results })
  end)

  it("debug: checkpoints and tasks", function()
    local g = G.new()
    g:add_node("a", function() return { x = 1 } end)
    g:add_edge(START, "a")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    local events = run(function() return collect(app, {}, { thread_id = "d", modes = "debug" }) end)
    local types = {}
    for _, ev in ipairs(events) do types[#types + 1] = ev.data.type end
    assert.same({ "checkpoint", "task", "task_result", "checkpoint" }, types)
    assert.equal(1, events[4].data.values.x)
  end)

  it("the default modes are values, updates, messages and custom", function()
    local events = run(function() return collect(two_writers(), {}) end)
    local modes = {}
    for _, ev in ipairs(events) do modes[ev.mode] = true end
    assert.same({ values = true, updates = true, messages = true, custom = true }, modes)
  end)

  it("a failed run raises from the iterator after the events before the failure", function()
    local g = G.new()
    g:add_node("ok", function() return { x = 1 } end)
    g:add_node("bad", function() error("exploded") end)
    g:add_edge(START, "ok"):add_edge("ok", "bad")
    local app = g:compile()
    local seen = {}
    local ok, err = run(function()
      return pcall(function()
        for ev in app:stream({}, { modes = "updates" }) do seen[#seen + 1] = ev.node end
      end)
    end)
    assert.is_false(ok)
    assert.matches("node 'bad' failed: .*exploded", err)
    assert.same({ "ok" }, seen)
  end)

  it("leaving the loop early cancels the run", function()
    local reached, left = false, false
    local g = G.new()
    g:add_node("a", function() return { x = 1 } end)
    g:add_node("b", function() mg.sleep(0.01); reached = true end)
    g:add_edge(START, "a"):add_edge("a", "b")
    local app = g:compile()
    run(function()
      for ev in app:stream({}, { modes = "updates" }) do
        if ev.node == "a" then left = true; break end
      end
      mg.sleep(0.03)
    end)
    assert.is_true(left)
    assert.is_false(reached)
  end)

  it("leaving the loop early also cancels the tasks of a parallel step", function()
    local finished, left = {}, false
    local g = G.new()
    g:add_node("fan", function(_, ctx) ctx.emit "fanned out" end)
    g:add_node("p1", function() mg.sleep(0.01); finished.p1 = true end)
    g:add_node("p2", function() mg.sleep(0.01); finished.p2 = true end)
    g:add_edge(START, "fan"):add_edge("fan", "p1"):add_edge("fan", "p2")
    local app = g:compile()
    run(function()
      for ev in app:stream({}, { modes = { "tasks" } }) do
        if ev.node == "p2" and ev.data.event == "start" then left = true; break end
      end
      mg.sleep(0.03)
    end)
    assert.is_true(left)
    assert.same({}, finished)
  end)

  it("rejects unknown modes and streaming outside a task", function()
    local app = two_writers()
    assert.has_error(function() app:stream({}, { modes = { "everything" } }) end,
      "bad argument #2 to 'stream': unknown mode 'everything' (expected values, updates, messages, custom, tasks, debug, checkpoints)")
    assert.has_error(function() app:stream({}) end,
      "app:stream must be called inside a moongraph task (mg.run, mg.spawn or the CLI)")
  end)

  it("invoke with on_event: the events stream gives, handed over as they happen, and the output", function()
    local cfg = { modes = { "values", "updates", "messages", "tasks" } }
    local streamed = run(function() return collect(two_writers(), {}, cfg) end)
    local got = {}
    local out = run(function()
      cfg.on_event = function(ev) got[#got + 1] = ev end
      return two_writers():invoke({}, cfg)
    end)
    local function shape(list)
      local s = {}
      for i, ev in ipairs(list) do s[i] = ev.mode .. " " .. tostring(ev.node) .. " " .. tostring(ev.task_id) end
      table.sort(s)
      return s
    end
    assert.same(shape(streamed), shape(got))
    assert.same({ answer = { "left", "right" } }, out)
    -- an interrupt: the output carries it (the values events do not)
    local g = G.new()
    g:add_node("ask", function(_, ctx) return { v = ctx.interrupt("which?") } end)
    g:add_edge(START, "ask")
    local paused = run(function()
      return g:compile { checkpointer = G.checkpoint.memory() }:invoke({},
        { thread_id = "t", modes = "values", on_event = function() end })
    end)
    assert.equal("which?", paused.__interrupt__[1].value)
    local app = two_writers()
    assert.has_error(function() app:invoke({}, { on_event = 1 }) end,
      "bad argument #2 to 'invoke': on_event must be a function, got number")
  end)
end)

describe("tracing", function()
  it("cfg.trace writes a Chrome trace with one span per task; parallel tasks overlap on separate lanes", function()
    local path = tmp.path("trace.json")
    local g = G.new()
    g:add_node("fan", function() end)
    g:add_node("p1", function() mg.sleep(0.005) end)
    g:add_node("p2", function() mg.sleep(0.005) end)
    g:add_edge(START, "fan"):add_edge("fan", "p1"):add_edge("fan", "p2")
    run(function() return g:compile():invoke({}, { trace = path }) end)
    local f = assert(io.open(path))
    local doc = assert(json.decode(f:read("a")))
    f:close()
    local spans = {}
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == "X" and e.cat == "task" then spans[e.name] = e end
    end
    assert.is_table(spans.fan)
    assert.is_table(spans.p1)
    assert.is_table(spans.p2)
    assert.is_number(spans.p1.tid)
    assert.is_number(spans.p2.tid)
    assert.are_not.equal(spans.p1.tid, spans.p2.tid)
    -- the two spans overlap in time
    assert.is_true(spans.p1.ts < spans.p2.ts + spans.p2.dur and spans.p2.ts < spans.p1.ts + spans.p1.dur)
    assert.equal("done", spans.p1.args.status)
  end)
end)
