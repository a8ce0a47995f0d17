-- The worker's Postgres schema against a real PostgreSQL: versioned
-- migrations in scopes (the worker's and the scripts'), the upgrade of a
-- database made before scopes, and job results stored once.
local mg = require "moongraph"
local pg = require "moongraph.pg"
local servers = require "servers"
local migrations = require "moongraph.worker.migrations"
local results = require "moongraph.worker.results"

local psrv, n = nil, 0

local function fresh_db()
  n = n + 1
  return psrv:create_database("mig" .. n), "mig" .. n
end

local function read(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("a")
  f:close()
  return s
end

local APP = { { version = 1, name = "notes", sql = "CREATE TABLE app_notes (id text PRIMARY KEY)" } }

local function recorded(db, tbl)
  local rows = assert(db:query("SELECT scope, version FROM " .. (tbl or "moongraph_schema") .. " ORDER BY scope, version"))
  local out = {}
  for i, r in ipairs(rows) do out[i] = r.scope .. ":" .. r.version end
  return out
end

describe("worker migrations", function()
  setup(function() psrv = servers.postgres() end)
  teardown(function() if psrv then psrv:destroy() end end)

  it("applies the migrations once, also when workers start together", function()
    local url = fresh_db()
    local scopes = { { scope = "app", list = APP } }
    local a, b, again, cur, rec = mg.run(function()
      local t1 = mg.spawn(function() return migrations.migrate(assert(pg.connect(url)), scopes) end)
      local t2 = mg.spawn(function() return migrations.migrate(assert(pg.connect(url)), scopes) end)
      local _, x = assert(t1:join())
      local _, y = assert(t2:join())
      local db = assert(pg.connect(url))
      return assert(x), assert(y), assert(migrations.migrate(db, scopes)), migrations.current(db), recorded(db)
    end)
    assert.equal(#migrations.list + #APP, #a + #b)          -- one of them did the work
    assert.same({}, again)
    assert.equal(migrations.list[#migrations.list].version, cur)
    assert.same({ "app:1", "worker:1", "worker:3", "worker:4", "worker:5", "worker:6", "worker:7" }, rec)
  end)

  it("keeps each script's versions in its own scope, and applies only what is new", function()
    local url = fresh_db()
    local first, second, cur = mg.run(function()
      local db = assert(pg.connect(url))
      local x = assert(migrations.migrate(db, { { scope = "app", list = APP } }))
      local more = { APP[1], { version = 2, name = "tags", sql = "ALTER TABLE app_notes ADD COLUMN tag text" } }
      local y = assert(migrations.migrate(db, { { scope = "app", list = more } }))
      assert(db:query("INSERT INTO app_notes (id, tag) VALUES ('n', 't')"))
      return x, y, migrations.current(db, "app")
    end)
    assert.same({ { scope = "worker", version = 1, name = "job results" },
                  { scope = "worker", version = 3, name = "thread fences" },
                  { scope = "worker", version = 4, name = "job results keep the state's JSON text" },
                  { scope = "worker", version = 5, name = "a refused job result rolls its transaction back" },
                  { scope = "worker", version = 6, name = "thread fences count the thread's results" },
                  { scope = "worker", version = 7, name = "a refused job result says why in its SQLSTATE" },
                  { scope = "app", version = 1, name = "notes" } }, first)
    assert.same({ { scope = "app", version = 2, name = "tags" } }, second)
    assert.equal(2, cur)
  end)

  it("stores a job's final state as the worker wrote it: floats stay floats", function()
    local url = fresh_db()
    local row = mg.run(function()
      local db = assert(pg.connect(url))
      assert(migrations.migrate(db, {}))
      local results = require "moongraph.worker.results"
      assert(results.commit(db, { job_id = "j-float", thread_id = "t-float", status = "done",
        state = { f = 1e15, g = 2.0, i = 7, big = 1e300 } }))
      -- compressed with lz4 wherever the server has it
      local rows = assert(db:query([[SELECT attcompression::text AS c FROM pg_attribute
        WHERE attrelid = 'job_results'::regclass AND attname = 'state']]))
      if db:exec("SET default_toast_compression = lz4") then assert.equal("l", rows[1].c) end
      return assert(results.get(db, "j-float"))
    end)
    assert.equal("float", math.type(row.state.f)); assert.equal(1e15, row.state.f)
    assert.equal("float", math.type(row.state.g))
    assert.equal("integer", math.type(row.state.i))
    assert.equal(1e300, row.state.big)
  end)

  it("rolls everything back when a migration fails, and names it", function()
    local url = fresh_db()
    local ok, err, permanent, rec = mg.run(function()
      local db = assert(pg.connect(url))
      local o, e, p = migrations.migrate(db, { { scope = "app", list = {
        { version = 1, name = "broken", sql = "CREATE TABLE nope (" } } } })
      return o, e, p, migrations.current(db)
    end)
    assert.is_nil(ok)
    assert.matches("migration 1 %(broken%) of scope 'app' failed: .*syntax error", err)
    assert.is_true(permanent)   -- the SQL, not the connection: no use trying again
    assert.equal(0, rec)        -- not even the worker's own went in
  end)

  it("upgrades a database made before scopes: versions kept, nothing applied twice", function()
    local url, name = fresh_db()
    psrv:psql(read("spec/fixtures/worker_schema_v2.sql"), name)
    local memory = require "scripts.eco.memory"
    local applied, unknown, rec, rows = mg.run(function()
      local db = assert(pg.connect(url))
      local x, u = assert(migrations.migrate(db, { { scope = "eco", list = memory.migrations } }))
      -- a second start finds nothing to do
      local again = assert(migrations.migrate(db, { { scope = "eco", list = memory.migrations } }))
      assert.same({}, again)
      local r = assert(db:query("SELECT count(*)::int AS n FROM messages WHERE thread_id = 'old-conv'"))
      -- eco:3 took the messages' foreign key away, and kept the rows
      local fk = assert(db:query("SELECT count(*)::int AS n FROM pg_constraint WHERE conrelid = 'messages'::regclass AND contype = 'f'"))
      assert.equal(0, fk[1].n)
      -- a result stored before the upgrade reads back the same
      local old = assert(require("moongraph.worker.results").get(db, "old-j1"))
      assert.same({ intent = "waste", turn = 1 }, old.state)
      -- the table of earlier versions is kept in step with the new one
      -- (the Store's scope, which Eco² migration 2 brought in, has its own)
      local kept = {}
      for _, v in ipairs(recorded(db)) do
        if not v:find("^store:") then kept[#kept + 1] = v end
      end
      assert.same(kept, recorded(db, "moongraph_worker_migrations"))
      return x, u, recorded(db), r[1].n
    end)
    local prof = mg.run(function()
      return require("scripts.eco.profile").get(mg.store.postgres(assert(pg.connect(url))), "old-user")
    end)
    -- the Eco² tables were there: its migration 1 is recorded, the data
    -- kept; the worker's thread fences are new
    assert.same({ { scope = "worker", version = 3, name = "thread fences" },
                  { scope = "worker", version = 4, name = "job results keep the state's JSON text" },
                  { scope = "worker", version = 5, name = "a refused job result rolls its transaction back" },
                  { scope = "worker", version = 6, name = "thread fences count the thread's results" },
                  { scope = "worker", version = 7, name = "a refused job result says why in its SQLSTATE" },
                  { scope = "eco", version = 1, name = "conversation memory and user profiles" },
                  { scope = "eco", version = 2, name = "user profiles in the Store" },
                  { scope = "eco", version = 3, name = "messages without a foreign key" } }, applied)
    assert.same({}, unknown)                 -- worker:2 is retired, not unknown
    -- one record table for every scope: the Store's, set up by Eco² migration 2, too
    assert.same({ "eco:1", "eco:2", "eco:3", "store:1", "store:2", "worker:1", "worker:2", "worker:3", "worker:4",
                  "worker:5", "worker:6", "worker:7" }, rec)
    assert.equal(2, rows)
    -- the old profile row, now in the Store
    assert.same({ last_location = "서울특별시 강남구", last_intent = "waste", intents = { waste = 1 }, turns = 1 }, prof)
    -- the record table is keyed by scope and version now
    local pk = psrv:psql([[
SELECT string_agg(a.attname, ',' ORDER BY a.attname) FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = 'moongraph_worker_migrations'::regclass AND i.indisprimary]], name)
    assert.equal("scope,version", pk)
  end)

  it("runs a Lua step with the migration's transaction: its failure rolls the whole migration back", function()
    local url = fresh_db()
    local steps = function(fail)
      return { { scope = "app", list = {
        { version = 1, name = "table", sql = "CREATE TABLE app_t (n int)" },
        { version = 2, name = "rows", run = function(tx)
          assert(tx:query("INSERT INTO app_t VALUES (1), (2)"))
          if fail then return nil, "the copy failed" end
          return true
        end } } } }
    end
    local failed, err, n, applied = mg.run(function()
      local db = assert(pg.connect(url))
      local a, e = migrations.migrate(db, steps(true))
      local t = assert(db:query("SELECT to_regclass('app_t')::text AS t"))[1].t
      local ok = assert(migrations.migrate(db, steps(false)))
      return a, e, { t == pg.null, assert(db:query("SELECT count(*)::int AS n FROM app_t"))[1].n }, ok
    end)
    assert.is_nil(failed)
    assert.matches("migration 2 %(rows%) of scope 'app' failed: the copy failed", err)
    assert.same({ true, 2 }, n)              -- nothing of the failed run stayed
    local app = {}
    for _, m in ipairs(applied) do if m.scope == "app" then app[#app + 1] = m.version end end
    assert.same({ 1, 2 }, app)               -- the failed run recorded nothing
  end)

  it("refuses a step with both sql and run, or a run that is not a function", function()
    local ok, err = migrations.check("app", { { version = 1, name = "x", sql = "SELECT 1", run = function() end } })
    assert.is_nil(ok)
    assert.matches("give sql or run, not both", err)
    ok, err = migrations.check("app", { { version = 1, name = "x", run = "SELECT 1" } })
    assert.is_nil(ok)
    assert.matches("run must be a function", err)
  end)

  it("leaves recorded versions it does not list alone, and reports them", function()
    local url = fresh_db()
    local unknown, again = mg.run(function()
      local db = assert(pg.connect(url))
      assert(migrations.migrate(db))
      assert(db:query("INSERT INTO moongraph_schema (scope, version, name) VALUES ('worker', 9, 'from a newer worker')"))
      local _, u = assert(migrations.migrate(db))
      return u, assert(migrations.migrate(db))
    end)
    assert.same({ { scope = "worker", version = 9, name = "from a newer worker" } }, unknown)
    assert.same({}, again)
  end)

  it("refuses a scope given twice", function()
    local url = fresh_db()
    local ok, err = mg.run(function()
      return migrations.migrate(assert(pg.connect(url)), { { scope = "a", list = APP }, { scope = "a", list = APP } })
    end)
    assert.is_nil(ok)
    assert.matches("scope 'a' given twice", err)
  end)

  it("stores a result once; a second commit returns the first", function()
    local url = fresh_db()
    local first, second, recorded_n = mg.run(function()
      local db = assert(pg.connect(url))
      assert(migrations.migrate(db))
      local calls = 0
      local also = function() calls = calls + 1 return true end
      local row = { job_id = "j1", thread_id = "t1", user_id = "u1", status = "done",
                    answer = "first", state = { intent = "waste", n = 2, f = 0.5 } }
      local i1, r1 = results.commit(db, row, also)
      local i2, r2 = results.commit(db, { job_id = "j1", thread_id = "t1", status = "done", answer = "second" }, also)
      return { i1, r1.answer }, { i2, r2.answer, r2.state }, calls
    end)
    assert.same({ true, "first" }, first)
    assert.same({ false, "first", { intent = "waste", n = 2, f = 0.5 } }, second)
    assert.equal(1, recorded_n)
  end)

  it("rolls the result back when the work done with it fails", function()
    local url = fresh_db()
    local ok, err, row, get_err = mg.run(function()
      local db = assert(pg.connect(url))
      assert(migrations.migrate(db))
      local o, e = results.commit(db, { job_id = "j2", thread_id = "t", status = "done", answer = "a" },
        function() return nil, "hook said no" end)
      return o, e, results.get(db, "j2")
    end)
    assert.is_nil(ok)
    assert.matches("hook said no", err)
    assert.is_nil(get_err)      -- the table was read, and
    assert.is_nil(row)          -- holds no row for the job
  end)
end)
