-- moongraph.pg against a real, throwaway PostgreSQL server.
local mg = require "moongraph"
local pg = require "moongraph.pg"
local servers = require "servers"

local null = pg.null

describe("moongraph.pg", function()
  local srv, url

  setup(function()
    srv = servers.postgres()
    url = srv:create_database("pg_spec")
  end)
  teardown(function() if srv then srv:destroy() end end)

  local function run(fn) return mg.run(fn) end
  local function connect(opts) return assert(pg.connect(url, opts)) end

  describe("queries", function()
    it("returns rows keyed by column name with types mapped", function()
      run(function()
        local db = connect()
        local rows, n = db:query([[
          SELECT 1::int2 AS i2, 2::int4 AS i4, 9007199254740993::int8 AS i8,
                 1.5::float4 AS f4, 0.1::float8 AS f8, 'Infinity'::float8 AS inf,
                 true AS yes, false AS no, 12345678901234567890.123::numeric AS num,
                 'text'::text AS t, NULL::int AS nothing,
                 '{"a": [1, 2.5, null], "b": {"c": "d"}}'::jsonb AS jb,
                 '[1, "x"]'::json AS j, '\x00ff41'::bytea AS bin,
                 '{1,2,3}'::int[] AS arr, '2024-01-02'::date AS day]])
        assert.equal(1, n)
        local r = rows[1]
        assert.equal(1, r.i2); assert.equal("integer", math.type(r.i2))
        assert.equal(2, r.i4)
        assert.equal(9007199254740993, r.i8); assert.equal("integer", math.type(r.i8))
        assert.equal(1.5, r.f4); assert.equal("float", math.type(r.f4))
        assert.equal(0.1, r.f8)
        assert.equal(math.huge, r.inf)
        assert.is_true(r.yes); assert.is_false(r.no)
        assert.equal("12345678901234567890.123", r.num)
        assert.equal("text", r.t)
        assert.equal(null, r.nothing)
        assert.same({ a = { 1, 2.5, null }, b = { c = "d" } }, r.jb)
        assert.same({ 1, "x" }, r.j)
        assert.equal("\0\255A", r.bin)
        assert.equal("{1,2,3}", r.arr)
        assert.equal("2024-01-02", r.day)
      end)
    end)

    it("returns several rows in order and the count of affected rows", function()
      run(function()
        local db = connect()
        assert.is_true(db:exec("CREATE TABLE nums (n int)"))
        local rows, n = db:query("INSERT INTO nums SELECT generate_series(1, 5)")
        assert.same({}, rows)
        assert.equal(5, n)
        rows, n = db:query("SELECT n FROM nums ORDER BY n")
        assert.equal(5, n)
        for i = 1, 5 do assert.equal(i, rows[i].n) end
        rows, n = db:query("UPDATE nums SET n = n + 10 WHERE n > $1", { 3 })
        assert.equal(2, n)
      end)
    end)

    it("sends Lua values typed", function()
      run(function()
        local db = connect()
        local r = db:query([[SELECT pg_typeof($1)::text AS b, pg_typeof($2)::text AS i,
          pg_typeof($3)::text AS f, pg_typeof($4)::text AS j, pg_typeof($5)::text AS y,
          $1 AS bv, $2 AS iv, $3 AS fv, $4 AS jv, $5 AS yv, $6::text IS NULL AS isnull,
          $7::text AS s]],
          { true, 42, 2.5, { k = { 1, 2 } }, pg.bytea("\0\1"), null, "plain" })[1]
        assert.same({ "boolean", "bigint", "double precision", "jsonb", "bytea" },
          { r.b, r.i, r.f, r.j, r.y })
        assert.is_true(r.bv)
        assert.equal(42, r.iv)
        assert.equal(2.5, r.fv)
        assert.same({ k = { 1, 2 } }, r.jv)
        assert.equal("\0\1", r.yv)
        assert.is_true(r.isnull)
        assert.equal("plain", r.s)
      end)
    end)

    it("sends bytes that are not UTF-8 as bytea", function()
      run(function()
        local db = connect()
        local blob = "\255\0\128binary"
        local r = db:query("SELECT pg_typeof($1)::text AS t, $1 AS v", { blob })[1]
        assert.equal("bytea", r.t)
        assert.equal(blob, r.v)
      end)
    end)

    it("takes NULLs as pg.null or as holes with params.n", function()
      run(function()
        local db = connect()
        local r = db:query("SELECT $1::int IS NULL AS a, $2::int AS b, $3::text IS NULL AS c",
          { nil, 7, nil, n = 3 })[1]
        assert.is_true(r.a)
        assert.equal(7, r.b)
        assert.is_true(r.c)
      end)
    end)

    it("stores parameters with quotes, semicolons and SQL verbatim", function()
      run(function()
        local db = connect()
        assert.is_true(db:exec("CREATE TABLE x (id serial PRIMARY KEY, v text, doc jsonb)"))
        local nasty = {
          "'; DROP TABLE x; --",
          "Robert'); DROP TABLE x;--",
          "\"double\" 'single' `back` ;;; $1 $$ $tag$ \\ \\\\ %s %d",
          "line1\nline2\r\n\ttab",
          "한국어 분리배출 ♻️ emoji",
          "",
        }
        for _, s in ipairs(nasty) do
          assert(db:query("INSERT INTO x (v, doc) VALUES ($1, $2)", { s, { s = s } }))
        end
        local rows = assert(db:query("SELECT v, doc FROM x ORDER BY id"))
        assert.equal(#nasty, #rows)
        for i, s in ipairs(nasty) do
          assert.equal(s, rows[i].v)
          assert.equal(s, rows[i].doc.s)
        end
        assert.equal(1, #db:query("SELECT 1 FROM x WHERE v = $1", { nasty[1] }))
        assert.equal(#nasty, db:query("SELECT count(*) AS c FROM x")[1].c)
      end)
    end)

    it("returns nil, message and SQLSTATE on errors and stays usable", function()
      run(function()
        local db = connect()
        local rows, err, state = db:query("SELECT nope FROM nowhere")
        assert.is_nil(rows)
        assert.matches('relation "nowhere" does not exist', err)
        assert.equal("42P01", state)
        assert.is_true(db:exec("CREATE TABLE u (k text PRIMARY KEY)"))
        assert(db:query("INSERT INTO u VALUES ($1)", { "a" }))
        rows, err, state = db:query("INSERT INTO u VALUES ($1)", { "a" })
        assert.is_nil(rows)
        assert.matches("duplicate key", err)
        assert.equal("23505", state)
        rows, err = db:query("SELECT $1::int", { "not a number" })
        assert.is_nil(rows)
        assert.matches("invalid input syntax", err)
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)
      end)
    end)

    it("raises on misuse", function()
      run(function()
        local db = connect()
        assert.has_error(function() db:query(42) end,
          "bad argument #1 to 'query' (SQL string expected, got number)")
        assert.has_error(function() db:query("SELECT $1", "not a list") end,
          "bad argument #2 to 'query' (list of parameters expected, got string)")
        local ok, err = pcall(db.query, db, "SELECT $1", { function() end })
        assert.is_false(ok)
        assert.matches("bad parameter %$1", err)
        assert.has_error(function() pg.bytea(1) end,
          "bad argument #1 to 'bytea' (string expected, got number)")
        assert.has_error(function() pg.connect(url, { size = 2 }) end,
          "bad argument #2 to 'connect' (size is an option of pg.pool)")
        assert.has_error(function() pg.pool(url, { bogus = 1 }) end,
          "bad argument #2 to 'pool' (unknown option 'bogus')")
      end)
    end)
  end)

  describe("exec", function()
    it("runs several statements and returns true", function()
      run(function()
        local db = connect()
        assert.is_true(db:exec([[
          CREATE TABLE e1 (a int);
          CREATE INDEX e1_a ON e1 (a);
          INSERT INTO e1 VALUES (1), (2);]]))
        assert.equal(2, db:query("SELECT count(*) AS c FROM e1")[1].c)
      end)
    end)

    it("stops at the first failing statement", function()
      run(function()
        local db = connect()
        local ok, err, state = db:exec("CREATE TABLE e2 (a int); SELECT * FROM missing; CREATE TABLE e3 (a int)")
        assert.is_nil(ok)
        assert.matches("missing", err)
        assert.equal("42P01", state)
        -- one implicit transaction: nothing of the script is left
        for _, t in ipairs { "e2", "e3" } do
          local rows, qerr, qstate = db:query("SELECT * FROM " .. t)
          assert.is_nil(rows)
          assert.matches('relation "' .. t .. '" does not exist', qerr, 1, true)
          assert.equal("42P01", qstate)
        end
      end)
    end)
  end)

  describe("transactions", function()
    it("commits when fn returns and passes its results", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE acct (name text PRIMARY KEY, bal int)")
        local a, b = db:transaction(function(tx)
          tx:query("INSERT INTO acct VALUES ($1, $2)", { "alice", 10 })
          tx:query("INSERT INTO acct VALUES ($1, $2)", { "bob", 5 })
          return "done", 2
        end)
        assert.equal("done", a)
        assert.equal(2, b)
        assert.equal(2, db:query("SELECT count(*) AS c FROM acct")[1].c)
      end)
    end)

    it("rolls back when fn raises", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE rb (v text)")
        local ok, err = db:transaction(function(tx)
          tx:query("INSERT INTO rb VALUES ($1)", { "lost" })
          error("node failed")
        end)
        assert.is_nil(ok)
        assert.matches("node failed", err)
        assert.equal(0, db:query("SELECT count(*) AS c FROM rb")[1].c)
      end)
    end)

    it("rolls back when a statement inside failed, even if fn returned", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE rb2 (v int PRIMARY KEY)")
        local ok, err = db:transaction(function(tx)
          tx:query("INSERT INTO rb2 VALUES (1)")
          tx:query("INSERT INTO rb2 VALUES (1)")        -- fails, not raised
          return true
        end)
        assert.is_nil(ok)
        assert.matches("rolled back", err)
        assert.equal(0, db:query("SELECT count(*) AS c FROM rb2")[1].c)
      end)
    end)

    it("nests with savepoints", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE sp (v text)")
        assert(db:transaction(function(tx)
          tx:query("INSERT INTO sp VALUES ('outer')")
          local ok = tx:transaction(function(inner)
            inner:query("INSERT INTO sp VALUES ('inner')")
            error("inner fails")
          end)
          assert(ok == nil)
          return true
        end))
        local rows = db:query("SELECT v FROM sp")
        assert.equal(1, #rows)
        assert.equal("outer", rows[1].v)
      end)
    end)

    it("keeps other tasks out until it ends", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE iso (v int)")
        local seen
        local t = db:transaction(function(tx)
          tx:query("INSERT INTO iso VALUES (1)")
          mg.spawn(function() seen = db:query("SELECT count(*) AS c FROM iso")[1].c end)
          mg.sleep(0.05)
          return "ok"
        end)
        assert.equal("ok", t)
        mg.sleep(0.05)
        assert.equal(1, seen)                       -- ran after COMMIT
      end)
    end)

    it("a finished transaction handle refuses more statements", function()
      run(function()
        local db = connect()
        local keep
        db:transaction(function(tx) keep = tx end)
        assert.has_error(function() keep:query("SELECT 1") end,
          "'query': the transaction is already finished")
      end)
    end)
  end)

  describe("statements sent ahead", function()
    -- a sequence moves outside any transaction: another connection sees
    -- when a statement has reached the server
    local function seq_value(other, name)
      return other:query("SELECT last_value, is_called FROM " .. name)[1]
    end

    it("tx:send goes to the server with the next statement, in order", function()
      run(function()
        local db, other = connect(), connect()
        db:exec("CREATE TABLE ahead (n int); CREATE SEQUENCE ahead_seq")
        local seen_before, seen_after
        local n = assert(db:transaction(function(tx)
          assert.is_true(tx:send("SELECT nextval('ahead_seq')"))
          assert.is_true(tx:send("INSERT INTO ahead VALUES ($1)", { 1 }))
          seen_before = seq_value(other, "ahead_seq").is_called
          local rows = assert(tx:query("SELECT count(*)::int AS c FROM ahead"))
          seen_after = seq_value(other, "ahead_seq").is_called
          tx:send("INSERT INTO ahead VALUES ($1)", { 2 })
          return rows[1].c
        end))
        assert.is_false(seen_before)        -- nothing sent before the query
        assert.is_true(seen_after)
        assert.equal(1, n)                  -- the query saw the insert sent ahead of it
        assert.same({ { n = 1 }, { n = 2 } }, db:query("SELECT n FROM ahead ORDER BY n"))
      end)
    end)

    it("tx:defer keeps a statement's rows: read with the next statement, in one round trip", function()
      run(function()
        local db, other = connect(), connect()
        db:exec("CREATE TABLE ahead_d (n int); INSERT INTO ahead_d VALUES (1), (2); CREATE SEQUENCE ahead_d_seq")
        local got = assert(db:transaction(function(tx)
          local first = assert(tx:defer("SELECT n, nextval('ahead_d_seq') AS s FROM ahead_d ORDER BY n"))
          local inserted = assert(tx:defer("INSERT INTO ahead_d VALUES ($1) RETURNING n", { 3 }))
          local sent_early = seq_value(other, "ahead_d_seq").is_called
          local count = assert(tx:query("SELECT count(*)::int AS c FROM ahead_d"))[1].c
          -- a later batch leaves what was kept alone
          assert(tx:send("INSERT INTO ahead_d VALUES (4)"))
          local later = assert(tx:defer("SELECT max(n) AS m FROM ahead_d"))
          local rows, n = first()
          local ins, in_n = inserted()
          local late = later()                -- not synced yet: result() does it
          local again, err = first()          -- taken once
          return { sent_early = sent_early, count = count, rows = rows, n = n, ins = ins, in_n = in_n,
                   late = late, again = again, err = err }
        end))
        assert.is_false(got.sent_early)
        assert.equal(3, got.count)
        assert.same({ { n = 1, s = 1 }, { n = 2, s = 2 } }, got.rows)
        assert.equal(2, got.n)
        assert.same({ { n = 3 } }, got.ins)
        assert.equal(1, got.in_n)
        assert.same({ { m = 4 } }, got.late)
        assert.is_nil(got.again)
        assert.matches("no rows kept", got.err)
        -- a deferred statement that fails fails the transaction
        local seen
        local ok, err = db:transaction(function(tx)
          local bad = assert(tx:defer("SELECT 1 / (n - n) AS x FROM ahead_d"))
          local rows, qerr = tx:query("SELECT 1 AS one")
          seen = { rows = rows, qerr = qerr, bad = table.pack(bad()) }
          return true
        end)
        assert.is_nil(ok)
        assert.matches("transaction rolled back", err)
        assert.is_nil(seen.rows)
        assert.matches("division by zero", seen.qerr)
        assert.is_nil(seen.bad[1])
      end)
    end)

    it("tx:commit_with_next: the next round trip carries the COMMIT", function()
      run(function()
        local db, other = connect(), connect()
        db:exec("CREATE TABLE cwn (n int PRIMARY KEY)")
        local pid = db:query("SELECT pg_backend_pid() AS p")[1].p
        local function outside_tx()   -- 1 when db's backend is idle, out of any transaction
          return other:query("SELECT count(*)::int AS c FROM pg_stat_activity WHERE pid = $1 AND state = 'idle'",
            { pid })[1].c
        end
        local seen = {}
        local got = { db:transaction(function(tx)
          local first = assert(tx:defer("SELECT 1 AS one"))
          assert(tx:send("INSERT INTO cwn VALUES (1)"))
          tx:commit_with_next()
          local rows = assert(tx:query("SELECT count(*)::int AS c FROM cwn"))
          -- committed by that round trip: another connection sees the row, and
          -- the backend is idle (outside any transaction)
          seen.visible = other:query("SELECT count(*)::int AS c FROM cwn")[1].c
          seen.idle = outside_tx()
          seen.first = first()
          seen.more = { pcall(tx.query, tx, "SELECT 2") }
          return rows[1].c, "second"
        end) }
        assert.same({ 1, "second" }, got)
        assert.equal(1, seen.visible)
        assert.equal(1, seen.idle)
        assert.same({ { one = 1 } }, seen.first)
        assert.is_false(seen.more[1])
        assert.matches("already finished", seen.more[2])
        -- through a deferred read
        got = { db:transaction(function(tx)
          local ins = assert(tx:defer("INSERT INTO cwn VALUES (2) RETURNING n"))
          tx:commit_with_next()
          local rows = assert(ins())
          seen.visible = other:query("SELECT count(*)::int AS c FROM cwn")[1].c
          return rows[1].n
        end) }
        assert.same({ 2 }, got)
        assert.equal(2, seen.visible)
        -- a statement of that round trip that fails rolls the whole back
        local ok, err = db:transaction(function(tx)
          assert(tx:send("INSERT INTO cwn VALUES (3)"))
          tx:commit_with_next()
          local rows, qerr = tx:query("INSERT INTO cwn VALUES (1)")   -- duplicate key
          seen.rows, seen.qerr = rows, qerr
          return true
        end)
        assert.is_nil(ok)
        assert.matches("rolled back", err)
        assert.is_nil(seen.rows)
        assert.matches("duplicate key", seen.qerr)
        assert.equal(2, db:query("SELECT count(*)::int AS c FROM cwn")[1].c)
        -- in a savepoint: the RELEASE goes with the round trip, the outer
        -- transaction goes on
        got = { db:transaction(function(tx)
          local inner = assert(tx:transaction(function(sp)
            assert(sp:send("INSERT INTO cwn VALUES (4)"))
            sp:commit_with_next()
            return sp:query("SELECT count(*)::int AS c FROM cwn")[1].c
          end))
          seen.visible = other:query("SELECT count(*)::int AS c FROM cwn")[1].c
          return inner, tx:query("SELECT count(*)::int AS c FROM cwn")[1].c
        end) }
        assert.same({ 3, 3 }, got)
        assert.equal(2, seen.visible)   -- not before the outer commit
        assert.equal(3, db:query("SELECT count(*)::int AS c FROM cwn")[1].c)
      end)
    end)

    it("a failing statement sent ahead fails the next query with its position and rolls back", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE ahead2 (v int PRIMARY KEY)")
        local qerr, qstate, qpos
        local ok, err = db:transaction(function(tx)
          tx:send("INSERT INTO ahead2 VALUES (1)")
          tx:send("INSERT INTO ahead2 VALUES (1)")   -- duplicate key
          tx:send("INSERT INTO ahead2 VALUES (2)")
          local rows
          rows, qerr, qstate, qpos = tx:query("SELECT 1 AS one")
          assert.is_nil(rows)
          return true
        end)
        assert.matches("duplicate key", qerr)
        assert.equal("23505", qstate)
        assert.equal(3, qpos)                -- BEGIN, the first insert, then this one
        assert.is_nil(ok)
        assert.matches("rolled back", err)
        assert.equal(0, db:query("SELECT count(*)::int AS c FROM ahead2")[1].c)
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)   -- usable
      end)
    end)

    it("a failing statement sent last fails the commit with its own message", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE ahead3 (v int CHECK (v > 0))")
        local ok, err = db:transaction(function(tx)
          tx:query("INSERT INTO ahead3 VALUES (1)")
          tx:send("INSERT INTO ahead3 VALUES (-1)")
          return "committed?"
        end)
        assert.is_nil(ok)
        assert.matches("violates check constraint", err)
        assert.equal(0, db:query("SELECT count(*)::int AS c FROM ahead3")[1].c)
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)   -- usable
      end)
    end)

    it("a bad parameter raises at tx:send and the transaction rolls back", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE ahead4 (v int)")
        local ok, err = db:transaction(function(tx)
          tx:query("INSERT INTO ahead4 VALUES (1)")
          tx:send("INSERT INTO ahead4 VALUES ($1)", { function() end })
        end)
        assert.is_nil(ok)
        assert.is_truthy(err:find("bad parameter $1", 1, true))
        assert.equal(0, db:query("SELECT count(*)::int AS c FROM ahead4")[1].c)
      end)
    end)

    it("a savepoint whose sent statement fails rolls back to itself; the outer commits", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE ahead5 (v text PRIMARY KEY)")
        assert(db:transaction(function(tx)
          tx:send("INSERT INTO ahead5 VALUES ('outer')")
          local ok, err = tx:transaction(function(inner)
            inner:send("INSERT INTO ahead5 VALUES ('inner')")
            inner:send("INSERT INTO ahead5 VALUES ('inner')")   -- fails at the release
            return true
          end)
          assert.is_nil(ok)
          assert.matches("duplicate key", err)
          return true
        end))
        assert.same({ { v = "outer" } }, db:query("SELECT v FROM ahead5"))
      end)
    end)

    it("statements sent ahead are prepared from their second use like queries", function()
      run(function()
        local db = connect()
        db:exec("CREATE TABLE ahead6 (v int)")
        for i = 1, 3 do
          assert(db:transaction(function(tx)
            assert(tx:send("INSERT INTO ahead6 VALUES ($1)", { i }))
            return true
          end))
        end
        local rows = db:query("SELECT statement FROM pg_prepared_statements")
        local found = false
        for _, r in ipairs(rows) do
          if r.statement:find("INSERT INTO ahead6", 1, true) then found = true end
        end
        assert.is_true(found)
        assert.same({ { v = 1 }, { v = 2 }, { v = 3 } }, db:query("SELECT v FROM ahead6 ORDER BY v"))
      end)
    end)

    it("on a connection: send and sync, and a batch left without its sync closes it", function()
      run(function()
        local raw = assert(require("moongraph.core").pg.connect(url))
        assert.is_true(raw:send("SELECT $1::int AS a", { 1 }))
        assert.is_true(raw:send("SELECT $1::int AS b", { 2 }))
        assert.equal(2, raw:pending())
        local rows = assert(raw:sync())
        assert.same({ { b = 2 } }, rows)            -- the last statement's rows
        assert.equal(0, raw:pending())
        assert.has_error(function() raw:sync() end, "pg: sync without a statement sent")
        raw:send("SELECT 1")
        local r, err = raw:query("SELECT 2")
        assert.is_nil(r)
        assert.matches("a batch was left without its sync", err)
        assert.is_false(raw:ok())
      end)
    end)
  end)

  describe("prepared statements", function()
    local function prepared(db)
      local rows = assert(db:query("SELECT statement FROM pg_prepared_statements ORDER BY name"))
      local list = {}
      for i, r in ipairs(rows) do list[i] = r.statement end
      return list
    end

    it("prepares a statement on its second use per parameter types and runs it by name after", function()
      run(function()
        local db = connect()
        local sql = "SELECT $1::text AS v, $2::int8 AS n"
        for i = 1, 4 do
          local rows = assert(db:query(sql, { "x" .. i, i }))
          assert.same({ v = "x" .. i, n = i }, rows[1])
        end
        assert.same({ sql }, prepared(db))
        -- other parameter types: another statement (bytes not UTF-8 go as bytea)
        local q = "SELECT length($1) AS n"
        assert.equal(3, assert(db:query(q, { "abc" }))[1].n)
        assert.equal(2, assert(db:query(q, { pg.bytea("\0\255") }))[1].n)
        assert.equal(2, assert(db:query(q, { "\255\254" }))[1].n)
        assert.equal(3, assert(db:query(q, { "xyz" }))[1].n)
        assert.equal(4, assert(db:query(q, { "wxyz" }))[1].n)
        local of_q = 0
        for _, st in ipairs(prepared(db)) do if st == q then of_q = of_q + 1 end end
        assert.equal(2, of_q)
        -- NULLs as holes
        local rows = assert(db:query("SELECT $1::int AS a, $2::int AS b", { n = 2, nil, 5 }))
        rows = assert(db:query("SELECT $1::int AS a, $2::int AS b", { n = 2, nil, 6 }))
        rows = assert(db:query("SELECT $1::int AS a, $2::int AS b", { n = 2, nil, 7 }))
        assert.equal(null, rows[1].a)
        assert.equal(7, rows[1].b)
      end)
    end)

    it("a failing statement fails the same way every time; the connection stays usable", function()
      run(function()
        local db = connect()
        for _ = 1, 3 do
          local rows, err, state = db:query("SELECT nope FROM pg_class WHERE oid = $1", { 1 })
          assert.is_nil(rows)
          assert.matches("column \"nope\" does not exist", err, 1, true)
          assert.equal("42703", state)
        end
        assert.equal(1, assert(db:query("SELECT 1 AS one"))[1].one)
        -- inside a transaction that already failed
        local _, terr = db:transaction(function(tx)
          tx:query("SELECT 1/0")
          local r, e = tx:query("SELECT $1::int AS v", { 1 })
          assert.is_nil(r)
          assert.matches("current transaction is aborted", e, 1, true)
          return true
        end)
        assert.matches("rolled back", terr, 1, true)
        for i = 1, 3 do assert.equal(i, assert(db:query("SELECT $1::int AS v", { i }))[1].v) end
      end)
    end)

    it("a table that changes shape under a prepared statement fails it once, then it runs unprepared", function()
      run(function()
        local db = connect()
        assert(db:exec("CREATE TABLE shape (a int); INSERT INTO shape VALUES (1)"))
        local sql = "SELECT * FROM shape WHERE a = $1"
        for _ = 1, 3 do assert.same({ { a = 1 } }, assert(db:query(sql, { 1 }))) end
        assert(db:exec("ALTER TABLE shape ADD COLUMN b int DEFAULT 2"))
        local rows, _, state = db:query(sql, { 1 })
        if rows == nil then assert.equal("0A000", state) end
        for _ = 1, 3 do assert.same({ { a = 1, b = 2 } }, assert(db:query(sql, { 1 }))) end
      end)
    end)
  end)

  describe("timeouts and cancellation", function()
    it("applies the statement timeout and stays usable", function()
      run(function()
        local db = connect{ statement_timeout = 0.1 }
        local rows, err, state = db:query("SELECT pg_sleep(2)")
        assert.is_nil(rows)
        assert.matches("statement timeout", err)
        assert.equal("57014", state)
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)
      end)
    end)

    it("cancelling a task stops its statement on the server", function()
      run(function()
        local db = connect()
        local watcher = connect()
        local function running()
          return assert(watcher:query([[SELECT count(*) AS c FROM pg_stat_activity
            WHERE query LIKE '%marker-cancel%' AND pid <> pg_backend_pid() AND state = 'active']]))[1].c
        end
        local t = mg.spawn(function() return db:query("SELECT pg_sleep(30), 'marker-cancel'") end)
        -- the statement runs on the server before it is cancelled (a bounded poll)
        local n = 0
        for _ = 1, 500 do
          n = running()
          if n == 1 then break end
          mg.sleep(0.01)
        end
        assert.equal(1, n)
        assert.is_true(t:cancel())
        local ok, err = t:join()
        assert.is_false(ok)
        assert.equal("cancelled", err)
        -- the cancel request reaches the backend; poll for it with a bound
        for _ = 1, 100 do
          n = running()
          if n == 0 then break end
          mg.sleep(0.02)
        end
        assert.equal(0, n)
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)
      end)
    end)

    it("reports a refused connection without hanging", function()
      local db, err = run(function() return pg.connect("postgresql://postgres@127.0.0.1:1/x") end)
      assert.is_nil(db)
      assert.matches("^pg: cannot connect", err)
      db, err = run(function() return pg.connect("postgresql://host/db?nonsense=1") end)
      assert.is_nil(db)
      assert.matches("nonsense", err)
    end)

    it("cannot be used outside a task", function()
      local db = run(function() return connect() end)
      local ok, err = pcall(db.query, db, "SELECT 1")
      assert.is_false(ok)
      assert.matches("not inside a moongraph task", err)
    end)
  end)

  describe("pools", function()
    it("serves 64 tasks through 8 connections", function()
      run(function()
        local p = pg.pool(url, { size = 8 })
        local pids, fns = {}, {}
        for i = 1, 64 do
          fns[i] = function()
            local r = assert(p:query("SELECT pg_backend_pid() AS pid, $1::int * 2 AS v", { i }))[1]
            pids[r.pid] = true
            return r.v
          end
        end
        local res = mg.gather(fns)
        for i = 1, 64 do assert.equal(2 * i, res[i].value) end
        local n = 0
        for _ in pairs(pids) do n = n + 1 end
        assert.is_true(n >= 1 and n <= 8)
        p:close()
      end)
    end)

    it("serves waiting tasks in arrival order", function()
      run(function()
        local p = pg.pool(url, { size = 1 })
        local order, tasks = {}, {}
        tasks[1] = mg.spawn(function() assert(p:query("SELECT pg_sleep(0.05)")); order[#order + 1] = 1 end)
        for i = 2, 6 do
          tasks[i] = mg.spawn(function() assert(p:query("SELECT 1")); order[#order + 1] = i end)
        end
        for i = 1, 6 do assert(tasks[i]:join()) end
        assert.same({ 1, 2, 3, 4, 5, 6 }, order)
      end)
    end)

    it("passes a turn on when a waiting task is cancelled", function()
      run(function()
        local p = pg.pool(url, { size = 1 })
        local holder = mg.spawn(function() return p:query("SELECT pg_sleep(0.05)") end)
        mg.sleep(0)
        local quitter = mg.spawn(function() return p:query("SELECT 'never'") end)
        local after = mg.spawn(function() return p:query("SELECT 'after' AS v") end)
        mg.sleep(0)
        quitter:cancel()
        local hok, hrows = holder:join()
        assert.is_true(hok)
        assert.is_table(hrows)
        local ok, rows = after:join()
        assert.is_true(ok)
        assert.equal("after", rows[1].v)
      end)
    end)

    it("gives up waiting after acquire_timeout", function()
      run(function()
        local p = pg.pool(url, { size = 1, acquire_timeout = 0.02 })
        local holder = mg.spawn(function() return p:query("SELECT pg_sleep(0.2)") end)
        mg.sleep(0)
        local rows, err = p:query("SELECT 1")
        assert.is_nil(rows)
        assert.matches("no connection free", err)
        holder:join()
      end)
    end)

    it("runs transactions on one of its connections", function()
      run(function()
        local p = pg.pool(url, { size = 2 })
        p:exec("CREATE TABLE pt (v int)")
        assert.equal("ok", p:transaction(function(tx)
          tx:query("INSERT INTO pt VALUES (1)")
          return "ok"
        end))
        assert.is_nil((p:transaction(function(tx)
          tx:query("INSERT INTO pt VALUES (2)")
          error("no")
        end)))
        assert.equal(1, p:query("SELECT count(*) AS c FROM pt")[1].c)
      end)
    end)
  end)

  describe("server restarts", function()
    it("reconnects after a restart", function()
      run(function()
        local db = connect()
        local p = pg.pool(url, { size = 2 })
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)
        assert.equal(1, p:query("SELECT 1 AS one")[1].one)
        srv:restart()
        assert.equal(2, db:query("SELECT 2 AS two")[1].two)
        assert.equal(2, p:query("SELECT 2 AS two")[1].two)
      end)
    end)

    it("notices a connection the server closed while it was idle, without a statement", function()
      run(function()
        local db = connect()
        local p = pg.pool(url, { size = 1 })
        local pid = p:query("SELECT pg_backend_pid() AS pid")[1].pid
        local victim = assert(require("moongraph.core").pg.connect(url))
        local vpid = victim:query("SELECT pg_backend_pid() AS pid")[1].pid
        assert(db:query("SELECT pg_terminate_backend($1::int), pg_terminate_backend($2::int)", { pid, vpid }))
        -- the loop runs meanwhile: an idle connection reads the server's
        -- goodbye when it comes and closes; the pool opens a new one
        mg.sleep(0.2)
        assert.is_false(victim:ok())
        local rows, err = victim:query("SELECT 1")
        assert.is_nil(rows)
        assert.matches("connection lost", err)
        assert.are_not.equal(pid, p:query("SELECT pg_backend_pid() AS pid")[1].pid)
      end)
    end)

    it("fails clearly while the server is down and recovers", function()
      run(function()
        local db = connect()
        srv:stop()
        local rows, err = db:query("SELECT 1")
        assert.is_nil(rows)
        assert.matches("^pg: ", err)
        srv:start()
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)
      end)
    end)

    it("a pool busy through crashes of the server leaves no statement waiting for ever", function()
      -- restarts run from another process (a fork while the pool's sockets
      -- come and go): an error event of a socket a child still holds made
      -- libuv stop the watch of a live connection's new socket of that number
      run(function()
        local p = pg.pool(url, { size = 2 })
        local stop, done, since = false, 0, {}
        local function busy(n)
          while not stop do
            since[n] = mg.now()
            local ok = p:transaction(function(tx)
              assert(tx:send("SELECT 1"))
              local rows, err = tx:query("SELECT pg_sleep(0.002), $1::text AS x", { string.rep("x", 2000 * n) })
              if not rows then error(err, 0) end
              return true
            end)
            since[n] = nil
            if ok then done = done + 1 else mg.sleep(0.02) end
          end
        end
        local tasks = {}
        for n = 1, 8 do tasks[n] = mg.spawn(busy, n) end
        local flag = os.tmpname()
        for _ = 1, 6 do
          mg.sleep(0.3)
          os.remove(flag)
          os.execute("(env -u LD_PRELOAD " .. servers.script .. " restart " .. srv.dir .. " immediate >/dev/null 2>&1; touch "
            .. flag .. ") &")
          local t0 = mg.now()
          while not io.open(flag) and mg.now() - t0 < 30 do mg.sleep(0.05) end
          mg.sleep(0.5)
        end
        os.remove(flag)
        stop = true
        -- every task ends its transaction (a statement of a crashed server
        -- fails at once, one of the restarted server answers)
        local t0 = mg.now()
        local left = #tasks
        while left > 0 and mg.now() - t0 < 10 do
          mg.sleep(0.1)
          left = 0
          for _, t in ipairs(tasks) do if not t:done() then left = left + 1 end end
        end
        for _, t in ipairs(tasks) do if not t:done() then t:cancel() end end
        assert.equal(0, left, "tasks still waiting on a statement")
        assert.is_true(done > 0)
        assert.equal(1, p:query("SELECT 1 AS one")[1].one)
      end)
    end)

    it("a statement running when the server crashes fails; the next one works", function()
      run(function()
        local db = connect()
        local t = mg.spawn(function() return db:query("SELECT pg_sleep(10)") end)
        mg.sleep(0.05)
        srv:restart("immediate")
        local ok, rows, err = t:join()
        assert.is_true(ok)
        assert.is_nil(rows)
        assert.matches("^pg: ", err)
        assert.equal(1, db:query("SELECT 1 AS one")[1].one)
      end)
    end)
  end)
end)
