local mg = require "moongraph"
local G = require "moongraph.graph"
local START, END, Command = G.START, G.END, G.Command
local R = G.reducers

local function run(fn) return mg.run(fn) end

-- an agent that records its call and answers
local function answer(calls, key, text)
  return function(state)
    calls[#calls + 1] = key
    return { answer = text or (key .. ": " .. tostring(state.question)) }
  end
end

local function failing(calls, key, msg)
  return function()
    calls[#calls + 1] = key
    error(msg or (key .. " is down"), 0)
  end
end

-- a router that records each call's error context and walks `order`
local function walking_router(seen, order)
  return function(_, _, error_ctx)
    seen[#seen + 1] = error_ctx or false
    return order[#seen]
  end
end

local function one_node_graph(node, opts)
  local g = G.new { question = "last", answer = "last", notes = R.append }
  g:add_node("agent", node)
  g:add_edge(START, "agent")
  return g:compile(opts)
end

describe("routed agents: failover rules", function()
  it("the first router call has no error context", function()
    local args
    local node = mg.routed_agent {
      name = "r",
      agents = { a = function() return { answer = "A" } end },
      router = function(...) args = table.pack(...); return "a" end,
    }
    local out = run(function() return node({ question = "q" }, {}) end)
    assert.same({ answer = "A" }, out)
    assert.equal(2, args.n)          -- (agents, ctx): no third argument at all
    assert.is_nil(args[3])
  end)

  it("an agent failing before any event makes the router choose again with failed_keys and last_error", function()
    local calls, seen = {}, {}
    local node = mg.routed_agent {
      name = "r",
      agents = { primary = failing(calls, "primary", "primary model unavailable"),
                 fallback = answer(calls, "fallback") },
      router = walking_router(seen, { "primary", "fallback" }),
    }
    local out = run(function() return node({ question = "hi" }, {}) end)
    assert.same({ answer = "fallback: hi" }, out)
    assert.same({ "primary", "fallback" }, calls)
    assert.equal(2, #seen)
    assert.is_false(seen[1])
    assert.same({ primary = true }, seen[2].failed_keys)
    assert.equal("primary model unavailable", seen[2].last_error)
  end)

  it("failed_keys accumulates over several failures", function()
    local calls, seen = {}, {}
    local node = mg.routed_agent {
      agents = { a = failing(calls, "a"), b = failing(calls, "b"), c = answer(calls, "c") },
      router = walking_router(seen, { "a", "b", "c" }),
    }
    local out = run(function() return node({ question = "x" }, {}) end)
    assert.equal("c: x", out.answer)
    assert.same({ a = true, b = true }, seen[3].failed_keys)
    assert.equal("b is down", seen[3].last_error)
  end)

  it("an agent failing after ctx.emit propagates its error without calling the router again", function()
    local calls, seen = {}, {}
    local node = mg.routed_agent {
      agents = {
        primary = function(_, ctx)
          calls[#calls + 1] = "primary"
          ctx.emit { progress = "half way" }
          error("broke after output", 0)
        end,
        fallback = answer(calls, "fallback"),
      },
      router = walking_router(seen, { "primary", "fallback" }),
    }
    local ok, err = run(function() return pcall(node, { question = "q" }, {}) end)
    assert.is_false(ok)
    assert.equal("broke after output", err)
    assert.same({ "primary" }, calls)
    assert.equal(1, #seen)
  end)

  it("an agent failing after streaming a token propagates its error", function()
    local seen = {}
    local node = mg.routed_agent {
      agents = {
        primary = function(_, ctx) ctx.stream_token "Hel"; error("stream cut", 0) end,
        fallback = function() return { answer = "never" } end,
      },
      router = walking_router(seen, { "primary", "fallback" }),
    }
    local ok, err = run(function() return pcall(node, {}, {}) end)
    assert.is_false(ok)
    assert.equal("stream cut", err)
    assert.equal(1, #seen)
  end)

  it("an emitted event still reaches the caller's ctx", function()
    local got = {}
    local node = mg.routed_agent {
      agents = { a = function(_, ctx) ctx.emit "e1"; ctx.stream_token "t1"; return {} end },
      router = function() return "a" end,
    }
    run(function()
      return node({}, { emit = function(v) got[#got + 1] = "emit:" .. v end,
                        stream_token = function(v) got[#got + 1] = "token:" .. v end })
    end)
    assert.same({ "emit:e1", "token:t1" }, got)
  end)

  it("a router returning a key that already failed propagates the last error", function()
    local calls, seen = {}, {}
    local node = mg.routed_agent {
      agents = { a = failing(calls, "a", "a failed"), b = answer(calls, "b") },
      router = walking_router(seen, { "a", "a" }),
    }
    local ok, err = run(function() return pcall(node, {}, {}) end)
    assert.is_false(ok)
    assert.equal("a failed", err)
    assert.same({ "a" }, calls)          -- not run twice
    assert.equal(2, #seen)
  end)

  it("a router returning nil after a failure stops routing and raises the last error", function()
    local calls, seen = {}, {}
    local node = mg.routed_agent {
      agents = { a = failing(calls, "a", "first"), b = failing(calls, "b", "second"), c = answer(calls, "c") },
      router = walking_router(seen, { "a", "b", nil }),
    }
    local ok, err = run(function() return pcall(node, {}, {}) end)
    assert.is_false(ok)
    assert.equal("second", err)
    assert.same({ "a", "b" }, calls)
    assert.equal(3, #seen)
  end)

  it("a router returning nil on the first call raises an error naming the routed agent", function()
    local node = mg.routed_agent { name = "desk", agents = { a = function() end },
      router = function() return nil end }
    local ok, err = run(function() return pcall(node, {}, {}) end)
    assert.is_false(ok)
    assert.equal("routed agent 'desk': the router selected no agent", err)
  end)

  it("a router returning an unknown key is an error that lists the agents", function()
    local node = mg.routed_agent { name = "desk", agents = { a = function() end, b = function() end },
      router = function() return "c" end }
    local ok, err = run(function() return pcall(node, {}, {}) end)
    assert.is_false(ok)
    assert.equal("routed agent 'desk': the router returned 'c', which is not one of its agents (a, b)", err)
  end)

  it("a callable table works as the router", function()
    local router = setmetatable({}, { __call = function() return "a" end })
    local node = mg.routed_agent { agents = { a = function() return { answer = "A" } end }, router = router }
    assert.same({ answer = "A" }, run(function() return node({}, {}) end))
  end)

  it("an agent that returns nil succeeds: the router is not called again", function()
    local seen = {}
    local node = mg.routed_agent { agents = { a = function() return nil end, b = answer({}, "b") },
      router = walking_router(seen, { "a", "b" }) }
    local out = run(function() return table.pack(node({}, {})) end)
    assert.equal(1, out.n)
    assert.is_nil(out[1])
    assert.equal(1, #seen)
  end)

  it("a router's own error propagates", function()
    local node = mg.routed_agent { agents = { a = function() end },
      router = function() error("classifier offline", 0) end }
    local ok, err = run(function() return pcall(node, {}, {}) end)
    assert.is_false(ok)
    assert.equal("classifier offline", err)
  end)
end)

describe("routed agents: compiled graphs as agents", function()
  local function sub(name, fn1, fn2)
    local b = G.new { question = "last", answer = "last", notes = R.append }
    b:add_node("first", fn1)
    b:add_edge(START, "first")
    if fn2 then
      b:add_node("second", fn2)
      b:add_edge("first", "second")
    end
    return b:compile { name = name }
  end

  it("a subgraph failing in its first node (nothing emitted) fails over", function()
    local seen = {}
    local broken = sub("broken", function() error("no model", 0) end)
    local good = sub("good", function(s) return { answer = "good: " .. s.question, notes = "g" } end)
    local node = mg.routed_agent { name = "r", agents = { broken, good },
      router = walking_router(seen, { "broken", "good" }) }
    local app = one_node_graph(node)
    local out = run(function() return app:invoke { question = "q" } end)
    assert.equal("good: q", out.answer)
    assert.same({ "g" }, out.notes)
    assert.same({ broken = true }, seen[2].failed_keys)
    assert.matches("no model", seen[2].last_error)
  end)

  it("a subgraph failing after one of its nodes finished (an update event) propagates", function()
    local seen = {}
    local half = sub("half", function() return { notes = "step 1" } end,
      function() error("step 2 failed", 0) end)
    local good = sub("good", function() return { answer = "good" } end)
    local node = mg.routed_agent { name = "r", agents = { half, good },
      router = walking_router(seen, { "half", "good" }) }
    local app = one_node_graph(node)
    local out, err = run(function() return app:invoke { question = "q" } end)
    assert.is_nil(out)
    assert.matches("step 2 failed", err)
    assert.equal(1, #seen)
  end)

  it("a subgraph emitting a custom event in a node that then fails propagates", function()
    local seen = {}
    local chatty = sub("chatty", function(_, ctx) ctx.emit "working"; error("then broke", 0) end)
    local good = sub("good", function() return { answer = "good" } end)
    local node = mg.routed_agent { agents = { chatty, good },
      router = walking_router(seen, { "chatty", "good" }) }
    local out, err = run(function() return one_node_graph(node):invoke {} end)
    assert.is_nil(out)
    assert.matches("then broke", err)
    assert.equal(1, #seen)
  end)

  it("a subgraph's events reach the outer stream", function()
    local inner = sub("inner", function(_, ctx) ctx.emit "inner custom"; ctx.stream_token "tok"
      return { answer = "done" } end)
    local node = mg.routed_agent { agents = { inner }, router = function() return "inner" end }
    local app = one_node_graph(node)
    local modes = {}
    local final
    run(function()
      for ev in app:stream({ question = "q" }, { modes = { "custom", "messages", "updates" } }) do
        modes[#modes + 1] = ev.mode .. ":" .. tostring(ev.node)
        if ev.mode == "updates" and ev.node == "agent" then final = ev.data end
      end
    end)
    assert.same({ answer = "done" }, final)
    local joined = table.concat(modes, " ")
    assert.matches("custom:first", joined)
    assert.matches("messages:first", joined)
  end)

  it("list entries may be {name = ..., run = fn}", function()
    local node = mg.routed_agent { agents = { { name = "plain", run = function() return { answer = "p" } end } },
      router = function(agents)
        assert.is_function(agents.plain)
        return "plain"
      end }
    assert.same({ answer = "p" }, run(function() return node({}, {}) end))
  end)

  it("a compiled agent called directly (outside a graph) runs as its own run", function()
    local seen = {}
    local broken = sub("broken", function() error("down", 0) end)
    local good = sub("good", function(s) return { answer = "ok " .. s.question } end)
    local node = mg.routed_agent { agents = { broken, good }, router = walking_router(seen, { "broken", "good" }) }
    local out = run(function() return node({ question = "q" }) end)
    assert.equal("ok q", out.answer)
    assert.equal(2, #seen)
  end)
end)

describe("routed agents: the router and the invocation", function()
  it("the router reads the state and the last user message from ctx, and may yield", function()
    local got
    local node = mg.routed_agent {
      agents = { simple = function() return { answer = "s" } end, complex = function() return { answer = "c" } end },
      router = function(agents, ctx)
        mg.sleep(0)
        got = { ctx.user_message, ctx.state.plan }
        local keys = {}
        for k in pairs(agents) do keys[#keys + 1] = k end
        table.sort(keys)
        got.keys = keys
        return #ctx.user_message > 20 and "complex" or "simple"
      end,
    }
    local out = run(function()
      return node({ plan = "p1", messages = { { role = "user", content = "short" },
        { role = "assistant", content = "reply" }, { role = "user", content = "a much longer question than before" } } }, {})
    end)
    assert.equal("c", out.answer)
    assert.same({ "a much longer question than before", "p1", keys = { "complex", "simple" } }, got)
  end)

  it("the agents view is read-only", function()
    local node = mg.routed_agent { agents = { a = function() end },
      router = function(agents) agents.b = function() end; return "a" end }
    local ok, err = run(function() return pcall(node, {}, {}) end)
    assert.is_false(ok)
    assert.matches("read%-only", err)
  end)

  it("an agent sees ctx.agent_key and the caller's ctx fields", function()
    local seen
    local node = mg.routed_agent { name = "desk", agents = { a = function(_, ctx)
      seen = { ctx.agent_key, ctx.routed_agent, ctx.node }
      return {} end }, router = function() return "a" end }
    run(function() return one_node_graph(node):invoke {} end)
    assert.same({ "a", "desk", "agent" }, seen)
  end)

  it("works as a graph node; the node error names the agent error after failover is exhausted", function()
    local calls = {}
    local node = mg.routed_agent { agents = { a = failing(calls, "a", "a down"), b = failing(calls, "b", "b down") },
      router = function(_, _, e)
        if not e then return "a" end
        if not e.failed_keys.b then return "b" end
      end }
    local out, err = run(function() return one_node_graph(node):invoke {} end)
    assert.is_nil(out)
    assert.equal("node 'agent' failed: b down", err:match("^[^\n]*"))
    assert.same({ "a", "b" }, calls)
  end)

  it("the same router is called afresh on each invocation (external config)", function()
    local config = { selected = "agent_a" }
    local node = mg.routed_agent { agents = {
        agent_a = function() return { answer = "I am Agent A" } end,
        agent_b = function() return { answer = "I am Agent B" } end },
      router = function() return config.selected end }
    local app = one_node_graph(node)
    local a = run(function() return app:invoke {} end)
    config.selected = "agent_b"
    local b = run(function() return app:invoke {} end)
    assert.equal("I am Agent A", a.answer)
    assert.equal("I am Agent B", b.answer)
  end)
end)

describe("routed agents: interrupts", function()
  it("an interrupt inside an agent is not a failure; resuming re-enters the same agent", function()
    local seen = {}
    local node = mg.routed_agent { agents = {
        ask = function(_, ctx) return { answer = "approved: " .. ctx.interrupt "approve?" } end,
        other = function() return { answer = "other" } end },
      router = walking_router(seen, { "ask", "ask" }) }
    local app = one_node_graph(node, { checkpointer = mg.checkpoint.memory() })
    local cfg = { thread_id = "t1" }
    local first = run(function() return app:invoke({}, cfg) end)
    assert.equal("approve?", first.__interrupt__[1].value)
    local second = run(function() return app:invoke(Command { resume = "yes" }, cfg) end)
    assert.equal("approved: yes", second.answer)
    assert.same({ false, false }, seen)    -- two fresh routings, no error context
  end)

  it("an interrupt inside a compiled agent resumes inside that subgraph", function()
    local b = G.new { answer = "last" }
    b:add_node("ask", function(_, ctx) return { answer = "picked " .. ctx.interrupt "which store?" } end)
    b:add_edge(START, "ask")
    local asker = b:compile { name = "asker" }
    local node = mg.routed_agent { agents = { asker }, router = function() return "asker" end }
    local app = one_node_graph(node, { checkpointer = mg.checkpoint.memory() })
    local cfg = { thread_id = "t2" }
    local first = run(function() return app:invoke({}, cfg) end)
    assert.equal("which store?", first.__interrupt__[1].value)
    local second = run(function() return app:invoke(Command { resume = "본죽 강남점" }, cfg) end)
    assert.equal("picked 본죽 강남점", second.answer)
  end)

  it("a compiled agent with two pending interrupts resumes with a map of their ids", function()
    local b = G.new { answers = R.append }
    b:add_node("store", function(_, ctx) return { answers = "store=" .. ctx.interrupt "which store?" } end)
    b:add_node("period", function(_, ctx) return { answers = "period=" .. ctx.interrupt "which period?" } end)
    b:add_edge(START, "store"):add_edge(START, "period")
    local asker = b:compile { name = "asker" }
    local node = mg.routed_agent { agents = { asker }, router = function() return "asker" end }
    local g = G.new { answers = R.append }
    g:add_node("agent", node)
    g:add_edge(START, "agent")
    local app = g:compile { checkpointer = mg.checkpoint.memory() }
    local cfg = { thread_id = "t4" }
    local first = run(function() return app:invoke({}, cfg) end)
    assert.equal(2, #first.__interrupt__)
    local map = {}
    for _, it in ipairs(first.__interrupt__) do
      assert.matches("^agent%.asker:", it.ns)
      map[it.id] = it.value == "which store?" and "gangnam" or "march"
    end
    local second = run(function() return app:invoke(Command { resume = map }, cfg) end)
    table.sort(second.answers)
    assert.same({ "period=march", "store=gangnam" }, second.answers)
  end)

  it("a failed compiled agent and its fallback keep separate checkpoint namespaces", function()
    local broken = G.new { answer = "last" }
    broken:add_node("x", function() error("down", 0) end)
    broken:add_edge(START, "x")
    local good = G.new { answer = "last" }
    good:add_node("y", function() return { answer = "from good" } end)
    good:add_edge(START, "y")
    local node = mg.routed_agent { agents = { broken:compile { name = "broken" }, good:compile { name = "good" } },
      router = function(_, _, e) return e and "good" or "broken" end }
    local app = one_node_graph(node, { checkpointer = mg.checkpoint.memory() })
    -- durability "sync": the failed agent's checkpoint is on record before the fallback starts
    local out, err = run(function() return app:invoke({}, { thread_id = "t3", durability = "sync" }) end)
    assert.is_nil(err)
    assert.equal("from good", out.answer)
  end)
end)

describe("routed agents: misuse", function()
  local function misuse(opts)
    local ok, err = pcall(mg.routed_agent, opts)
    assert.is_false(ok)
    return err
  end

  it("names the problem", function()
    assert.matches("router function expected", misuse { agents = { a = function() end } })
    assert.matches("agents is empty", misuse { agents = {}, router = print })
    assert.matches("agent 'a' must be a node function", misuse { agents = { a = 42 }, router = print })
    assert.matches("agent 1 of the list has no name", misuse { agents = { function() end }, router = print })
    assert.matches("two agents are named 'x'", misuse { agents = { { name = "x", run = print }, { name = "x", run = print } },
      router = print })
    assert.matches("unknown option 'route'", misuse { agents = { a = print }, route = print })
    assert.matches("^bad argument #1 to 'routed_agent'", misuse(nil))
  end)

  it("is reachable as mg.routed_agent", function()
    assert.equal(require("moongraph.routed_agent").routed_agent, mg.routed_agent)
  end)

  local _ = END
end)
