local mg = require "moongraph"
local G = require "moongraph.graph"
local child = require "graph_child"
local tmp = require "tmp"
local START, Command = G.START, G.Command
local R = G.reducers

local function run(fn) return mg.run(fn) end

describe("interrupts", function()
  local function approval_graph(counter)
    local g = G.new()
    g:add_node("draft", function() return { plan = "delete 3 files" } end)
    g:add_node("approve", function(s, ctx)
      counter.approve = (counter.approve or 0) + 1
      local answer = ctx.interrupt { question = "run '" .. s.plan .. "'?" }
      return { approved = answer }
    end)
    g:add_node("act", function(s) return { done = s.approved == "yes" } end)
    g:add_edge(START, "draft"):add_edge("draft", "approve"):add_edge("approve", "act")
    return g:compile { checkpointer = G.checkpoint.memory() }
  end

  it("mg.interrupt works in a node that takes no ctx, also after a graph it invokes", function()
    local inner = G.new()
    inner:add_node("a", function(_, ctx) return { said = ctx.node } end)   -- a node with a ctx
    inner:add_node("b", function(s) return { said = s.said .. "+b" } end)  -- and one without
    inner:add_edge(START, "a"):add_edge("a", "b")
    local inner_app = inner:compile { checkpointer = G.checkpoint.memory() }
    local g = G.new()
    g:add_node("first", function()
      local a = mg.interrupt("first?")
      local out = inner_app:invoke({}, { thread_id = "inner" })
      return { a = a, b = mg.interrupt("second?"), inner = out.said }
    end)
    g:add_edge(START, "first")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      local out = app:invoke({}, { thread_id = "n" })
      assert.same({ "first?", "first" }, { out.__interrupt__[1].value, out.__interrupt__[1].node })
      out = app:invoke(Command { resume = 1 }, { thread_id = "n" })
      assert.same({ "second?", "first" }, { out.__interrupt__[1].value, out.__interrupt__[1].node })
      out = app:invoke(Command { resume = 2 }, { thread_id = "n" })
      assert.same({ a = 1, b = 2, inner = "a+b" }, out)
    end)
  end)

  it("ctx.interrupt pauses the run and returns the value under __interrupt__", function()
    local counter = {}
    local app = approval_graph(counter)
    run(function()
      local out = app:invoke({}, { thread_id = "a" })
      assert.equal("delete 3 files", out.plan)
      assert.equal(1, #out.__interrupt__)
      assert.same({ question = "run 'delete 3 files'?" }, out.__interrupt__[1].value)
      assert.equal("approve", out.__interrupt__[1].node)
      assert.is_string(out.__interrupt__[1].id)
      local st = app:get_state { thread_id = "a" }
      assert.same({ "approve" }, st.next)
      assert.equal(1, #st.interrupts)
      assert.equal(out.__interrupt__[1].id, st.interrupts[1].id)
    end)
  end)

  it("Command{resume} re-enters the node, where ctx.interrupt returns the value", function()
    local counter = {}
    local app = approval_graph(counter)
    run(function()
      app:invoke({}, { thread_id = "a" })
      local out = assert(app:invoke(Command { resume = "yes" }, { thread_id = "a" }))
      assert.equal("yes", out.approved)
      assert.is_true(out.done)
      assert.is_nil(out.__interrupt__)
    end)
    assert.equal(2, counter.approve)
  end)

  for _, durability in ipairs { "sync", "async", "exit" } do
    it("interrupt and resume work with durability " .. durability .. " and the file saver", function()
      local dir = child.tmpdir()
      local g = G.new()
      g:add_node("ask", function(_, ctx) return { answer = ctx.interrupt "?" } end)
      g:add_node("done", function(s) return { final = "got " .. s.answer } end)
      g:add_edge(START, "ask"):add_edge("ask", "done")
      local app = g:compile { checkpointer = G.checkpoint.file(dir), durability = durability }
      run(function()
        local cfg = { thread_id = "d" }
        assert.equal("?", app:invoke({}, cfg).__interrupt__[1].value)
        assert.equal("got 42", app:invoke(Command { resume = 42 }, cfg).final)
      end)
    end)
  end

  for _, durability in ipairs { "sync", "async", "exit" } do
    for _, kind in ipairs { "memory", "file" } do
      it("a node may ask several questions, one resume each (durability " .. durability .. ", " .. kind ..
          " saver)", function()
        local g = G.new()
        g:add_node("form", function(_, ctx)
          local name = ctx.interrupt "name?"
          local city = ctx.interrupt "city?"
          return { card = name .. "@" .. city }
        end)
        g:add_edge(START, "form")
        local saver = kind == "memory" and G.checkpoint.memory() or G.checkpoint.file(child.tmpdir())
        local app = g:compile { checkpointer = saver, durability = durability }
        run(function()
          local cfg = { thread_id = "f" }
          assert.equal("name?", app:invoke({}, cfg).__interrupt__[1].value)
          assert.equal("city?", app:invoke(Command { resume = "Ana" }, cfg).__interrupt__[1].value)
          -- the resumed run made no checkpoint: its writes to the one it
          -- resumed from are saved (the first answer, the new question)
          assert.equal("city?", app:get_state(cfg).tasks[1].interrupts[1].value)
          assert.equal("Ana@Seoul", app:invoke(Command { resume = "Seoul" }, cfg).card)
        end)
      end)
    end
  end

  it("siblings of an interrupted task keep their writes and do not run again", function()
    local runs = { other = 0 }
    local g = G.new { log = R.append }
    g:add_node("fan", function() end)
    g:add_node("ask", function(_, ctx) return { log = "ask:" .. ctx.interrupt "ok?" } end)
    g:add_node("other", function() runs.other = runs.other + 1; return { log = "other" } end)
    g:add_edge(START, "fan"):add_edge("fan", "ask"):add_edge("fan", "other")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      app:invoke({}, { thread_id = "s" })
      local out = assert(app:invoke(Command { resume = "fine" }, { thread_id = "s" }))
      assert.same({ "ask:fine", "other" }, out.log)
    end)
    assert.equal(1, runs.other)
  end)

  it("parallel interrupts are resumed with a table keyed by interrupt id", function()
    local g = G.new { answers = R.append }
    g:add_node("fan", function() end)
    g:add_node("left", function(_, ctx) return { answers = "L=" .. ctx.interrupt "left?" } end)
    g:add_node("right", function(_, ctx) return { answers = "R=" .. ctx.interrupt "right?" } end)
    g:add_edge(START, "fan"):add_edge("fan", "left"):add_edge("fan", "right")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      local cfg = { thread_id = "p" }
      local out = app:invoke({}, cfg)
      assert.equal(2, #out.__interrupt__)
      local ids = {}
      for _, it in ipairs(out.__interrupt__) do ids[it.value] = it.id end
      local bad, err = app:invoke(Command { resume = "x" }, cfg)
      assert.is_nil(bad)
      assert.matches("2 interrupts are pending %(.*%); resume with a table mapping each interrupt id", err)
      out = assert(app:invoke(Command { resume = { [ids["left?"]] = 1, [ids["right?"]] = 2 } }, cfg))
      assert.same({ "L=1", "R=2" }, out.answers)
    end)
  end)

  it("resuming a thread without a pending interrupt fails clearly", function()
    local g = G.new()
    g:add_node("a", function() end)
    g:add_edge(START, "a")
    local app = g:compile { checkpointer = G.checkpoint.memory() }
    run(function()
      app:invoke({}, { thread_id = "n" })
      local out, err = app:invoke(Command { resume = 1 }, { thread_id = "n" })
      assert.is_nil(out)
      assert.matches("nothing to resume: thread 'n' has no pending interrupt", err)
    end)
  end)

  it("ctx.interrupt without a checkpointer fails naming the node", function()
    local g = G.new()
    g:add_node("ask", function(_, ctx) ctx.interrupt "?" end)
    g:add_edge(START, "ask")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("ctx.interrupt in node 'ask' needs a checkpointer", err)
  end)

  it("interrupt_before and interrupt_after pause around a node; invoke(nil) goes on", function()
    local g = G.new { log = R.append }
    g:add_node("a", function() return { log = "a" } end)
    g:add_node("b", function() return { log = "b" } end)
    g:add_node("c", function() return { log = "c" } end)
    g:add_edge(START, "a"):add_edge("a", "b"):add_edge("b", "c")
    local app = g:compile { checkpointer = G.checkpoint.memory(),
      interrupt_before = { "b" }, interrupt_after = { "b" } }
    run(function()
      local cfg = { thread_id = "bp" }
      local out = app:invoke({}, cfg)
      assert.same({ "a" }, out.log)
      assert.same({ "b" }, out.__interrupt__[1].nodes)
      assert.equal("before", out.__interrupt__[1].when)
      out = app:invoke(nil, cfg)
      assert.same({ "a", "b" }, out.log)
      assert.equal("after", out.__interrupt__[1].when)
      out = app:invoke(nil, cfg)
      assert.same({ "a", "b", "c" }, out.log)
      assert.is_nil(out.__interrupt__)
    end)
  end)

  it("interrupt and resume across processes with the file saver", function()
    local script = child.script [=[
      local mg = require "moongraph"
      local G = require "moongraph.graph"
      local dir, countfile, mode, answer = arg[1], arg[2], arg[3], arg[4]
      local g = G.new()
      g:add_node("ask", function(_, ctx)
        local f = assert(io.open(countfile, "a")); f:write("ask\n"); f:close()
        local name = ctx.interrupt { question = "what is your name?" }
        return { greeting = "hello " .. name }
      end)
      g:add_edge(G.START, "ask")
      local app = g:compile { checkpointer = G.checkpoint.file(dir) }
      local cfg = { thread_id = "conversation-7" }
      if mode == "start" then
        local out = assert(app:invoke({}, cfg))
        print("ASKED " .. out.__interrupt__[1].value.question)
      else
        local out = assert(app:invoke(G.Command { resume = answer }, cfg))
        print("GOT " .. out.greeting)
      end
    ]=]
    local dir, counts = child.tmpdir(), tmp.path("counts")
    local out, kind, code = child.run(script, dir, counts, "start")
    assert.equal("ASKED what is your name?\n", out)
    assert.same({ "exit", 0 }, { kind, code })
    out, kind, code = child.run(script, dir, counts, "resume", "Mina")
    assert.equal("GOT hello Mina\n", out)
    assert.same({ "exit", 0 }, { kind, code })
    assert.same({ "ask", "ask" }, child.lines(counts))
  end)
end)
