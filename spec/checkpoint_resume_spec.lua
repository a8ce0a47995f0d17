local mg = require "moongraph"
local G = require "moongraph.graph"
local tmp = require "tmp"
local START, END, Command = G.START, G.END, G.Command
local R = G.reducers

local function run(fn) return mg.run(fn) end

local function linear(saver, opts)
  local g = G.new { items = R.append }
  for i = 1, 3 do
    g:add_node("n" .. i, function(s) return { count = (s.count or 0) + 1, items = "n" .. i } end)
  end
  g:add_edge(START, "n1"):add_edge("n1", "n2"):add_edge("n2", "n3"):add_edge("n3", END)
  opts = opts or {}
  opts.checkpointer = saver
  return g:compile(opts)
end

for _, kind in ipairs { "memory", "file" } do
  describe("checkpoints with the " .. kind .. " saver", function()
    local function saver()
      if kind == "memory" then return G.checkpoint.memory() end
      return G.checkpoint.file(tmp.dir("saver"))
    end

    it("adds the run's cfg.metadata to the metadata of every checkpoint it saves; the engine's keys win", function()
      local app = linear(saver())
      run(function()
        app:invoke({ count = 0 }, { thread_id = "md", metadata = { owner = "spec", step = "mine", n = 2 } })
        local list = app:history { thread_id = "md" }
        assert.equal(4, #list)
        for _, snap in ipairs(list) do
          assert.equal("spec", snap.metadata.owner)
          assert.equal(2, snap.metadata.n)
          assert.equal("integer", math.type(snap.metadata.n))
          assert.equal("integer", math.type(snap.metadata.step))
        end
        assert.equal("input", list[#list].metadata.source)
        -- a later run without it saves none of it
        app:invoke({ count = 0 }, { thread_id = "md" })
        assert.is_nil(app:get_state({ thread_id = "md" }).metadata.owner)
        assert.has_error(function() app:invoke({}, { thread_id = "md2", metadata = "x" }) end,
          "bad argument #2 to 'invoke': metadata must be a table")
      end)
    end)

    it("keeps each checkpoint as it was saved when nodes later change tables they returned or read", function()
      local g = G.new { items = R.append }
      local kept
      g:add_node("a", function() kept = { "a1" } return { list = kept, items = "a" } end)
      g:add_node("b", function(s)
        kept[2] = "changed by b"          -- a table node a returned
        s.items[#s.items + 1] = "sneaked"  -- the state b was given
        return { items = "b" }
      end)
      g:add_edge(START, "a"):add_edge("a", "b"):add_edge("b", END)
      local app = g:compile { checkpointer = saver() }
      run(function()
        local out = assert(app:invoke({ items = {} }, { thread_id = "t" }))
        out.items[1] = "changed by the caller"
        out.list[1] = "changed by the caller"
        local h = app:history { thread_id = "t" }
        assert.equal(3, #h)
        assert.same({ list = { "a1" }, items = { "a" } }, h[2].values)
        assert.same({}, h[3].values.items)
        assert.same({ "a", "sneaked", "b" }, h[1].values.items)
        if kind == "memory" then
          -- a saver called at once saves the state as it is at each step
          assert.same({ "a1", "changed by b" }, h[1].values.list)
        else
          -- the async writer: a change made in place and never returned is
          -- no write, and `list` keeps its copy from when it was written
          assert.same({ "a1" }, h[1].values.list)
        end
      end)
    end)

    -- build() -> app, invoked under each durability: its newest checkpoints
    -- hold want[1], want[2], want[3] (exit saves the last one only)
    local function newest_under_each_durability(build, want)
      for _, mode in ipairs { "sync", "async", "exit" } do
        local app = build():compile { checkpointer = saver(), durability = mode }
        run(function()
          assert(app:invoke({}, { thread_id = mode }))
          local h = app:history { thread_id = mode }
          assert.same(want[1], h[1].values, mode)
          if mode ~= "exit" then
            assert.same(want[2], h[2].values, mode)
            assert.same(want[3], h[3].values, mode)
          end
        end)
      end
    end

    it("saves a table a node changed in place and returned, under every durability", function()
      newest_under_each_durability(function()
        local g = G.new {}
        g:add_node("a", function() return { list = { "a1" }, n = 1 } end)
        g:add_node("b", function(s)
          s.list[#s.list + 1] = "b1"
          return { list = s.list }
        end)
        g:add_node("c", function(s) return { n = s.n + 1 } end)
        g:add_edge(START, "a"):add_edge("a", "b"):add_edge("b", "c"):add_edge("c", END)
        return g
      end, { { list = { "a1", "b1" }, n = 2 }, { list = { "a1", "b1" }, n = 1 }, { list = { "a1" }, n = 1 } })
    end)

    it("saves a parent's table a subgraph changed in place and gave back, under every durability", function()
      newest_under_each_durability(function()
        local sg = G.new { "list" }
        sg:add_node("inner", function(s)
          s.list[#s.list + 1] = "sub"
          return { list = s.list }
        end)
        sg:add_edge(START, "inner"):add_edge("inner", END)
        local g = G.new { "list", "n" }
        g:add_node("a", function() return { list = { "a1" } } end)
        g:add_node("s", sg:compile {})
        g:add_node("c", function() return { n = 1 } end)
        g:add_edge(START, "a"):add_edge("a", "s"):add_edge("s", "c"):add_edge("c", END)
        return g
      end, { { list = { "a1", "sub" }, n = 1 }, { list = { "a1", "sub" } }, { list = { "a1" } } })
    end)

    it("keeps each step's pending writes and metadata apart across the steps and runs of a thread", function()
      local cp = saver()
      local app = linear(cp, { durability = "async" })
      run(function()
        app:invoke({ count = 0 }, { thread_id = "pw" })
        app:invoke({ count = 10 }, { thread_id = "pw" })
        local h = app:history { thread_id = "pw" }
        assert.equal(8, #h)
        for i, snap in ipairs(h) do
          local tuple = cp:get(snap.config)
          local step = tuple.metadata.step
          -- newest first: the second run's 13, 12, 11, 10, then 3, 2, 1, 0
          assert.equal(i <= 4 and 14 - i or 8 - i, snap.values.count)
          if snap.next[1] then
            local node = snap.next[1]
            local got = {}
            for _, w in ipairs(tuple.pending_writes) do got[w[2]] = w[3] end
            assert.equal(step + 1 .. ":" .. node, tuple.pending_writes[1][1])
            assert.same({ count = snap.values.count + 1, items = node }, got)
          else
            assert.same({}, tuple.pending_writes)
          end
          assert.equal(i % 4 == 0 and "input" or "loop", tuple.metadata.source)
        end
      end)
    end)

    it("saves a checkpoint after every superstep", function()
      local app = linear(saver())
      run(function()
        local out = app:invoke({ count = 0 }, { thread_id = "t1" })
        assert.equal(3, out.count)
        local h = app:history { thread_id = "t1" }
        assert.equal(4, #h)   -- input + 3 steps
        assert.same({ "loop", "loop", "loop", "input" },
          { h[1].metadata.source, h[2].metadata.source, h[3].metadata.source, h[4].metadata.source })
        assert.same({ "n1" }, h[4].next)
        assert.same({ "n2" }, h[3].next)
        assert.same({}, h[1].next)
        assert.same({ "n1", "n2", "n3" }, h[1].values.items)
        assert.equal(h[2].config.checkpoint_id, h[1].parent_config.checkpoint_id)
        local st = app:get_state { thread_id = "t1" }
        assert.equal(3, st.values.count)
        assert.same({}, st.next)
      end)
    end)

    for _, durability in ipairs { "sync", "async", "exit" } do
      it("durability " .. durability .. " has the final checkpoint saved when invoke returns", function()
        local app = linear(saver(), { durability = durability })
        run(function()
          app:invoke({ count = 0 }, { thread_id = "d" })
          local st = app:get_state { thread_id = "d" }
          assert.equal(3, st.values.count)
          local h = app:history { thread_id = "d" }
          if durability == "exit" then
            assert.equal(1, #h)
          else
            assert.equal(4, #h)
          end
        end)
      end)
    end

    for _, durability in ipairs { "sync", "async" } do
      it("durability " .. durability .. ": a run cancelled with writes on their way, then a new run on " ..
         "the thread: it starts from what they saved, without a conflict", function()
        local g = G.new { items = R.append }
        g:add_node("quick", function() return { items = "quick" } end)
        g:add_node("stuck", function() mg.sleep(60) return { items = "stuck" } end)
        g:add_node("fresh", function() return { items = "fresh" } end)
        g:add_conditional_edges(START, function(s) return s.go end, { "quick", "fresh" })
        g:add_edge("quick", "stuck"):add_edge("stuck", END):add_edge("fresh", END)
        local app = g:compile { checkpointer = saver(), durability = durability }
        run(function()
          for round = 1, 20 do
            local thread = "c" .. round
            local seen = mg.queue()
            local t = mg.spawn(function()
              for ev in app:stream({ go = "quick" }, { thread_id = thread, stream_mode = "updates" }) do
                if ev.node == "quick" then seen:put(true) end
              end
            end)
            seen:get()
            t:cancel()
            -- what the cancelled run saved: under async, its queued step lands
            local before = app:get_state { thread_id = thread }
            local items = before.values.items or {}
            if durability == "async" then assert.same({ "quick" }, items, "round " .. round) end
            local out, err = app:invoke({ go = "fresh" }, { thread_id = thread })
            assert.is_nil(err)
            items[#items + 1] = "fresh"
            assert.same(items, out.items, "round " .. round)
            -- one chain: every checkpoint extends the one before it
            local h = app:history { thread_id = thread }
            for i = 1, #h - 1 do
              assert.equal(h[i + 1].config.checkpoint_id, h[i].parent_config.checkpoint_id)
            end
          end
        end)
      end)
    end

    it("a new input on a thread continues from its last state", function()
      local g = G.new { messages = R.messages }
      g:add_node("bot", function(s)
        return { messages = { role = "assistant", content = "seen " .. #s.messages } }
      end)
      g:add_edge(START, "bot")
      local app = g:compile { checkpointer = saver() }
      run(function()
        app:invoke({ messages = "hi" }, { thread_id = "chat" })
        local out = app:invoke({ messages = "again" }, { thread_id = "chat" })
        assert.equal(4, #out.messages)
        assert.equal("seen 3", out.messages[4].content)
        local other = app:invoke({ messages = "new" }, { thread_id = "other" })
        assert.equal(2, #other.messages)
      end)
    end)

    it("invoke(nil) on a finished thread returns its state; on an unknown thread it fails", function()
      local app = linear(saver())
      run(function()
        app:invoke({ count = 0 }, { thread_id = "t" })
        assert.equal(3, app:invoke(nil, { thread_id = "t" }).count)
        local out, err = app:invoke(nil, { thread_id = "ghost" })
        assert.is_nil(out)
        assert.matches("thread 'ghost' has no checkpoint", err)
      end)
    end)

    it("a failing branch under fail_close cancels its siblings and a resume re-runs only the unfinished tasks", function()
      local calls = { boom = 0, quick = 0, slow = 0, after = 0 }
      local broken = true
      local g = G.new { log = R.append }
      g:add_node("fan", function() end)
      g:add_node("boom", function()
        calls.boom = calls.boom + 1
        mg.sleep(0)   -- let the siblings start first
        if broken then error("upstream 500") end
        return { log = "boom" }
      end)
      g:add_node("quick", function() calls.quick = calls.quick + 1; return { log = "quick" } end)
      g:add_node("slow", function()
        calls.slow = calls.slow + 1
        if broken then mg.queue():get() end   -- waits until cancelled
        return { log = "slow" }
      end)
      g:add_node("after", function(s) calls.after = calls.after + 1; return { seen = table.concat(s.log, ",") } end)
      g:add_edge(START, "fan")
      for _, n in ipairs { "boom", "quick", "slow" } do
        g:add_edge("fan", n)
        g:add_edge(n, "after")
      end
      local app = g:compile { checkpointer = saver(), durability = "sync" }
      run(function()
        local out, err = app:invoke({}, { thread_id = "fc" })
        assert.is_nil(out)
        assert.matches("upstream 500", err)
        local st = app:get_state { thread_id = "fc" }
        assert.same({ "boom", "quick", "slow" }, st.next)
        local by = {}
        for _, t in ipairs(st.tasks) do by[t.name] = t end
        assert.matches("upstream 500", by.boom.error)
        assert.same({ log = "quick" }, by.quick.result)
        assert.is_nil(by.slow.result)
        broken = false
        out = assert(app:invoke(nil, { thread_id = "fc" }))
        assert.equal("boom,quick,slow", out.seen)
      end)
      assert.same({ boom = 2, quick = 1, slow = 2, after = 1 }, calls)
    end)

    it("a failed Send task is the only one re-run on resume", function()
      local runs = {}
      local bad = true
      local g = G.new { results = R.append }
      g:add_node("work", function(i)
        runs[i] = (runs[i] or 0) + 1
        if i == 3 and bad then error("item 3 failed") end
        return { results = i }
      end)
      g:add_conditional_edges(START, function()
        local s = {}
        for i = 1, 5 do s[i] = G.Send("work", i) end
        return s
      end, { "work" })
      local app = g:compile { checkpointer = saver() }
      run(function()
        local out, err = app:invoke({}, { thread_id = "sends" })
        assert.is_nil(out)
        assert.matches("item 3 failed", err)
        bad = false
        out = assert(app:invoke(nil, { thread_id = "sends" }))
        assert.same({ 1, 2, 3, 4, 5 }, out.results)
      end)
      assert.equal(2, runs[3])
      for _, i in ipairs { 1, 2, 4, 5 } do assert.equal(1, runs[i]) end
    end)

    it("resumes a Send task with its arg as it was sent, though the task changed it", function()
      local got, fail = {}, true
      local g = G.new { results = R.append }
      g:add_node("work", function(arg)
        got[#got + 1] = table.concat(arg.items, ",")
        arg.items[#arg.items + 1] = "changed"
        if fail then error("work failed") end
        return { results = #arg.items }
      end)
      g:add_conditional_edges(START, function() return { G.Send("work", { items = { "x" } }) } end, { "work" })
      local app = g:compile { checkpointer = saver() }
      run(function()
        assert.is_nil(app:invoke({}, { thread_id = "arg", durability = "async" }))
        fail = false
        assert.same({ 2 }, assert(app:invoke(nil, { thread_id = "arg", durability = "async" })).results)
      end)
      assert.same({ "x", "x" }, got)
    end)

    it("each finished task's writes are saved while its siblings still run", function()
      local s = saver()
      local seen_pending
      local g = G.new()
      g:add_node("fan", function() end)
      g:add_node("first", function() return { first = true } end)
      g:add_node("second", function(_, ctx)
        -- wait (by condition, not by time) until first's writes are stored
        for _ = 1, 1000 do
          local tup = s:get { thread_id = ctx.config.thread_id }
          for _, w in ipairs(tup and tup.pending_writes or {}) do
            if w[1]:match(":first$") then seen_pending = w; return { second = true } end
          end
          mg.sleep(0.001)
        end
        error("first's writes never reached the saver")
      end)
      g:add_edge(START, "fan"):add_edge("fan", "first"):add_edge("fan", "second")
      local app = g:compile { checkpointer = s }
      run(function() assert(app:invoke({}, { thread_id = "pw" })) end)
      assert.same("first", seen_pending[2])
    end)

    it("update_state writes as a node and the run goes on from that node's edges", function()
      local g = G.new { log = R.append }
      g:add_node("draft", function() return { log = "draft", text = "v1" } end)
      g:add_node("review", function(st) return { log = "review", reviewed = st.text } end)
      g:add_edge(START, "draft"):add_edge("draft", "review")
      local app = g:compile { checkpointer = saver(), interrupt_before = { "review" } }
      run(function()
        local out = app:invoke({}, { thread_id = "u" })
        assert.is_table(out.__interrupt__)
        assert.equal("before", out.__interrupt__[1].when)
        local cfg = assert(app:update_state({ thread_id = "u" }, { text = "v2 (edited)" }))
        assert.is_string(cfg.checkpoint_id)
        local st = app:get_state { thread_id = "u" }
        assert.equal("update", st.metadata.source)
        assert.same({ "review" }, st.next)
        out = assert(app:invoke(nil, { thread_id = "u" }))
        assert.equal("v2 (edited)", out.reviewed)
      end)
    end)

    it("update_state with as_node plans that node's successors", function()
      local g = G.new()
      g:add_node("a", function() return { a = true } end)
      g:add_node("b", function(s) return { b = s.x } end)
      g:add_edge(START, "a"):add_edge("a", "b")
      local app = g:compile { checkpointer = saver() }
      run(function()
        app:invoke({}, { thread_id = "as" })
        assert(app:update_state({ thread_id = "as" }, { x = 5 }, "a"))
        assert.same({ "b" }, app:get_state({ thread_id = "as" }).next)
        assert.equal(5, app:invoke(nil, { thread_id = "as" }).b)
      end)
    end)

    it("invoking with a past checkpoint_id forks from that point", function()
      local g = G.new { items = R.append }
      g:add_node("a", function(s) return { items = "a" .. (s.tag or "") } end)
      g:add_node("b", function(s) return { items = "b" .. (s.tag or "") } end)
      g:add_edge(START, "a"):add_edge("a", "b")
      local app = g:compile { checkpointer = saver() }
      run(function()
        app:invoke({ tag = "1" }, { thread_id = "f" })
        local h = app:history { thread_id = "f" }
        local after_a = h[2]    -- newest first: [1] after b, [2] after a
        assert.same({ "b" }, after_a.next)
        local fork_cfg = assert(app:update_state(
          { thread_id = "f", checkpoint_id = after_a.config.checkpoint_id }, { tag = "2" }))
        local out = assert(app:invoke(nil, { thread_id = "f", checkpoint_id = fork_cfg.checkpoint_id }))
        assert.same({ "a1", "b2" }, out.items)
        -- replaying the original checkpoint re-runs its step
        out = assert(app:invoke(nil, { thread_id = "f", checkpoint_id = after_a.config.checkpoint_id }))
        assert.same({ "a1", "b1" }, out.items)
        -- the original branch is still in history
        local ids = {}
        for _, snap in ipairs(app:history { thread_id = "f" }) do ids[snap.config.checkpoint_id] = true end
        assert.is_true(ids[h[1].config.checkpoint_id])
        assert.equal(6, #app:history { thread_id = "f" })
      end)
    end)

    it("checkpoint ids sort in creation order", function()
      local app = linear(saver())
      run(function()
        app:invoke({ count = 0 }, { thread_id = "o" })
        app:invoke({ count = 0 }, { thread_id = "o" })
        local h = app:history { thread_id = "o" }
        assert.equal(8, #h)   -- two runs: input + 3 steps each
        for i = 2, #h do assert.is_true(h[i - 1].config.checkpoint_id > h[i].config.checkpoint_id) end
      end)
    end)

    it("a saver error fails the run with the saver's message", function()
      local g = G.new()
      g:add_node("a", function() return { f = print } end)
      g:add_edge(START, "a")
      local app = g:compile { checkpointer = saver() }
      local out, err = run(function() return app:invoke({}, { thread_id = "bad" }) end)
      assert.is_nil(out)
      -- the task's pending write or the next checkpoint, whichever is written first
      assert.matches("'f' by task 1:a is a function, which cannot be saved", (err:gsub("checkpoint%.values%.f", "'f' by task 1:a")))
    end)
  end)
end

describe("checkpoints and commands", function()
  it("a caller Command with update on a paused run is applied before the next writes", function()
    local g = G.new { log = R.append }
    g:add_node("a", function() return { log = "a" } end)
    g:add_node("b", function(s) return { log = "b", note_seen = s.note } end)
    g:add_edge(START, "a"):add_edge("a", "b")
    local app = g:compile { checkpointer = G.checkpoint.memory(), interrupt_after = { "a" } }
    run(function()
      local out = app:invoke({}, { thread_id = "c" })
      assert.equal("after", out.__interrupt__[1].when)
      out = assert(app:invoke(Command { update = { note = "from human", log = "human" } }, { thread_id = "c" }))
      assert.same({ "a", "human", "b" }, out.log)
      assert.is_nil(out.note_seen)   -- b ran in the same step as the update
      assert.equal("from human", out.note)
    end)
  end)
end)

describe("when async writes reach the saver", function()
  -- the file saver, counting its put_batch calls
  local function counted()
    local s = G.checkpoint.file(tmp.dir("batches"))
    local calls = { n = 0 }
    local put_batch = s.put_batch
    s.put_batch = function(self, list)
      calls.n = calls.n + 1
      return put_batch(self, list)
    end
    return s, calls
  end

  it("the steps a run computes in a row share one batch; a wait outside the process ends one", function()
    local s, calls = counted()
    local app = linear(s, { durability = "async" })
    run(function()
      assert.equal(3, app:invoke({ count = 0 }, { thread_id = "cpu" }).count)
      assert.equal(1, calls.n)
      assert.equal(4, #app:history { thread_id = "cpu" })
    end)
    local g = G.new { items = R.append }
    g:add_node("a", function() return { items = "a" } end)
    g:add_node("wait", function() mg.sleep(0.05) return { items = "wait" } end)
    g:add_node("b", function() return { items = "b" } end)
    g:add_edge(START, "a"):add_edge("a", "wait"):add_edge("wait", "b"):add_edge("b", END)
    local s2, calls2 = counted()
    local app2 = g:compile { checkpointer = s2, durability = "async" }
    run(function()
      assert.same({ "a", "wait", "b" }, app2:invoke({}, { thread_id = "io" }).items)
      assert.equal(2, calls2.n)
      assert.equal(4, #app2:history { thread_id = "io" })
    end)
  end)

  it("drop_unsaved: what is still queued when the run ends is not saved; a batch on its way is", function()
    local s, calls = counted()
    local app = linear(s, { durability = "async" })
    run(function()
      local out = app:invoke({ count = 0 }, { thread_id = "drop", drop_unsaved = true })
      assert.equal(3, out.count)
      assert.equal(0, calls.n)
      assert.same({}, app:get_state({ thread_id = "drop" }).values)
    end)
    local g = G.new { items = R.append }
    g:add_node("a", function() return { items = "a" } end)
    g:add_node("wait", function() mg.sleep(0.05) return { items = "wait" } end)
    g:add_node("b", function() return { items = "b" } end)
    g:add_edge(START, "a"):add_edge("a", "wait"):add_edge("wait", "b"):add_edge("b", END)
    local app2 = g:compile { checkpointer = G.checkpoint.file(tmp.dir("drop2")), durability = "async" }
    run(function()
      app2:invoke({}, { thread_id = "io", drop_unsaved = true })
      -- saved while "wait" waited: the input and the step of "a"
      assert.same({ "a" }, app2:get_state({ thread_id = "io" }).values.items)
      -- a resume runs the rest again
      assert.same({ "a", "wait", "b" }, app2:invoke(nil, { thread_id = "io" }).items)
    end)
    local app3 = linear(G.checkpoint.file(tmp.dir("drop3")), { durability = "exit" })
    run(function()
      app3:invoke({ count = 0 }, { thread_id = "x", drop_unsaved = true })
      assert.equal(0, #app3:history { thread_id = "x" })
    end)
    run(function()
      assert.has_error(function() app3:invoke({ count = 0 }, { thread_id = "y", drop_unsaved = "yes" }) end,
        "bad argument #2 to 'invoke': drop_unsaved must be a boolean")
    end)
  end)

  it("on_first_save: called once, when the run hands the saver its first write; never when nothing reached it", function()
    local function counting()
      local n = 0
      return function() n = n + 1 end, function() return n end
    end
    -- async, drop_unsaved, a run that never waits: everything dropped, no call
    local app = linear(G.checkpoint.file(tmp.dir("first1")), { durability = "async" })
    run(function()
      local f, n = counting()
      app:invoke({ count = 0 }, { thread_id = "t", drop_unsaved = true, on_first_save = f })
      assert.equal(0, n())
      assert.equal(0, #app:history { thread_id = "t" })
    end)
    -- a batch goes while a node waits: one call for all the writes
    local g = G.new { items = R.append }
    g:add_node("a", function() return { items = "a" } end)
    g:add_node("wait", function() mg.sleep(0.05) return { items = "wait" } end)
    g:add_edge(START, "a"):add_edge("a", "wait"):add_edge("wait", END)
    local app2 = g:compile { checkpointer = G.checkpoint.file(tmp.dir("first2")), durability = "async" }
    run(function()
      local f, n = counting()
      app2:invoke({}, { thread_id = "t", drop_unsaved = true, on_first_save = f })
      assert.equal(1, n())
      assert.is_true(#app2:history { thread_id = "t" } > 0)
    end)
    -- sync, and a saver called at once: the first write calls it, once
    for _, saver in ipairs { G.checkpoint.file(tmp.dir("first3")), G.checkpoint.memory() } do
      local app3 = linear(saver, { durability = "sync" })
      run(function()
        local f, n = counting()
        app3:invoke({ count = 0 }, { thread_id = "t", on_first_save = f })
        assert.equal(1, n())
        assert.equal(4, #app3:history { thread_id = "t" })
      end)
    end
    run(function()
      assert.has_error(function() app:invoke({ count = 0 }, { thread_id = "y", on_first_save = true }) end,
        "bad argument #2 to 'invoke': on_first_save must be a function")
    end)
  end)

  it("checkpoint_tuple: the run starts from the tuple given; false on a thread that has one conflicts", function()
    local s = G.checkpoint.file(tmp.dir("tuple"))
    local g = G.new { items = R.append }
    g:add_node("a", function() return { items = "a" } end)
    g:add_node("b", function() return { items = "b" } end)
    g:add_edge(START, "a"):add_edge("a", "b"):add_edge("b", END)
    local app = g:compile { checkpointer = s, durability = "sync", interrupt_before = { "b" } }
    run(function()
      app:invoke({}, { thread_id = "t" })
      local tup = s:get { thread_id = "t" }
      assert.same({ "b" }, { tup.checkpoint.next[1].node })
      local out = app:invoke(nil, { thread_id = "t", checkpoint_tuple = tup })
      assert.same({ "a", "b" }, out.items)
      local _, err = app:invoke({}, { thread_id = "t", checkpoint_tuple = false })
      assert.matches("checkpoint conflict", err, 1, true)
      _, err = app:invoke({}, { thread_id = "t", checkpoint_tuple = "x" })
      assert.matches("checkpoint_tuple must be a saver's tuple or false", err, 1, true)
    end)
  end)
end)
