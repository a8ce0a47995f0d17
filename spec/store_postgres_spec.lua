-- The PostgreSQL Store against a real, throwaway PostgreSQL (LangGraph's
-- PostgresStore: https://reference.langchain.com/python/langgraph.store.postgres/).
-- age() moves every stored time back, as if that much time had passed.
local mg = require "moongraph"
local pg = require "moongraph.pg"
local store = require "moongraph.store"
local pstore = require "moongraph.store.postgres"
local process = require "moongraph.process"
local servers = require "servers"
local child = require "graph_child"

describe("postgres store", function()
  local srv, url
  local ndb = 0

  setup(function()
    srv = servers.postgres()
    url = srv:create_database("store_contract")
  end)
  teardown(function() if srv then srv:destroy() end end)

  local function fresh_db()
    ndb = ndb + 1
    return srv:create_database("store_pg_" .. ndb)
  end

  require("store_contract")("postgres", function(opts)
    local admin = assert(pg.connect(url))
    assert(pstore.migrate(admin))
    assert(admin:exec("TRUNCATE moongraph_store"))
    opts = opts or {}
    opts.pool_size = 2
    local s = store.postgres(url, opts)
    return {
      store = s,
      age = function(sec)
        assert(admin:query([[UPDATE moongraph_store SET
          created_at = created_at - make_interval(secs => $1),
          updated_at = updated_at - make_interval(secs => $1),
          expires_at = expires_at - make_interval(secs => $1)]], { sec + 0.0 }))
      end,
      close = function()
        s.db:close()
        admin:close()
      end,
    }
  end, _ENV)

  it("is mg.store.postgres and takes a pool or a connection", function()
    mg.run(function()
      local db = assert(pg.connect(fresh_db()))
      local s = mg.store.postgres(db)
      assert(s:put({ "a" }, "k", { v = 1 }))
      assert.equal(1, s:get({ "a" }, "k").value.v)
      db:close()
    end)
  end)

  it("runs a whole batch as one statement: one round trip", function()
    mg.run(function()
      local pool = pg.pool(fresh_db(), { size = 1 })
      local calls = {}
      local counted = {
        query = function(_, sql, params)
          calls[#calls + 1] = sql
          return pool:query(sql, params)
        end,
        exec = function(_, sql) return pool:exec(sql) end,
        transaction = function(_, fn) return pool:transaction(fn) end,
      }
      local s = store.postgres(counted, { index = { embed = function(texts)
        local out = {}
        for i = 1, #texts do out[i] = { 1, #texts[i] } end
        return out
      end, dims = 2, fields = { "t" } } })
      assert(s:put({ "warm" }, "up", { t = "x" }))      -- migrations and the first sweep
      calls = {}
      local res = assert(s:batch {
        { op = "put", namespace = { "a" }, key = "1", value = { t = "one" }, ttl = 5 },
        { op = "put", namespace = { "a" }, key = "2", value = { t = "two" } },
        { op = "delete", namespace = { "warm" }, key = "up" },
        { op = "get", namespace = { "warm" }, key = "up" },
        { op = "search", namespace_prefix = { "warm" }, query = "xx", filter = { t = "x" } },
        { op = "search", namespace_prefix = {}, limit = 1 },
        { op = "list_namespaces", max_depth = 1 },
      })
      assert.equal(1, #calls)
      assert.equal("up", res[4].key)
      assert.equal("up", res[5][1].key)
      assert.is_number(res[5][1].score)
      assert.same({ { "warm" } }, res[7])
      assert.equal(2, #assert(s:search({ "a" })))
      pool:close()
    end)
  end)

  it("sweeps expired rows itself, in the statement of the first batch after each interval", function()
    mg.run(function()
      local u = fresh_db()
      local admin = assert(pg.connect(u))
      local s = store.postgres(u, { ttl = { sweep_interval_minutes = 1 } })
      assert(s:put({ "a" }, "old", { v = 1 }, { ttl = 1 }))
      assert(s:put({ "a" }, "keep", { v = 1 }))
      assert(admin:query("UPDATE moongraph_store SET expires_at = now() - interval '1 second' WHERE key = 'old'"))
      -- the next sweep is due in a minute: the expired row is invisible but still there
      assert.is_nil(s:get({ "a" }, "old"))
      assert.equal(2, admin:query("SELECT count(*) AS c FROM moongraph_store")[1].c)
      s.next_sweep = 0                                   -- the interval has passed
      assert(s:get({ "a" }, "keep"))
      assert.equal(1, admin:query("SELECT count(*) AS c FROM moongraph_store")[1].c)
      admin:close()
    end)
  end)

  -- https://reference.langchain.com/python/langgraph.store/base/TTLConfig/refresh_on_read
  it("refreshes TTLs written by another store object (another process) on get and search", function()
    mg.run(function()
      local u = fresh_db()
      local admin = assert(pg.connect(u))
      local writer = store.postgres(u)
      assert(writer:put({ "t" }, "a", { v = 1 }, { ttl = 1 }))
      assert(writer:put({ "t" }, "b", { v = 2 }, { ttl = 1 }))
      local function left(key)
        return admin:query("SELECT extract(epoch FROM expires_at - now())::float8 AS s FROM moongraph_store WHERE key = $1",
          { key })[1].s
      end
      local reader = store.postgres(u)                   -- knows of no TTL yet
      assert(admin:query("UPDATE moongraph_store SET expires_at = now() + interval '5 seconds'"))
      assert(reader:get({ "t" }, "a"))
      assert.is_true(left("a") > 50)
      assert.is_true(left("b") < 10)
      assert(admin:query("UPDATE moongraph_store SET expires_at = now() + interval '5 seconds'"))
      assert.equal(2, #assert(reader:search({ "t" })))
      assert.is_true(left("a") > 50)
      assert.is_true(left("b") > 50)
      local other = store.postgres(u)
      assert(admin:query("UPDATE moongraph_store SET expires_at = now() + interval '5 seconds'"))
      assert.equal(2, #assert(other:batch { { op = "search", namespace_prefix = { "t" } } })[1])
      assert.is_true(left("a") > 50)
      assert.is_true(left("b") > 50)
      local third = store.postgres(u)
      assert(admin:query("UPDATE moongraph_store SET expires_at = now() + interval '5 seconds'"))
      assert.equal(1, #assert(third:search({ "t" }, { filter = { v = 2 } })))
      assert.is_true(left("a") < 10)
      assert.is_true(left("b") > 50)
      admin:close()
    end)
  end)

  it("stores namespaces as text arrays and values as jsonb, verbatim", function()
    mg.run(function()
      local u = fresh_db()
      local admin = assert(pg.connect(u))
      local s = store.postgres(u)
      assert(s:put({ "a.b", "it's" }, "k/1", { ["quote\""] = "값" }))
      local r = admin:query([[SELECT namespace[1] AS l1, namespace[2] AS l2, cardinality(namespace) AS n,
        key, value ->> 'quote"' AS v FROM moongraph_store]])[1]
      assert.same({ l1 = "a.b", l2 = "it's", n = 2, key = "k/1", v = "값" }, r)
      admin:close()
    end)
  end)

  describe("migrations", function()
    it("create the schema once, recorded in a scope of their own beside the checkpoint saver's", function()
      mg.run(function()
        local db = assert(pg.connect(fresh_db()))
        assert.equal(#pstore.migrations, pstore.migrate(db))
        assert.equal(0, pstore.migrate(db))
        assert(require("moongraph.checkpoint.postgres").migrate(db))
        local rows = assert(db:query("SELECT version, name FROM moongraph_schema WHERE scope = 'store' ORDER BY version"))
        assert.equal(#pstore.migrations, #rows)
        for i, m in ipairs(pstore.migrations) do
          assert.equal(m.version, rows[i].version)
          assert.equal(m.name, rows[i].name)
        end
        db:close()
      end)
    end)

    it("from 4 processes at once leave one schema", function()
      local u = fresh_db()
      local script = child.script([[
        local mg = require "moongraph"
        local pg = require "moongraph.pg"
        local pstore = require "moongraph.store.postgres"
        io.read("l")                             -- start together
        mg.run(function()
          local db = assert(pg.connect(arg[1]))
          local n, err = pstore.migrate(db)
          print(n and ("APPLIED " .. n) or ("ERROR " .. tostring(err)))
        end)
      ]])
      mg.run(function()
        local procs = {}
        for i = 1, 4 do procs[i] = assert(process.spawn({ "lua5.4", script, u })) end
        for i = 1, 4 do assert(procs[i]:write("go\n")) end
        local applied = {}
        for i = 1, 4 do
          local out = procs[i].stdout:read_all(60)
          procs[i]:wait()
          applied[i] = tonumber(out:match("APPLIED (%d+)"))
          assert.is_number(applied[i], out)
        end
        table.sort(applied)
        assert.same({ 0, 0, 0, #pstore.migrations }, applied)
      end)
      os.remove(script)
    end)
  end)

  describe("two processes writing one key", function()
    -- each writer puts 150 versions of the key; its value names the writer and
    -- the version, carries a payload of its own, and is indexed ("cat" or "dog")
    local script
    setup(function()
      script = child.script([[
        local mg = require "moongraph"
        local store = require "moongraph.store"
        local url, who, n = arg[1], arg[2], tonumber(arg[3])
        local function embed(texts)
          local out = {}
          for i, t in ipairs(texts) do out[i] = t:find("cat") and { 1, 0 } or { 0, 1 } end
          return out
        end
        mg.run(function()
          local s = store.postgres(url, { index = { embed = embed, dims = 2, fields = { "text" } } })
          assert(s:get({ "warm" }, "up"))  -- connect and migrate before the race
          print("ready")
          io.stdout:flush()
          io.read("l")
          local payload = {}
          for j = 1, 200 do payload[j] = who end
          for i = 1, n do
            assert(s:put({ "race" }, "k", { who = who, seq = i, payload = payload,
              text = who == "a" and "cat" or "dog" }))
          end
          print("done")
        end)
      ]])
    end)
    teardown(function() os.remove(script) end)

    local function check_whole(s)
      local item = assert(s:get({ "race" }, "k"))
      local v = item.value
      for j = 1, 200 do assert.equal(v.who, v.payload[j]) end
      -- the vectors are the winner's own
      local found = assert(s:search({ "race" }, { query = "cat" }))
      assert.near(v.who == "a" and 1 or 0, found[1].score, 1e-9)
      return v
    end

    local function embed(texts)
      local out = {}
      for i, t in ipairs(texts) do out[i] = t:find("cat") and { 1, 0 } or { 0, 1 } end
      return out
    end

    it("at the same time: the last write of one of them wins, whole", function()
      local u = fresh_db()
      mg.run(function()
        local s = store.postgres(u, { index = { embed = embed, dims = 2, fields = { "text" } } })
        assert(s:put({ "warm" }, "up", {}))
        local a = assert(process.spawn({ "lua5.4", script, u, "a", "150" }))
        local b = assert(process.spawn({ "lua5.4", script, u, "b", "150" }))
        assert.equal("ready", a.stdout:read_line(60))
        assert.equal("ready", b.stdout:read_line(60))
        assert(a:write("go\n"))
        assert(b:write("go\n"))
        assert.equal("done", a.stdout:read_line(60))
        assert.equal("done", b.stdout:read_line(60))
        assert.equal(0, a:wait())
        assert.equal(0, b:wait())
        local v = check_whole(s)
        assert.equal(150, v.seq)
        s.db:close()
      end)
    end)

    it("one after the other: the later writer wins", function()
      local u = fresh_db()
      mg.run(function()
        local s = store.postgres(u, { index = { embed = embed, dims = 2, fields = { "text" } } })
        assert(s:put({ "warm" }, "up", {}))
        for _, order in ipairs { { "a", "b" }, { "b", "a" } } do
          for _, who in ipairs(order) do
            local p = assert(process.spawn({ "lua5.4", script, u, who, "3" }))
            assert.equal("ready", p.stdout:read_line(60))
            assert(p:write("go\n"))
            assert.equal("done", p.stdout:read_line(60))
            assert.equal(0, p:wait())
          end
          assert.equal(order[2], check_whole(s).who)
        end
        s.db:close()
      end)
    end)
  end)

  it("a failure of the database comes back as nil, err", function()
    mg.run(function()
      local s = store.postgres("postgresql://nobody@127.0.0.1:1/none")
      local ok, err = s:put({ "a" }, "k", { v = 1 })
      assert.is_nil(ok)
      assert.is_string(err)
      local item
      item, err = s:get({ "a" }, "k")
      assert.is_nil(item)
      assert.is_string(err)
    end)
  end)

  it("rejects bad arguments", function()
    assert.has_error(function() store.postgres(42) end,
      "bad argument #1 to 'postgres' (PostgreSQL URL, connection or pool expected, got number)")
    assert.has_error(function() store.postgres("postgresql://x/y", { pool = 1 }) end,
      "bad argument #2 to 'postgres' (unknown option 'pool')")
  end)

  describe("on the caller's transaction: s:with(tx)", function()
    it("writes with the transaction: seen by it at once, by others after COMMIT, never after ROLLBACK", function()
      mg.run(function()
        local u = fresh_db()
        local s = store.postgres(u, { pool_size = 1 })
        local db = assert(pg.connect(u))
        assert(pstore.migrate(db))
        assert(db:exec("CREATE TABLE orders (id int PRIMARY KEY)"))
        local outside_before
        assert(db:transaction(function(tx)
          assert(tx:query("INSERT INTO orders VALUES (1)"))
          local v = assert(s:with(tx))
          assert(v:put({ "o" }, "1", { paid = true }))
          assert.is_true(assert(v:get({ "o" }, "1")).value.paid)
          outside_before = s:get({ "o" }, "1")              -- another connection
          return true
        end))
        assert.is_nil(outside_before)
        assert.is_true(assert(s:get({ "o" }, "1")).value.paid)
        local r, err = db:transaction(function(tx)
          local v = assert(s:with(tx))
          assert(v:put({ "o" }, "2", { paid = true }))
          assert(v:update({ "o" }, "1", function(x) x.paid = false return x end))
          assert(tx:query("INSERT INTO orders VALUES (1)"))   -- duplicate key: the whole transaction fails
          return true
        end)
        assert.is_nil(r)
        assert.matches("duplicate key", err)
        assert.is_nil(s:get({ "o" }, "2"))
        assert.is_true(assert(s:get({ "o" }, "1")).value.paid)
        db:close()
        s.db:close()
      end)
    end)

    it("creates its schema on the transaction when the database has none yet", function()
      mg.run(function()
        local db = assert(pg.connect(fresh_db()))
        local s = store.postgres(db)
        assert(db:transaction(function(tx)
          return assert(assert(s:with(tx)):put({ "a" }, "k", { v = 1 }))
        end))
        assert.equal(1, assert(s:get({ "a" }, "k")).value.v)
        db:close()
      end)
    end)

    it("updates from two processes' transactions on one item both count: the second waits for the first", function()
      mg.run(function()
        local u = fresh_db()
        local a, b = assert(pg.connect(u)), assert(pg.connect(u))
        local sa, sb = store.postgres(a), store.postgres(b)
        assert(sa:put({ "warm" }, "up", {}))
        local inc = function(v) v = v or { n = 0 } v.n = v.n + 1 return v end
        local a_read, b_done = mg.queue(), false
        local ta = mg.spawn(function()
          return a:transaction(function(tx)
            local v = assert(sa:with(tx))
            assert(v:update({ "u" }, "n", function(x)
              a_read:put(true)
              mg.sleep(0.2)                   -- b starts its update meanwhile
              assert.is_false(b_done)
              return inc(x)
            end))
            return true
          end)
        end)
        local tb = mg.spawn(function()
          a_read:get()
          local r = b:transaction(function(tx)
            return assert(assert(sb:with(tx)):update({ "u" }, "n", inc))
          end)
          b_done = true
          return r
        end)
        assert.same({ true, true }, { ta:join() })
        assert.same({ true, { n = 2 } }, { tb:join() })
        assert.equal(2, assert(sa:get({ "u" }, "n")).value.n)
        -- without a transaction of the caller's, update makes its own
        mg.gather { function() assert(sa:update({ "u" }, "n", inc)) end,
                    function() assert(sb:update({ "u" }, "n", inc)) end }
        assert.equal(4, assert(sb:get({ "u" }, "n")).value.n)
        a:close()
        b:close()
      end)
    end)

    it("patches with the transaction: sent ahead, committed or rolled back with it; a refused patch fails it", function()
      mg.run(function()
        local u = fresh_db()
        local s = store.postgres(u, { pool_size = 1 })
        local db = assert(pg.connect(u))
        assert(pstore.migrate(db))
        assert(db:exec("CREATE TABLE turns (id int PRIMARY KEY)"))
        local function turn(id, patch)
          return db:transaction(function(tx)
            assert.is_true(assert(s:with(tx)):patch({ "users", "u1" }, "profile", patch))
            local ok, err = tx:query("INSERT INTO turns VALUES ($1)", { id })
            if not ok then error(err, 0) end
            return true
          end)
        end
        assert(turn(1, { set = { city = "부산" }, add = { turns = 1 } }))
        assert.same({ city = "부산", turns = 1 }, assert(s:get({ "users", "u1" }, "profile")).value)
        local r, err = turn(1, { add = { turns = 1 } })                 -- duplicate key: rolled back
        assert.is_nil(r)
        assert.matches("duplicate key", err)
        r, err = turn(2, { add = { city = 1 } })                        -- refused: nothing of it is kept
        assert.is_nil(r)
        assert.matches("city is not an integer", err)
        assert.same({ city = "부산", turns = 1 }, assert(s:get({ "users", "u1" }, "profile")).value)
        assert.equal(1, assert(db:query("SELECT count(*)::int AS n FROM turns"))[1].n)
        db:close()
        s.db:close()
      end)
    end)

    it("rejects what is not a transaction", function()
      local s = store.postgres("postgresql://x/y")
      assert.has_error(function() s:with(42) end,
        "bad argument #1 to 'with' (moongraph.pg transaction or connection expected, got number)")
    end)
  end)
end)
