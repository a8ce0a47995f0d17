-- The Postgres checkpoint saver against a real, throwaway PostgreSQL.
local mg = require "moongraph"
local pg = require "moongraph.pg"
local postgres = require "moongraph.checkpoint.postgres"
local servers = require "servers"
local child = require "graph_child"
local tmp = require "tmp"

describe("postgres checkpoint saver", function()
  local srv
  local ndb = 0

  setup(function() srv = servers.postgres() end)
  teardown(function() if srv then srv:destroy() end end)

  -- a URL of a new, empty database
  local function fresh_db()
    ndb = ndb + 1
    return srv:create_database("cp_pg_" .. ndb)
  end

  require("saver_contract")("postgres", function()
    return postgres.new(fresh_db())
  end, _ENV)

  describe("migrations", function()
    it("create the schema once and record their versions", function()
      local url = fresh_db()
      mg.run(function()
        local db = assert(pg.connect(url))
        assert.equal(#postgres.migrations, postgres.migrate(db))
        assert.equal(0, postgres.migrate(db))
        local rows = assert(db:query("SELECT version, name FROM moongraph_schema WHERE scope = 'checkpoint' ORDER BY version"))
        assert.equal(#postgres.migrations, #rows)
        for i, m in ipairs(postgres.migrations) do
          assert.equal(m.version, rows[i].version)
          assert.equal(m.name, rows[i].name)
        end
      end)
    end)

    it("apply only the versions a database does not have", function()
      local url = fresh_db()
      mg.run(function()
        local db = assert(pg.connect(url))
        local first = { postgres.migrations[1] }
        assert.equal(1, postgres.migrate(db, first))
        local more = {}
        for i, m in ipairs(postgres.migrations) do more[i] = m end
        more[#more + 1] = { version = 99, name = "extra table", sql = "CREATE TABLE extra_t (a int)" }
        assert.equal(#more - 1, postgres.migrate(db, more))
        assert.equal(#more, db:query("SELECT count(*) AS c FROM moongraph_schema WHERE scope = 'checkpoint'")[1].c)
      end)
    end)

    it("roll back entirely when one fails", function()
      local url = fresh_db()
      mg.run(function()
        local db = assert(pg.connect(url))
        local bad = {
          { version = 1, name = "good", sql = "CREATE TABLE good_t (a int)" },
          { version = 2, name = "bad", sql = "CREATE TABLE broken (" },
        }
        local n, err = postgres.migrate(db, bad)
        assert.is_nil(n)
        assert.matches("migration 2 %(bad%) of scope 'checkpoint' failed", err)
        -- the first migration's table is not there (and the query did run)
        local rows, qerr, state = db:query("SELECT * FROM good_t")
        assert.is_nil(rows)
        assert.matches('relation "good_t" does not exist', qerr, 1, true)
        assert.equal("42P01", state)
      end)
    end)

    it("from 4 processes at once leave one correct schema", function()
      local url = fresh_db()
      local script = child.script([[
        local mg = require "moongraph"
        local pg = require "moongraph.pg"
        local postgres = require "moongraph.checkpoint.postgres"
        local go = arg[2]
        -- start together: wait until the go file exists
        while not io.open(go) do os.execute("sleep 0.01") end
        mg.run(function()
          local db = assert(pg.connect(arg[1]))
          local n, err = postgres.migrate(db)
          print(n and ("APPLIED " .. n) or ("ERROR " .. tostring(err)))
        end)
      ]])
      local dir = tmp.dir("migrate")
      local go = dir .. "/go"
      local outs = {}
      for i = 1, 4 do
        outs[i] = dir .. "/out" .. i
        os.execute(string.format("lua5.4 %s %q %q > %s 2>&1 &", script, url, go, outs[i]))
      end
      io.open(go, "w"):close()
      local applied, lines = {}, {}
      for i = 1, 4 do
        local deadline = os.time() + 30
        local line
        repeat
          line = child.lines(outs[i])[1]
          if not line then os.execute("sleep 0.05") end
        until line or os.time() > deadline
        lines[i] = line
        applied[#applied + 1] = tonumber((line or ""):match("^APPLIED (%d+)$"))
      end
      for i = 1, 4 do assert.is_number(applied[i], lines[i]) end
      table.sort(applied)
      assert.same({ 0, 0, 0, #postgres.migrations }, applied)
      mg.run(function()
        local db = assert(pg.connect(url))
        assert.equal(#postgres.migrations, db:query("SELECT count(*) AS c FROM moongraph_schema WHERE scope = 'checkpoint'")[1].c)
        local t = db:query([[SELECT count(*) AS c FROM information_schema.tables
          WHERE table_name LIKE 'moongraph_%']])[1].c
        assert.equal(5, t)   -- schema (the migrations), checkpoints, blobs, writes, heads
        -- and the schema works
        local s = postgres.new(db)
        assert(s:put({ thread_id = "t" }, { v = 1, id = "0001", step = 0, values = { a = 1 }, next = {} }, {}))
        assert.equal(1, s:get({ thread_id = "t" }).checkpoint.values.a)
      end)
    end)
  end)

  describe("a database written by the saver before optimistic concurrency", function()
    it("is migrated: its threads read back, go on, and a stale write to them is refused", function()
      local url = fresh_db()
      mg.run(function()
        local db = assert(pg.connect(url))
        -- schema version 2 and rows as that version of the saver wrote them
        assert.equal(2, postgres.migrate(db, { postgres.migrations[1], postgres.migrations[2] }))
        assert(db:exec([=[
          INSERT INTO moongraph_checkpoint_blobs VALUES
            ('old', '', 'n', '0000000000000001', '1'),
            ('old', '', 'n', '0000000000000002', '2'),
            ('old', '', 'msg', '0000000000000001', '"안녕"');
          INSERT INTO moongraph_checkpoints
            (thread_id, checkpoint_ns, checkpoint_id, parent_id, checkpoint, channel_versions, metadata) VALUES
            ('old', '', '0000000000000001', NULL,
             '{"id":"0000000000000001","next":[{"node":"b"}],"step":0,"ts":"2025-01-01T00:00:00Z","v":1}',
             '{"msg":"0000000000000001","n":"0000000000000001"}', '{"source":"input","step":0}'),
            ('old', '', '0000000000000002', '0000000000000001',
             '{"id":"0000000000000002","next":[],"step":1,"ts":"2025-01-01T00:00:01Z","v":1}',
             '{"msg":"0000000000000001","n":"0000000000000002"}', '{"source":"loop","step":1}');
          INSERT INTO moongraph_checkpoint_writes VALUES
            ('old', '', '0000000000000001', '1:b', '[["n",2]]');
        ]=]))
        local s = postgres.new(db)
        local tup = assert(s:get { thread_id = "old" })
        assert.equal("0000000000000002", tup.checkpoint.id)
        assert.same({ n = 2, msg = "안녕" }, tup.checkpoint.values)
        assert.equal(#postgres.migrations, db:query("SELECT max(version) AS v FROM moongraph_schema WHERE scope = 'checkpoint'")[1].v)
        local first = assert(s:get { thread_id = "old", checkpoint_id = "0000000000000001" })
        assert.same({ { "1:b", "n", 2 } }, first.pending_writes)
        -- a write that extends its latest checkpoint goes on; one that extends the older is refused
        local r, err = s:put({ thread_id = "old", checkpoint_id = "0000000000000001" },
          { v = 1, id = "0000000000000003", step = 1, values = { n = 5 }, next = {} }, {})
        assert.is_nil(r)
        assert.matches("^checkpoint conflict: thread 'old' is at checkpoint 0000000000000002", err)
        assert(s:put({ thread_id = "old", checkpoint_id = "0000000000000002" },
          { v = 1, id = "0000000000000003", step = 2, values = { n = 3, msg = "안녕" }, next = {} }, {}))
        assert.same({ n = 3, msg = "안녕" }, s:get({ thread_id = "old" }).checkpoint.values)
      end)
    end)
  end)

  describe("state values", function()
    local function count(db, sql, params) return db:query(sql, params)[1].c end

    it("a 1 MiB value that does not change is stored once", function()
      local url = fresh_db()
      mg.run(function()
        local big = string.rep("0123456789abcdef", 65536)      -- 1 MiB
        local g = mg.graph { n = mg.reducers.add }
        local names = {}
        for i = 1, 10 do
          names[i] = "step" .. i
          g:add_node(names[i], function() return { n = 1 } end)
        end
        g:add_edge(mg.START, names[1])
        for i = 1, 9 do g:add_edge(names[i], names[i + 1]) end
        local saver = postgres.new(url)
        local app = g:compile { checkpointer = saver, durability = "sync" }
        local out = assert(app:invoke({ big = big, n = 0 }, { thread_id = "big" }))
        assert.equal(10, out.n)
        local db = assert(pg.connect(url))
        assert.equal(11, count(db, "SELECT count(*) AS c FROM moongraph_checkpoints WHERE thread_id = 'big'"))
        assert.equal(1, count(db, "SELECT count(*) AS c FROM moongraph_checkpoint_blobs WHERE channel = 'big'"))
        local bytes = count(db, [[SELECT sum(octet_length(value::text)) AS c
          FROM moongraph_checkpoint_blobs WHERE thread_id = 'big']])
        assert.is_true(bytes < #big + 4096, "bytes stored: " .. bytes)
        -- n changed every step: one version per checkpoint
        assert.equal(11, count(db, "SELECT count(*) AS c FROM moongraph_checkpoint_blobs WHERE channel = 'n'"))

        -- a new saver (a new process) continuing the thread reuses the stored value
        local again = postgres.new(url)
        local app2 = g:compile { checkpointer = again, durability = "sync" }
        out = assert(app2:invoke({ n = 0 }, { thread_id = "big" }))
        assert.equal(20, out.n)
        assert.equal(big, out.big)
        assert.equal(1, count(db, "SELECT count(*) AS c FROM moongraph_checkpoint_blobs WHERE channel = 'big'"))
        local tup = again:get { thread_id = "big" }
        assert.equal(big, tup.checkpoint.values.big)
      end)
    end)

    it("keeps every checkpoint readable with async durability", function()
      local url = fresh_db()
      mg.run(function()
        local g = mg.graph { log = mg.reducers.append }
        for i = 1, 10 do
          g:add_node("n" .. i, function() return { log = i, last = i } end)
          if i == 1 then g:add_edge(mg.START, "n1") else g:add_edge("n" .. (i - 1), "n" .. i) end
        end
        local saver = postgres.new(url)
        local app = g:compile { checkpointer = saver, durability = "async" }
        for t = 1, 5 do
          local out = assert(app:invoke({ log = {} }, { thread_id = "a" .. t }))
          assert.equal(10, #out.log)
        end
        for t = 1, 5 do
          local list = assert(saver:list { thread_id = "a" .. t })
          assert.equal(11, #list)
          for _, tup in ipairs(list) do
            -- step s holds the logs of nodes 1..s
            assert.equal(tup.checkpoint.step, #tup.checkpoint.values.log)
          end
        end
      end)
    end)

    it("a thread another saver deleted: written anew whole, and a write extending it is refused", function()
      local url = fresh_db()
      mg.run(function()
        local a, b = postgres.new(url), postgres.new(url)   -- two processes on one database
        local function cp(id, step, values)
          return { v = 1, id = id, ts = "2025-01-01T00:00:00Z", step = step, values = values, next = {} }
        end
        local c = assert(a:put({ thread_id = "t" }, cp("0001", 0, { x = "kept", n = 1 }), {}))
        assert(b:delete_thread("t"))
        -- a continues the thread it had: refused, nothing written
        local r, err = a:put(c, cp("0002", 1, { x = "kept", n = 2 }), {})
        assert.is_nil(r)
        assert.matches("checkpoint conflict: thread 't' is at checkpoint %(none%), not 0001", err)
        assert.is_nil(b:get { thread_id = "t" })
        -- the thread started again with the same values: every value is written
        assert(a:put({ thread_id = "t" }, cp("0003", 0, { x = "kept", n = 1 }), {}))
        assert.same({ x = "kept", n = 1 }, assert(b:get { thread_id = "t" }).checkpoint.values)
        -- the same through a run, the deleting saver's reader finding the thread gone
        local g = mg.graph {}
        g:add_node("n", function(st) return { y = (st.y or 0) + 1 } end)
        g:add_edge(mg.START, "n")
        local app = g:compile { checkpointer = a }
        assert(app:invoke({ x = "same" }, { thread_id = "job" }))
        assert(b:delete_thread("job"))
        assert.equal(1, assert(app:invoke({ x = "same" }, { thread_id = "job" })).y)
        assert.same({ x = "same", y = 1 }, assert(b:get { thread_id = "job" }).checkpoint.values)
      end)
    end)

    it("stores thread ids, keys and values with quotes and SQL verbatim", function()
      local url = fresh_db()
      mg.run(function()
        local s = postgres.new(url)
        local nasty = "'; DROP TABLE moongraph_checkpoints; --"
        local values = { [nasty] = nasty, ["a\"b"] = { "\\", "$1", "\n" } }
        assert(s:put({ thread_id = nasty, checkpoint_ns = nasty }, {
          v = 1, id = "0001", step = 0, values = values, next = {},
        }, { note = nasty }))
        assert(s:put_writes({ thread_id = nasty, checkpoint_ns = nasty, checkpoint_id = "0001" },
          nasty, { { nasty, nasty } }))
        local tup = s:get { thread_id = nasty, checkpoint_ns = nasty }
        assert.same(values, tup.checkpoint.values)
        assert.equal(nasty, tup.metadata.note)
        assert.same({ { nasty, nasty, nasty } }, tup.pending_writes)
        assert.is_true(s:delete_thread(nasty))
        assert.is_nil(s:get { thread_id = nasty, checkpoint_ns = nasty })
      end)
    end)

    it("reports a checkpoint whose value row is missing instead of inventing state", function()
      local url = fresh_db()
      mg.run(function()
        local s = postgres.new(url)
        assert(s:put({ thread_id = "t" }, { v = 1, id = "0001", step = 0, values = { a = 1 }, next = {} }, {}))
        local db = assert(pg.connect(url))
        assert(db:query("DELETE FROM moongraph_checkpoint_blobs WHERE channel = 'a'"))
        local tup, err = s:get { thread_id = "t" }
        assert.is_nil(tup)
        assert.matches("missing value of 'a'", err)
      end)
    end)

    it("fails with the reason when the database is unreachable", function()
      mg.run(function()
        local s = postgres.new("postgresql://postgres@127.0.0.1:1/none")
        local ok, err = s:put({ thread_id = "t" }, { v = 1, id = "0001", step = 0, values = {}, next = {} }, {})
        assert.is_nil(ok)
        assert.matches("cannot connect", err)
      end)
    end)

    it("raises on bad arguments", function()
      assert.has_error(function() postgres.new(42) end,
        "bad argument #1 to 'postgres': PostgreSQL URL, connection or pool expected, got number")
      assert.has_error(function() postgres.new("postgresql://x", { colour = 1 }) end,
        "bad argument #2 to 'postgres': unknown option 'colour'")
      assert.has_error(function() postgres.new("postgresql://x", { pool_size = 0 }) end,
        "bad argument #2 to 'postgres': pool_size must be a positive integer")
    end)
  end)
end)
