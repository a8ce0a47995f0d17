-- The saver interface contract (docs/checkpoints.md) as a reusable set of
-- busted specs. A saver's spec runs it with a factory:
--
--   require("saver_contract")("redis", function() return my_saver() end, _ENV)
--
-- (_ENV: the spec file's environment, where busted's describe, it and
-- assert live.) Each call of the factory must return a saver with no data.
local mg = require "moongraph"

local function cp(id, values, step)
  return { v = 1, id = id, ts = "2025-01-01T00:00:00Z", step = step or 0,
    values = values or {}, next = {} }
end

return function(name, make, env)
  local describe, it, assert = env.describe, env.it, env.assert
  describe(name .. " saver", function()
    local function with_saver(fn)
      return mg.run(function() return fn(make()) end)
    end

    it("refuses writes that are not {channel, value} pairs, and names an unsavable value", function()
      with_saver(function(s)
        local c = assert(s:put({ thread_id = "t" }, cp("0001"), {}))
        assert.has_error(function() s:put_writes(c, "1:a", { { "x", 1 }, { 2, "y" } }) end,
          "bad argument #3 to 'put_writes': write 2 is not a {channel, value} pair")
        assert.has_error(function() s:put_writes(c, "1:a", { "x" }) end,
          "bad argument #3 to 'put_writes': write 1 is not a {channel, value} pair")
        assert.has_error(function() s:put_writes(c, "1:a", "x") end,
          "bad argument #3 to 'put_writes': list of {channel, value} expected, got string")
        local ok, err = s:put_writes(c, "1:a", { { "x", print } })
        assert.is_nil(ok)
        assert.matches("write to 'x' by task 1:a is a function", err, 1, true)
        -- a value only the codec takes (a metatable of its own) is saved as the codec saves it
        assert(s:put_writes(c, "1:a", { { "x", setmetatable({ 1 }, { __index = {} }) } }))
        assert.same({ { "1:a", "x", { 1 } } }, s:get({ thread_id = "t" }).pending_writes)
      end)
    end)

    it("put returns the new config and get returns the latest checkpoint", function()
      with_saver(function(s)
        local c1 = assert(s:put({ thread_id = "t" }, cp("0001", { n = 1 }), { source = "input" }))
        assert.same({ thread_id = "t", checkpoint_ns = "", checkpoint_id = "0001" }, c1)
        assert(s:put(c1, cp("0002", { n = 2 }, 1), { source = "loop" }))
        local tup = s:get { thread_id = "t" }
        assert.equal("0002", tup.checkpoint.id)
        assert.same({ n = 2 }, tup.checkpoint.values)
        assert.equal("loop", tup.metadata.source)
        assert.equal("0001", tup.parent_config.checkpoint_id)
        assert.same({}, tup.pending_writes)
        local old = s:get { thread_id = "t", checkpoint_id = "0001" }
        assert.same({ n = 1 }, old.checkpoint.values)
        assert.is_nil(old.parent_config)
      end)
    end)

    it("stores the data, not the tables: changes made after put or to what get returned do not show", function()
      with_saver(function(s)
        local values = { list = { 1, 2 }, map = { a = { deep = "x" } } }
        local meta = { source = "loop", ran = { "a" } }
        local c = assert(s:put({ thread_id = "t" }, cp("0001", values), meta))
        local update = { 3 }
        local writes = { { "list", update } }
        assert(s:put_writes(c, "1:a", writes))
        values.list[3] = "later"
        values.map.a.deep = "changed"
        values.extra = true
        meta.ran[1] = "b"
        update[1] = "changed"
        writes[1][1] = "other"
        local got = s:get { thread_id = "t" }
        assert.same({ list = { 1, 2 }, map = { a = { deep = "x" } } }, got.checkpoint.values)
        assert.same({ "a" }, got.metadata.ran)
        assert.same({ { "1:a", "list", { 3 } } }, got.pending_writes)
        got.checkpoint.values.list[1] = "mutated"
        got.metadata.ran[1] = "mutated"
        got.pending_writes[1][3][1] = "mutated"
        local again = s:get { thread_id = "t" }
        assert.same({ 1, 2 }, again.checkpoint.values.list)
        assert.same({ "a" }, again.metadata.ran)
        assert.same({ { "1:a", "list", { 3 } } }, again.pending_writes)
        assert.same({ 1, 2 }, s:list({ thread_id = "t" })[1].checkpoint.values.list)
      end)
    end)

    it("saves a table changed in place since the last put, the same table put again", function()
      with_saver(function(s)
        local list = { 1 }
        local c = assert(s:put({ thread_id = "t" }, cp("0001", { list = list, n = 1 }), {}))
        list[2] = 2
        c = assert(s:put(c, cp("0002", { list = list, n = 1 }, 1), {}))
        assert.same({ 1, 2 }, s:get({ thread_id = "t" }).checkpoint.values.list)
        -- what get returned, changed and put back
        local values = s:get({ thread_id = "t" }).checkpoint.values
        values.list[3] = 3
        assert(s:put(c, cp("0003", values, 2), {}))
        assert.same({ 1, 2, 3 }, s:get({ thread_id = "t" }).checkpoint.values.list)
        assert.same({ 1, 2 }, s:get({ thread_id = "t", checkpoint_id = "0002" }).checkpoint.values.list)
      end)
    end)

    it("under every durability, keeps a list a node extended in place and returned", function()
      mg.run(function()
        local s = make()
        local g = mg.graph {}
        g:add_node("push", function(st)
          local l = st.list or {}
          l[#l + 1] = #l + 1        -- the state's own table, changed and returned
          return { list = l }
        end)
        g:add_node("again", function(st)
          st.list[#st.list + 1] = #st.list + 1
          return { list = st.list }
        end)
        g:add_edge(mg.START, "push"):add_edge("push", "again")
        local app = g:compile { checkpointer = s }
        for _, durability in ipairs { "sync", "async", "exit" } do
          local thread = "inplace-" .. durability
          for run = 1, 2 do
            -- the second run starts from the state the first one saved
            local out = assert(app:invoke({}, { thread_id = thread, durability = durability }))
            assert.equal(2 * run, #out.list)
            local saved = app:get_state({ thread_id = thread }).values.list
            assert.same(out.list, saved, durability .. ", run " .. run)
          end
        end
      end)
    end)

    it("get returns nil for an unknown thread or checkpoint", function()
      with_saver(function(s)
        assert.is_nil(s:get { thread_id = "none" })
        assert(s:put({ thread_id = "t" }, cp("0001"), {}))
        assert.is_nil(s:get { thread_id = "t", checkpoint_id = "9999" })
      end)
    end)

    it("put_writes stores each task's writes, replacing earlier ones of that task", function()
      with_saver(function(s)
        local c = assert(s:put({ thread_id = "t" }, cp("0001"), {}))
        assert.is_true(s:put_writes(c, "1:b", { { "x", 1 } }))
        assert.is_true(s:put_writes(c, "1:a", { { "y", { deep = true } }, { "__route__", { "c" } } }))
        assert.is_true(s:put_writes(c, "1:b", { { "x", 2 } }))
        local tup = s:get { thread_id = "t" }
        assert.same({
          { "1:a", "y", { deep = true } },
          { "1:a", "__route__", { "c" } },
          { "1:b", "x", 2 },
        }, tup.pending_writes)
        -- a checkpoint with one task's writes, written twice
        local c2 = assert(s:put(c, cp("0002", {}, 1), {}))
        assert.is_true(s:put_writes(c2, "2:a", { { "x", 1 } }))
        assert.is_true(s:put_writes(c2, "2:a", { { "x", 3 } }))
        assert.same({ { "2:a", "x", 3 } }, s:get({ thread_id = "t" }).pending_writes)
      end)
    end)

    it("keeps values exact: integers stay integers, floats stay floats", function()
      with_saver(function(s)
        assert(s:put({ thread_id = "t" }, cp("0001", { i = 2, f = 2.0, x = 0.1 }), {}))
        local v = s:get({ thread_id = "t" }).checkpoint.values
        assert.equal("integer", math.type(v.i))
        assert.equal("float", math.type(v.f))
        assert.equal(0.1, v.x)
      end)
    end)

    it("keeps a state value that is JSON null, and a write of one", function()
      with_saver(function(s)
        local null = require("moongraph.json").null
        local c = assert(s:put({ thread_id = "t" }, cp("0001", { error = null, n = 1 }), {}))
        assert(s:put_writes(c, "1:a", { { "error", null } }))
        local got = assert(s:get { thread_id = "t" })
        assert.equal(null, got.checkpoint.values.error)
        assert.same({ { "1:a", "error", null } }, got.pending_writes)
      end)
    end)

    it("refuses state that cannot be saved, naming where it is", function()
      with_saver(function(s)
        local ok, err = s:put({ thread_id = "t" }, cp("0001", { cb = print }), {})
        assert.is_nil(ok)
        assert.matches("values.cb is a function", err)
      end)
    end)

    it("list returns checkpoints newest first, honouring limit and before", function()
      with_saver(function(s)
        local c = { thread_id = "t" }
        for i = 1, 5 do c = assert(s:put(c, cp(string.format("%04d", i)), { step = i })) end
        local ids = {}
        for _, tup in ipairs(s:list({ thread_id = "t" })) do ids[#ids + 1] = tup.checkpoint.id end
        assert.same({ "0005", "0004", "0003", "0002", "0001" }, ids)
        local l = s:list({ thread_id = "t" }, { limit = 2, before = "0004" })
        assert.equal(2, #l)
        assert.equal("0003", l[1].checkpoint.id)
        assert.equal("0002", l[2].checkpoint.id)
        l = s:list({ thread_id = "t" }, { before = { checkpoint_id = "0002" } })
        assert.equal(1, #l)
        assert.same({}, s:list { thread_id = "nobody" })
      end)
    end)

    it("namespaces are separate", function()
      with_saver(function(s)
        assert(s:put({ thread_id = "t" }, cp("0001", { where = "root" }), {}))
        assert(s:put({ thread_id = "t", checkpoint_ns = "sub:1:sub" }, cp("0002", { where = "sub" }), {}))
        assert.equal("root", s:get({ thread_id = "t" }).checkpoint.values.where)
        assert.equal("sub", s:get({ thread_id = "t", checkpoint_ns = "sub:1:sub" }).checkpoint.values.where)
      end)
    end)

    it("delete_thread removes every checkpoint of the thread and no other", function()
      with_saver(function(s)
        assert(s:put({ thread_id = "t" }, cp("0001"), {}))
        assert(s:put({ thread_id = "t", checkpoint_ns = "x:1" }, cp("0002"), {}))
        assert(s:put({ thread_id = "u" }, cp("0003"), {}))
        assert.is_true(s:delete_thread("t"))
        assert.is_nil(s:get { thread_id = "t" })
        assert.is_nil(s:get { thread_id = "t", checkpoint_ns = "x:1" })
        assert.is_not_nil(s:get { thread_id = "u" })
        assert.is_true(s:delete_thread("never-existed"))
      end)
    end)

    it("refuses a put that extends a checkpoint which is no longer the latest, saving nothing", function()
      with_saver(function(s)
        local c1 = assert(s:put({ thread_id = "t" }, cp("0001", { n = 1 }), {}))
        assert(s:put(c1, cp("0002", { n = 2 }, 1), {}))
        local r, err = s:put(c1, cp("0003", { n = 3 }, 1), {})
        assert.is_nil(r)
        assert.equal("checkpoint conflict: thread 't' is at checkpoint 0002, not 0001: another run wrote to it meanwhile",
          tostring(err))
        assert.equal("conflict", err.code)
        assert.is_false(err.retryable)
        assert.same({ thread_id = "t", checkpoint_ns = "", expected = "0001", latest = "0002" }, err.details)
        assert.equal("0002", s:get({ thread_id = "t" }).checkpoint.id)
        assert.is_nil(s:get { thread_id = "t", checkpoint_id = "0003" })
      end)
    end)

    it("refuses a first checkpoint for a thread that already has one", function()
      with_saver(function(s)
        assert(s:put({ thread_id = "t", checkpoint_ns = "sub" }, cp("0001"), {}))
        local r, err = s:put({ thread_id = "t", checkpoint_ns = "sub" }, cp("0002"), {})
        assert.is_nil(r)
        assert.equal("checkpoint conflict: thread 't' (namespace 'sub') is at checkpoint 0001, " ..
          "not (none: a new thread): another run wrote to it meanwhile", tostring(err))
        assert.equal("conflict", err.code)
        -- another namespace of the thread is its own
        assert(s:put({ thread_id = "t" }, cp("0003"), {}))
      end)
    end)

    it("takes a put again (a retry) and a fork that names the latest checkpoint it saw", function()
      with_saver(function(s)
        local c1 = assert(s:put({ thread_id = "t" }, cp("0001", { n = 1 }), {}))
        local c2 = assert(s:put(c1, cp("0002", { n = 2 }, 1), {}))
        assert(s:put(c1, cp("0002", { n = 2 }, 1), {}))              -- the same put again
        local fork = { thread_id = "t", checkpoint_ns = "", checkpoint_id = "0001", head_id = "0002" }
        assert(s:put(fork, cp("0003", { n = 10 }, 1), {}))
        local tup = s:get { thread_id = "t" }
        assert.equal("0003", tup.checkpoint.id)
        assert.equal("0001", tup.parent_config.checkpoint_id)
        -- a fork made from a stale view is refused like any other write
        local r, err = s:put(fork, cp("0004", { n = 11 }, 1), {})
        assert.is_nil(r)
        assert.matches("^checkpoint conflict: thread 't' is at checkpoint 0003, not 0002", err)
        assert(c2)
      end)
    end)

    it("put_batch saves checkpoints and writes in order, and refuses a stale batch whole", function()
      with_saver(function(s)
        if not s.put_batch then return end
        local c1 = assert(s:put({ thread_id = "t" }, cp("0001", { n = 1 }), {}))
        assert(s:put_batch {
          { op = "put_writes", a = c1, b = "1:a", c = { { "n", 2 } } },
          { op = "put", a = c1, b = cp("0002", { n = 2 }, 1), c = { step = 1 } },
          { op = "put_writes", a = { thread_id = "t", checkpoint_ns = "", checkpoint_id = "0002" },
            b = "2:a", c = { { "n", 3 } } },
          { op = "put", a = { thread_id = "t", checkpoint_ns = "", checkpoint_id = "0002" },
            b = cp("0003", { n = 3 }, 2), c = { step = 2 } },
        })
        local tup = s:get { thread_id = "t" }
        assert.equal("0003", tup.checkpoint.id)
        assert.same({ n = 3 }, tup.checkpoint.values)
        assert.same({ { "1:a", "n", 2 } }, s:get({ thread_id = "t", checkpoint_id = "0001" }).pending_writes)
        local r, err = s:put_batch {
          { op = "put", a = c1, b = cp("0004", { n = 4 }, 1), c = {} },
          { op = "put_writes", a = { thread_id = "t", checkpoint_ns = "", checkpoint_id = "0004" },
            b = "4:a", c = { { "n", 5 } } },
        }
        assert.is_nil(r)
        assert.matches("^checkpoint conflict: thread 't' is at checkpoint 0003, not 0001", err)
        assert.equal("0003", s:get({ thread_id = "t" }).checkpoint.id)
        assert.is_nil(s:get { thread_id = "t", checkpoint_id = "0004" })
      end)
    end)

    it("two runs of one thread at once: one finishes, the other fails with a conflict", function()
      mg.run(function()
        local s = make()
        local g = mg.graph { n = mg.reducers.add }
        g:add_node("a", function() mg.sleep(0.01) return { n = 1 } end)
        g:add_node("b", function() mg.sleep(0.01) return { n = 1 } end)
        g:add_edge(mg.START, "a")
        g:add_edge("a", "b")
        local app = g:compile { checkpointer = s }
        assert(app:invoke({ n = 0 }, { thread_id = "both", durability = "sync" }))
        local results = mg.gather {
          function() return { app:invoke({ n = 100 }, { thread_id = "both", durability = "sync" }) } end,
          function() return { app:invoke({ n = 1000 }, { thread_id = "both", durability = "sync" }) } end,
        }
        local ok, failed = 0, nil
        for _, r in ipairs(results) do
          assert(r.ok, tostring(r.err))
          if r.value[1] then ok = ok + 1 else failed = r.value[2] end
        end
        assert.equal(1, ok)
        assert.matches("checkpoint conflict: thread 'both'", failed)
        -- the thread ends with the run that finished, which may have started
        -- from the other one's input checkpoint (1104) or from its checkpoint
        -- after node a (1105): each a state one whole run could lead to
        local n = app:get_state({ thread_id = "both" }).values.n
        assert(n == 104 or n == 1004 or n == 1104 or n == 1105, "state after the two runs: " .. tostring(n))
      end)
    end)

    it("raises on misuse", function()
      with_saver(function(s)
        assert.has_error(function() s:put({}, cp("1"), {}) end,
          "bad argument #1 to 'put': config.thread_id is required")
        assert.has_error(function() s:put_writes({ thread_id = "t" }, "task", {}) end,
          "bad argument #1 to 'put_writes': config.checkpoint_id expected")
        assert.has_error(function() s:list({ thread_id = "t" }, { limit = 0 }) end,
          "bad argument #2 to 'list': limit must be a positive number")

      end)
    end)
  end)
end
