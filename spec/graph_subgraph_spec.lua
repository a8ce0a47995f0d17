local mg = require "moongraph"
local G = require "moongraph.graph"
local tmp = require "tmp"
local START, END, Send, Command = G.START, G.END, G.Send, G.Command
local R = G.reducers

local function run(fn) return mg.run(fn) end

-- the GCRI shape: a branch subgraph per strategy, fanned out with Send
local function hypothesis_branch()
  local b = G.new { raw_hypotheses = R.append }
  b:add_node("hypothesis", function(s)
    mg.sleep(0.001 * (4 - s.index))       -- later branches finish first
    return { hypothesis = s.strategy .. " idea" }
  end)
  b:add_node("refine", function(s)
    return { raw_hypotheses = { { index = s.index, text = s.hypothesis .. " (refined)" } } }
  end)
  b:add_edge(START, "hypothesis"):add_edge("hypothesis", "refine"):add_edge("refine", END)
  return b:compile { name = "hypothesis_branch" }
end

local function gcri()
  local g = G.new { task = "last", strategies = "last", raw_hypotheses = R.append }
  g:add_node("sample_strategies", function() return { strategies = { "greedy", "careful", "wild" } } end)
  g:add_node("hypothesis_executor", hypothesis_branch())
  g:add_node("aggregate", function(s) return { count = #s.raw_hypotheses } end)
  g:add_edge(START, "sample_strategies")
  g:add_conditional_edges("sample_strategies", function(s)
    local sends = {}
    for i, strategy in ipairs(s.strategies) do
      sends[i] = Send("hypothesis_executor", { index = i, strategy = strategy, task = s.task })
    end
    return sends
  end, { "hypothesis_executor" })
  g:add_edge("hypothesis_executor", "aggregate")
  return g
end

describe("subgraphs", function()
  it("a compiled graph runs as a node; Send args are its input; declared keys flow back by reducer", function()
    local out = run(function() return gcri():compile():invoke { task = "sort a list" } end)
    assert.equal(3, out.count)
    assert.same({ 1, 2, 3 }, { out.raw_hypotheses[1].index, out.raw_hypotheses[2].index,
      out.raw_hypotheses[3].index })
    assert.equal("careful idea (refined)", out.raw_hypotheses[2].text)
    -- keys the parent does not declare stay inside the subgraph
    assert.is_nil(out.hypothesis)
  end)

  it("with the parent state as input, only what the subgraph changed is written back", function()
    local sub = G.new { notes = R.append, total = R.add }
    sub:add_node("work", function() return { notes = "sub", total = 5 } end)
    sub:add_edge(START, "work")
    local g = G.new { notes = R.append, total = R.add, title = "last" }
    g:add_node("first", function() return { notes = "first", total = 1 } end)
    g:add_node("sub", sub:compile())
    g:add_node("other", function() return { title = "set by other" } end)
    g:add_edge(START, "first"):add_edge("first", "sub"):add_edge("first", "other")
    local out = run(function() return g:compile():invoke { title = "t0" } end)
    assert.same({ "first", "sub" }, out.notes)      -- not {"first", "first", "sub"}
    assert.equal(6, out.total)                     -- 1 + 5, not 1 + 6
    assert.equal("set by other", out.title)        -- no conflict: the subgraph left it alone
  end)

  it("stream events from inside a subgraph carry its namespace", function()
    local app = gcri():compile()
    local events = {}
    run(function()
      for ev in app:stream({ task = "t" }, { modes = { "updates" } }) do events[#events + 1] = ev end
    end)
    local inner = {}
    for _, ev in ipairs(events) do
      if ev.node == "refine" then inner[#inner + 1] = ev end
    end
    assert.equal(3, #inner)
    local seen_ns = {}
    for _, ev in ipairs(inner) do
      assert.matches("^hypothesis_executor:%d+:hypothesis_executor#%d$", ev.ns)
      seen_ns[ev.ns] = true
    end
    local n = 0
    for _ in pairs(seen_ns) do n = n + 1 end
    assert.equal(3, n)
    local top = {}
    for _, ev in ipairs(events) do if ev.ns == "" then top[#top + 1] = ev.node end end
    assert.same({ "sample_strategies", "hypothesis_executor", "hypothesis_executor",
      "hypothesis_executor", "aggregate" }, top)
  end)

  it("a subgraph checkpoints under its own namespace", function()
    local saver = G.checkpoint.memory()
    local app = gcri():compile { checkpointer = saver }
    run(function()
      app:invoke({ task = "t" }, { thread_id = "g" })
      local namespaces = {}
      for ns in pairs(saver.threads.g) do namespaces[#namespaces + 1] = ns end
      table.sort(namespaces)
      assert.equal(4, #namespaces)
      assert.equal("", namespaces[1])
      local st = app:get_state { thread_id = "g", checkpoint_ns = namespaces[2] }
      assert.is_table(st.values.raw_hypotheses)
    end)
  end)

  it("a failing subgraph fails its node, under the parent node's policy", function()
    local sub = G.new()
    sub:add_node("inner", function() error("inner broke") end)
    sub:add_edge(START, "inner")
    local g = G.new()
    g:add_node("sub", sub:compile(), { policy = "fail_open" })
    g:add_node("after", function() return { reached = true } end)
    g:add_edge(START, "sub"):add_edge("sub", "after")
    local out = run(function() return g:compile():invoke {} end)
    assert.is_true(out.reached)
    assert.matches("node 'inner' failed: .*inner broke", out.errors[1].error)
  end)

  it("an interrupt inside a subgraph pauses the parent and resumes into the subgraph", function()
    local inner_runs = 0
    local sub = G.new()
    sub:add_node("prep", function() inner_runs = inner_runs + 1; return { prepared = true } end)
    sub:add_node("confirm", function(_, ctx) return { confirmed = ctx.interrupt "sure?" } end)
    sub:add_edge(START, "prep"):add_edge("prep", "confirm")
    local g = G.new { "confirmed" }
    g:add_node("sub", sub:compile())
    g:add_node("finish", function(s) return { result = "confirmed=" .. tostring(s.confirmed) } end)
    g:add_edge(START, "sub"):add_edge("sub", "finish")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      local cfg = { thread_id = "si" }
      local out = app:invoke({}, cfg)
      assert.equal("sure?", out.__interrupt__[1].value)
      assert.matches("^sub:", out.__interrupt__[1].ns)
      out = assert(app:invoke(Command { resume = "yes" }, cfg))
      assert.equal("confirmed=yes", out.result)
    end)
    assert.equal(1, inner_runs)   -- the subgraph resumed from its own checkpoint
  end)

  it("a plain fallback of a subgraph node gets its own resume value", function()
    local sub = G.new()
    sub:add_node("inner", function() error("inner down", 0) end)
    sub:add_edge(START, "inner")
    local g = G.new()
    g:add_node("primary", sub:compile(), { policy = { fallback = "ask" } })
    g:add_node("ask", function(_, ctx) return { answer = ctx.interrupt "manual answer?" } end)
    g:add_edge(START, "primary")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      local cfg = { thread_id = "fb" }
      local out = app:invoke({}, cfg)
      assert.equal("manual answer?", out.__interrupt__[1].value)
      out = assert(app:invoke(Command { resume = "42" }, cfg))
      assert.equal("42", out.answer)
    end)
  end)

  -- A retried subgraph node resumes from the subgraph's own last checkpoint
  -- (its finished inner nodes do not run again), whatever the durability.
  for _, durability in ipairs { "sync", "async", "exit" } do
    local function retried(second_node)
      local runs = { first = 0, second = 0 }
      local sub = G.new()
      sub:add_node("first", function() runs.first = runs.first + 1; return { a = 1 } end)
      sub:add_node("second", function(_, ctx)
        runs.second = runs.second + 1
        return second_node(runs.second, ctx)
      end)
      sub:add_edge(START, "first"):add_edge("first", "second")
      local g = G.new { "a", "b" }
      g:add_node("sub", sub:compile(), { timeout = 1.5,
        retry = { max_attempts = 2, initial_interval = 0, jitter = false } })
      g:add_edge(START, "sub")
      local dir = tmp.dir("saver")
      local app = g:compile { checkpointer = G.checkpoint.file(dir), durability = durability }
      local out, err = run(function() return app:invoke({}, { thread_id = "retry" }) end)
      return out, err, runs
    end

    it("a retried subgraph node resumes from its inner checkpoint (durability " .. durability .. ")", function()
      local out, err, runs = retried(function(n)
        if n == 1 then error("flaky") end
        return { b = 2 }
      end)
      assert.is_nil(err)
      assert.same({ a = 1, b = 2 }, { a = out.a, b = out.b })
      assert.same({ first = 1, second = 2 }, runs)
    end)

    it("a subgraph attempt cut by its timeout resumes from its inner checkpoint (durability " ..
        durability .. ")", function()
      local out, err, runs = retried(function(n)
        if n == 1 then mg.sleep(30) end
        return { b = 2 }
      end)
      assert.is_nil(err)
      assert.equal(2, out.b)
      assert.same({ first = 1, second = 2 }, runs)
    end)
  end

end)

describe("update_state in a subgraph's namespace", function()
  local function review_graph(runs)
    local sub = G.new { notes = R.append }
    sub:add_node("draft", function() runs.draft = (runs.draft or 0) + 1; return { notes = "drafted" } end)
    sub:add_node("review", function(_, ctx) return { verdict = ctx.interrupt "ok?" } end)
    sub:add_node("publish", function(s) return { published = table.concat(s.notes, "+") } end)
    sub:add_edge(START, "draft"):add_edge("draft", "review"):add_edge("review", "publish")
    local g = G.new { published = "last" }
    g:add_node("writer", sub:compile())
    g:add_edge(START, "writer")
    return g:compile { checkpointer = G.checkpoint.memory() }
  end

  it("writes through the subgraph's reducers and plans from the subgraph's nodes", function()
    local runs = {}
    local app = review_graph(runs)
    run(function()
      local cfg = { thread_id = "sub-update" }
      local out = app:invoke({}, cfg)
      local ns = out.__interrupt__[1].ns
      assert.matches("^writer:", ns)
      -- as if the subgraph's "review" node had written it: "publish" is next
      local new_cfg = assert(app:update_state({ thread_id = "sub-update", checkpoint_ns = ns },
        { notes = "edited", verdict = "yes" }, "review"))
      assert.equal(ns, new_cfg.checkpoint_ns)
      local st = app:get_state(new_cfg)
      assert.same({ "drafted", "edited" }, st.values.notes)   -- append: the subgraph's reducer
      assert.same({ "publish" }, st.next)
      out = assert(app:invoke(nil, cfg))
      assert.equal("drafted+edited", out.published)
    end)
    assert.equal(1, runs.draft)
  end)

  it("restarts a subgraph from its entry with mg.START", function()
    local runs = {}
    local app = review_graph(runs)
    run(function()
      local out = app:invoke({}, { thread_id = "sub-start" })
      local cfg = { thread_id = "sub-start", checkpoint_ns = out.__interrupt__[1].ns }
      assert(app:update_state(cfg, { notes = "again" }, START))
      assert.same({ "draft" }, app:get_state(cfg).next)
    end)
  end)

  it("names a namespace that is not a subgraph node's, and a node the subgraph lacks", function()
    local app = review_graph({})
    run(function()
      local out = app:invoke({}, { thread_id = "sub-bad" })
      local ns = out.__interrupt__[1].ns
      local ok, err = pcall(app.update_state, app, { thread_id = "sub-bad", checkpoint_ns = "nope:1:nope" }, {})
      assert.is_false(ok)
      assert.matches("checkpoint_ns 'nope:1:nope' is not the namespace of a subgraph node of this graph", err, 1, true)
      ok, err = pcall(app.update_state, app, { thread_id = "sub-bad", checkpoint_ns = ns }, {}, "writer")
      assert.is_false(ok)
      assert.matches("unknown node 'writer'", err, 1, true)
    end)
  end)
end)

describe("ctx.run_subgraph", function()
  local function inner_graph(runs)
    local sub = G.new { notes = R.append }
    sub:add_node("prep", function(s)
      runs.prep = (runs.prep or 0) + 1
      return { notes = "prep", topic = s.topic }
    end)
    sub:add_node("write", function(s, ctx)
      ctx.emit("writing " .. s.topic)
      return { notes = "write", draft = "about " .. s.topic }
    end)
    sub:add_edge(START, "prep"):add_edge("prep", "write")
    return sub:compile { name = "writer" }
  end

  it("returns the subgraph's final state and its changes to the caller's keys", function()
    local runs = {}
    local writer = inner_graph(runs)
    local g = G.new { notes = R.append, draft = "last", topic = "last" }
    g:add_node("node", function(s, ctx)
      local final, update = ctx.run_subgraph(writer, s)
      assert.same({ "first", "prep", "write" }, final.notes)
      assert.equal("about paper", final.draft)
      return update
    end)
    g:add_edge(START, "node")
    local out = run(function() return g:compile():invoke { topic = "paper", notes = { "first" } } end)
    assert.same({ "first", "prep", "write" }, out.notes)   -- only the subgraph's own items came back
    assert.equal("about paper", out.draft)
  end)

  it("tags stream events with the subgraph's namespace and shows every event to on_event", function()
    local writer = inner_graph({})
    local seen = {}
    local g = G.new { notes = R.append, draft = "last" }
    g:add_node("node", function(s, ctx)
      local _, update = ctx.run_subgraph(writer, s, { ns_suffix = "w1",
        on_event = function(ev) seen[#seen + 1] = ev.mode .. ":" .. tostring(ev.node) end })
      return update
    end)
    g:add_edge(START, "node")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    local events = {}
    run(function()
      for ev in app:stream({ topic = "glass" }, { thread_id = "ns", modes = { "custom" } }) do
        events[#events + 1] = ev
      end
    end)
    assert.equal(1, #events)
    assert.equal("writing glass", events[1].data)
    assert.equal("write", events[1].node)
    assert.matches("^node%.w1:1:node@%x+$", events[1].ns)
    -- on_event saw the modes the caller's stream did not ask for as well
    assert.truthy(table.concat(seen, " "):find("updates:prep", 1, true))
    assert.truthy(table.concat(seen, " "):find("custom:write", 1, true))
    assert.truthy(table.concat(seen, " "):find("values:nil", 1, true))
    -- the subgraph checkpoints under that namespace
    local st = app:get_state { thread_id = "ns", checkpoint_ns = events[1].ns }
    assert.equal("about glass", st.values.draft)
  end)

  it("runs several subgraphs in one task under distinct ns_suffix values", function()
    local writer = inner_graph({})
    local g = G.new { drafts = R.append }
    g:add_node("node", function(_, ctx)
      local a = ctx.run_subgraph(writer, { topic = "a" }, { ns_suffix = "a" })
      local b = ctx.run_subgraph(writer, { topic = "b" }, { ns_suffix = "b" })
      return { drafts = { a.draft, b.draft } }
    end)
    g:add_edge(START, "node")
    local out = run(function()
      return g:compile { checkpointer = G.checkpoint.memory() }:invoke({}, { thread_id = "two" })
    end)
    assert.same({ "about a", "about b" }, out.drafts)
  end)

  it("refuses a second subgraph in a namespace the task already used", function()
    local writer = inner_graph({})
    local g = G.new()
    g:add_node("node", function(_, ctx)
      ctx.run_subgraph(writer, { topic = "a" })
      ctx.run_subgraph(writer, { topic = "b" })
    end)
    g:add_edge(START, "node")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("node 'node' ran two subgraphs in namespace 'node:1:node'; give each call its own ns_suffix", err,
      1, true)
  end)

  it("propagates an interrupt inside the subgraph; resuming the caller resumes the subgraph", function()
    local runs = {}
    local sub = G.new()
    sub:add_node("prep", function() runs.prep = (runs.prep or 0) + 1; return { prepared = true } end)
    sub:add_node("confirm", function(_, ctx) return { confirmed = ctx.interrupt "sure?" } end)
    sub:add_edge(START, "prep"):add_edge("prep", "confirm")
    local asker = sub:compile()
    local g = G.new()
    g:add_node("node", function(_, ctx)
      local final = ctx.run_subgraph(asker, {}, { ns_suffix = "ask" })
      return { result = "confirmed=" .. tostring(final.confirmed) }
    end)
    g:add_edge(START, "node")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      local cfg = { thread_id = "int" }
      local out = app:invoke({}, cfg)
      assert.equal("sure?", out.__interrupt__[1].value)
      assert.matches("^node%.ask:", out.__interrupt__[1].ns)
      out = assert(app:invoke(Command { resume = "yes" }, cfg))
      assert.equal("confirmed=yes", out.result)
    end)
    assert.equal(1, runs.prep)
  end)

  it("routes a map of resume values to the node's own interrupt and to the subgraph's", function()
    local sub = G.new { answers = R.append }
    sub:add_node("q1", function(_, ctx) return { answers = "q1=" .. ctx.interrupt "first?" } end)
    sub:add_node("q2", function(_, ctx) return { answers = "q2=" .. ctx.interrupt "second?" } end)
    sub:add_edge(START, "q1"):add_edge(START, "q2")
    local asker = sub:compile()
    local g = G.new()
    g:add_node("node", function(_, ctx)
      local who = ctx.interrupt "who?"
      local final = ctx.run_subgraph(asker, {}, { ns_suffix = "qs" })
      return { result = who .. ": " .. table.concat(final.answers, ", ") }
    end)
    g:add_edge(START, "node")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      local cfg = { thread_id = "map" }
      local out = app:invoke({}, cfg)
      assert.equal("who?", out.__interrupt__[1].value)
      out = app:invoke(Command { resume = "kim" }, cfg)
      assert.equal(2, #out.__interrupt__)
      local map = {}
      for _, it in ipairs(out.__interrupt__) do map[it.id] = it.value == "first?" and "a" or "b" end
      out = assert(app:invoke(Command { resume = map }, cfg))
      assert.equal("kim: q1=a, q2=b", out.result)
    end)
  end)

  it("a retried node resumes the subgraph it ran from its inner checkpoint", function()
    local runs = { prep = 0, flaky = 0 }
    local sub = G.new()
    sub:add_node("prep", function() runs.prep = runs.prep + 1; return { a = 1 } end)
    sub:add_node("flaky", function()
      runs.flaky = runs.flaky + 1
      if runs.flaky == 1 then error("flaky") end
      return { b = 2 }
    end)
    sub:add_edge(START, "prep"):add_edge("prep", "flaky")
    local inner = sub:compile()
    local g = G.new()
    g:add_node("node", function(_, ctx)
      local final = ctx.run_subgraph(inner, {}, { ns_suffix = "x" })
      return { total = final.a + final.b }
    end, { retry = { max_attempts = 2, initial_interval = 0, jitter = false } })
    g:add_edge(START, "node")
    local dir = tmp.dir("saver")
    local app = g:compile { checkpointer = G.checkpoint.file(dir) }
    local out, err = run(function() return app:invoke({}, { thread_id = "r" }) end)
    assert.is_nil(err)
    assert.equal(3, out.total)
    assert.same({ prep = 1, flaky = 2 }, runs)
  end)

  it("names bad arguments", function()
    local writer = inner_graph({})
    local function misuse(...)
      local args = table.pack(...)
      local g = G.new()
      local msg
      g:add_node("node", function(_, ctx)
        local ok, e = pcall(ctx.run_subgraph, table.unpack(args, 1, args.n))
        assert.is_false(ok)
        msg = e
      end)
      g:add_edge(START, "node")
      run(function() return g:compile():invoke {} end)
      return msg
    end
    assert.matches("bad argument #1 to 'run_subgraph': compiled graph expected, got function",
      misuse(print, {}), 1, true)
    assert.matches("bad argument #2 to 'run_subgraph': table of state values expected, got nil",
      misuse(writer, nil), 1, true)
    assert.matches("unknown option 'ns' (expected ns_suffix, on_event)", misuse(writer, {}, { ns = "x" }), 1, true)
    assert.matches("ns_suffix must be a non-empty string without", misuse(writer, {}, { ns_suffix = "a:b" }), 1, true)
    assert.matches("on_event must be a function", misuse(writer, {}, { on_event = 1 }), 1, true)
  end)
end)
