local mg = require "moongraph"
local G = require "moongraph.graph"
local START, END, Send, Command = G.START, G.END, G.Send, G.Command
local R = G.reducers

local function run(fn) return mg.run(fn) end

describe("graph execution", function()
  it("runs a linear graph and returns the final state", function()
    local g = G.new { items = R.append }
    for i = 1, 3 do
      g:add_node("n" .. i, function(s) return { count = s.count + 1, items = "n" .. i } end)
    end
    g:add_edge(START, "n1"):add_edge("n1", "n2"):add_edge("n2", "n3"):add_edge("n3", END)
    local out = run(function() return g:compile():invoke { count = 0 } end)
    assert.equal(3, out.count)
    assert.same({ "n1", "n2", "n3" }, out.items)
  end)

  it("invoke works outside a task too", function()
    local g = G.new()
    g:add_node("a", function() return { x = 1 } end)
    g:add_edge(START, "a")
    assert.equal(1, g:compile():invoke({}).x)
  end)

  it("runs the tasks of a step concurrently: I/O in one branch does not block another", function()
    local log = {}
    local g = G.new { log = R.append }
    g:add_node("fan", function() end)
    g:add_node("slow", function() mg.sleep(0.02); log[#log + 1] = "slow"; return { log = "slow" } end)
    g:add_node("fast", function() log[#log + 1] = "fast"; return { log = "fast" } end)
    g:add_edge(START, "fan"):add_edge("fan", "slow"):add_edge("fan", "fast")
    local out = run(function() return g:compile():invoke {} end)
    assert.same({ "fast", "slow" }, log)        -- finish order
    assert.same({ "fast", "slow" }, out.log)    -- write order: by node name
  end)

  it("applies writes by node name, independent of finish order", function()
    local g = G.new { order = R.append }
    g:add_node("fan", function() end)
    g:add_node("a", function() mg.sleep(0.03); return { order = "a" } end)
    g:add_node("b", function() mg.sleep(0.01); return { order = "b" } end)
    g:add_node("c", function() return { order = "c" } end)
    g:add_edge(START, "fan")
    for _, n in ipairs { "c", "a", "b" } do g:add_edge("fan", n) end
    local out = run(function() return g:compile():invoke {} end)
    assert.same({ "a", "b", "c" }, out.order)
  end)

  it("two writes to a `last` key in one step fail naming the key and both writers", function()
    local g = G.new()
    g:add_node("fan", function() end)
    g:add_node("left", function() return { answer = 1 } end)
    g:add_node("right", function() return { answer = 2 } end)
    g:add_edge(START, "fan"):add_edge("fan", "left"):add_edge("fan", "right")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("state key 'answer' was written by 'left' and 'right' in the same step", err)
  end)

  it("map-reduce: Send over N items into an append key, in send order", function()
    local g = G.new { results = R.append }
    g:add_node("plan", function() end)
    g:add_node("work", function(arg)
      mg.sleep(0.001 * (10 - arg.i))   -- later sends finish first
      return { results = arg.i * 10 }
    end)
    g:add_node("reduce", function(s) return { total = #s.results } end)
    g:add_edge(START, "plan")
    g:add_conditional_edges("plan", function(s)
      local sends = {}
      for i = 1, s.n do sends[i] = Send("work", { i = i }) end
      return sends
    end, { "work" })
    g:add_edge("work", "reduce")
    local out = run(function() return g:compile():invoke { n = 8 } end)
    assert.same({ 10, 20, 30, 40, 50, 60, 70, 80 }, out.results)
    assert.equal(8, out.total)
  end)

  it("a Send task's input is its argument, not the graph state", function()
    local seen = {}
    local g = G.new { seen = R.append }
    g:add_node("branch", function(arg, ctx)
      seen[#seen + 1] = arg
      return { seen = arg.index }
    end)
    g:add_conditional_edges(START, function(s)
      return { Send("branch", { index = 1, strategy = s.strategies[1] }),
        Send("branch", { index = 2, strategy = s.strategies[2] }) }
    end, { "branch" })
    local out = run(function() return g:compile():invoke { strategies = { "greedy", "careful" } } end)
    assert.same({ index = 1, strategy = "greedy" }, seen[1])
    assert.is_nil(seen[1].strategies)
    assert.same({ 1, 2 }, out.seen)
  end)

  it("a join edge waits for both branches even when one is slower", function()
    local runs = 0
    local g = G.new { parts = R.append }
    g:add_node("fan", function() end)
    g:add_node("quick", function() return { parts = "quick" } end)
    g:add_node("slow1", function() mg.sleep(0.01); return { parts = "slow1" } end)
    g:add_node("slow2", function() return { parts = "slow2" } end)
    g:add_node("join", function(s)
      runs = runs + 1
      return { seen = table.concat(s.parts, ",") }
    end)
    g:add_edge(START, "fan"):add_edge("fan", "quick"):add_edge("fan", "slow1")
    g:add_edge("slow1", "slow2")
    g:add_edge({ "quick", "slow2" }, "join")
    local out = run(function() return g:compile():invoke {} end)
    assert.equal(1, runs)
    assert.equal("quick,slow1,slow2", out.seen)
  end)

  it("a conditional edge returning a list runs both targets in the same step", function()
    local steps = {}
    local g = G.new()
    g:add_node("route", function() end)
    g:add_node("x", function(_, ctx) steps.x = ctx.step; return { x = true } end)
    g:add_node("y", function(_, ctx) steps.y = ctx.step; return { y = true } end)
    g:add_edge(START, "route")
    g:add_conditional_edges("route", function() return { "go_x", "go_y" } end,
      { go_x = "x", go_y = "y" })
    local out = run(function() return g:compile():invoke {} end)
    assert.is_true(out.x and out.y)
    assert.is_number(steps.x)
    assert.equal(steps.x, steps.y)
  end)

  it("routers see the state with their node's own writes applied", function()
    local g = G.new()
    g:add_node("decide", function() return { go = "b" } end)
    g:add_node("b", function() return { reached = "b" } end)
    g:add_node("c", function() return { reached = "c" } end)
    g:add_edge(START, "decide")
    g:add_conditional_edges("decide", function(s) return s.go end, { "b", "c" })
    assert.equal("b", run(function() return g:compile():invoke({}).reached end))
  end)

  it("a router returning an unknown node fails naming the router and the value", function()
    local g = G.new()
    g:add_node("a", function() end):add_node("b", function() end)
    g:add_edge(START, "a")
    g:add_conditional_edges("a", function() return "nowhere" end)
    g:add_edge("a", "b")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("router on 'a' returned 'nowhere', which is not a node", err)

    local g2 = G.new()
    g2:add_node("a", function() end):add_node("b", function() end)
    g2:add_edge(START, "a")
    g2:add_conditional_edges("a", function() return "maybe" end, { yes = "b" })
    out, err = run(function() return g2:compile():invoke {} end)
    assert.matches("router on 'a' returned 'maybe', which is not in its path_map %(yes%)", err)
  end)

  it("routing to END stops that path", function()
    local g = G.new()
    g:add_node("a", function(s) return { n = (s.n or 0) + 1 } end)
    g:add_edge(START, "a")
    g:add_conditional_edges("a", function(s) return s.n < 3 and "a" or END end, { "a", END })
    assert.equal(3, run(function() return g:compile():invoke({}).n end))
  end)

  it("a node's Command updates state and jumps", function()
    local g = G.new { trail = R.append }
    g:add_node("a", function() return Command { update = { trail = "a" }, to = "c" } end,
      { destinations = { "c" } })
    g:add_node("b", function() return { trail = "b" } end)
    g:add_node("c", function() return { trail = "c" } end)
    g:add_edge(START, "a"):add_edge("a", "b")
    local out = run(function() return g:compile():invoke {} end)
    -- the static edge a->b fires as well as the Command's jump to c
    assert.same({ "a", "b", "c" }, out.trail)
  end)

  it("a Command can send packets", function()
    local g = G.new { got = R.append }
    g:add_node("a", function() return Command { to = { Send("w", 1), Send("w", 2) } } end,
      { destinations = { "w" } })
    g:add_node("w", function(arg) return { got = arg } end)
    g:add_edge(START, "a")
    assert.same({ 1, 2 }, run(function() return g:compile():invoke({}).got end))
  end)

  it("a Command jumping to a missing node fails naming it", function()
    local g = G.new()
    g:add_node("a", function() return Command { to = "ghost" } end)
    g:add_edge(START, "a")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("node 'a' %(Command.to%) returned 'ghost', which is not a node", err)
  end)

  it("a node returning something else than a table fails clearly", function()
    local g = G.new()
    g:add_node("a", function() return 42 end)
    g:add_edge(START, "a")
    local _, err = run(function() return g:compile():invoke {} end)
    assert.matches("node 'a' returned a number", err)
  end)

  it("recursion limit stops a loop with a clear error", function()
    local g = G.new()
    g:add_node("spin", function(s) return { n = (s.n or 0) + 1 } end)
    g:add_edge(START, "spin"):add_edge("spin", "spin")
    local out, err = run(function() return g:compile { recursion_limit = 7 }:invoke {} end)
    assert.is_nil(out)
    assert.matches("recursion limit of 7 supersteps reached", err)
    assert.matches("next: spin", err)
    _, err = run(function() return g:compile():invoke({}, { recursion_limit = 3 }) end)
    assert.matches("recursion limit of 3", err)
  end)

  it("the default recursion limit is 25 supersteps", function()
    local g = G.new()
    g:add_node("spin", function(s) return { n = (s.n or 0) + 1 } end)
    g:add_edge(START, "spin")
    g:add_conditional_edges("spin", function(s) return s.n < s.stop and "spin" or END end, { "spin", END })
    local app = g:compile()
    assert.equal(25, run(function() return app:invoke({ stop = 25 }).n end))
    local _, err = run(function() return app:invoke { stop = 26 } end)
    assert.matches("recursion limit of 25", err)
  end)

  it("ctx carries config, node, task_id, step and attempt", function()
    local seen
    local g = G.new()
    g:add_node("a", function(_, ctx)
      seen = { node = ctx.node, task_id = ctx.task_id, user = ctx.config.user, step = ctx.step }
    end)
    g:add_edge(START, "a")
    run(function() return g:compile():invoke({}, { user = "u1" }) end)
    assert.equal("a", seen.node)
    assert.equal("u1", seen.user)
    assert.equal(seen.step .. ":a", seen.task_id)
  end)

  it("a deferred node runs only once nothing else is left", function()
    local order = {}
    local g = G.new { done = R.append }
    g:add_node("fan", function() end)
    g:add_node("short", function() order[#order + 1] = "short"; return { done = "short" } end)
    g:add_node("long1", function() order[#order + 1] = "long1"; return { done = "long1" } end)
    g:add_node("long2", function() order[#order + 1] = "long2"; return { done = "long2" } end)
    g:add_node("collect", function(s) order[#order + 1] = "collect"; return { n = #s.done } end,
      { defer = true })
    g:add_edge(START, "fan"):add_edge("fan", "short"):add_edge("fan", "long1")
    g:add_edge("long1", "long2"):add_edge("short", "collect"):add_edge("long2", "collect")
    local out = run(function() return g:compile():invoke {} end)
    assert.equal("collect", order[#order])
    assert.equal(3, out.n)
    local count = 0
    for _, v in ipairs(order) do if v == "collect" then count = count + 1 end end
    assert.equal(1, count)
  end)

  it("cache reuses a node's result for the same key within its ttl", function()
    local calls = 0
    local g = G.new()
    g:add_node("lookup", function(s) calls = calls + 1; return { answer = s.q .. "!" } end,
      { cache = { ttl = 60, key = function(s) return s.q end } })
    g:add_edge(START, "lookup")
    local app = g:compile()
    run(function()
      assert.equal("a!", app:invoke({ q = "a" }).answer)
      assert.equal("a!", app:invoke({ q = "a" }).answer)
      assert.equal("b!", app:invoke({ q = "b" }).answer)
    end)
    assert.equal(2, calls)
  end)

  it("cache entries expire after ttl; the default key is the input", function()
    local calls = 0
    local g = G.new()
    g:add_node("lookup", function() calls = calls + 1; return { v = calls } end,
      { cache = { ttl = 0.01 } })
    g:add_edge(START, "lookup")
    local app = g:compile()
    run(function()
      app:invoke { q = 1 }
      app:invoke { q = 1 }
      assert.equal(1, calls)
      mg.sleep(0.02)
      app:invoke { q = 1 }
      assert.equal(2, calls)
      app:invoke { q = 2 }
      assert.equal(3, calls)
    end)
  end)

  it("keys not in the schema use `last`; declared reducers apply to the input", function()
    local g = G.new { n = R.add }
    g:add_node("a", function() return { n = 5, free = "x" } end)
    g:add_edge(START, "a")
    local out = run(function() return g:compile():invoke { n = 1 } end)
    assert.equal(6, out.n)
    assert.equal("x", out.free)
  end)

  it("an entry router on START picks the first nodes", function()
    local g = G.new()
    g:add_node("sns", function() return { r = "sns" } end)
    g:add_node("general", function() return { r = "general" } end)
    g:add_conditional_edges(START, function(s) return s.q:find("instagram") and "sns" or "general" end,
      { "sns", "general" })
    local app = g:compile()
    assert.equal("sns", run(function() return app:invoke({ q = "instagram plan" }).r end))
    assert.equal("general", run(function() return app:invoke({ q = "anything" }).r end))
  end)

  it("a Command from the caller picks the first node and seeds the state", function()
    local g = G.new()
    g:add_node("a", function() return { via = "a" } end)
    g:add_node("b", function(s) return { via = "b", seen = s.seed } end)
    g:add_conditional_edges(START, function() return "a" end, { "a", "b" })
    g:add_node("c", function() end)
    g:add_edge("a", "c"):add_edge("b", "c")
    local app = g:compile()
    local out = run(function() return app:invoke(Command { update = { seed = 7 }, to = "b" }) end)
    assert.equal("b", out.via)
    assert.equal(7, out.seen)
  end)

  it("nodes may be callable tables", function()
    local node = setmetatable({ greeting = "hi" }, { __call = function(self) return { msg = self.greeting } end })
    local g = G.new()
    g:add_node("a", node)
    g:add_edge(START, "a")
    assert.equal("hi", run(function() return g:compile():invoke({}).msg end))
  end)

  it("rejects bad input and a missing thread_id", function()
    local g = G.new()
    g:add_node("a", function() end)
    g:add_edge(START, "a")
    local app = g:compile()
    assert.has_error(function() app:invoke("text") end,
      "bad argument #1 to 'invoke': input table, mg.Command or nil expected, got string")
    local app2 = g:compile { checkpointer = G.checkpoint.memory() }
    assert.has_error(function() app2:invoke {} end,
      "bad argument #2 to 'invoke': thread_id is required: the graph has a checkpointer")
  end)
end)
