-- One migrations mechanism (moongraph.migrations) for every schema the
-- runtime keeps in Postgres, against a real PostgreSQL: one record table
-- and one lock, and databases laid out by earlier versions (a record table
-- per mechanism) taken over in place.
local mg = require "moongraph"
local pg = require "moongraph.pg"
local servers = require "servers"
local migrations = require "moongraph.migrations"
local checkpoints = require "moongraph.checkpoint.postgres"
local pstore = require "moongraph.store.postgres"
local worker_migrations = require "moongraph.worker.migrations"
local chat = require "moongraph.api.chat_distributed"
local langgraph = require "moongraph.worker.langgraph"

local psrv, n = nil, 0

local function fresh_db()
  n = n + 1
  return psrv:create_database("schema" .. n)
end

local function scopes_of(db)
  local rows = assert(db:query("SELECT scope, count(*)::int AS n FROM moongraph_schema GROUP BY scope ORDER BY scope"))
  local out = {}
  for _, r in ipairs(rows) do out[r.scope] = r.n end
  return out
end

local function exists(db, name)
  return assert(db:query("SELECT to_regclass($1) IS NOT NULL AS t", { name }))[1].t
end

describe("moongraph.migrations", function()
  setup(function() psrv = servers.postgres() end)
  teardown(function() if psrv then psrv:destroy() end end)

  it("records every schema's steps in one table, and no table of the earlier kind", function()
    local url = fresh_db()
    mg.run(function()
      local db = assert(pg.connect(url))
      assert(checkpoints.migrate(db))
      assert(pstore.migrate(db))
      assert(worker_migrations.migrate(db))
      assert(migrations.migrate(db, { { scope = "chat", list = chat.migrations },
                                      { scope = "langgraph", list = langgraph.migrations } }))
      assert.same({ checkpoint = #checkpoints.migrations, store = #pstore.migrations,
                    worker = #worker_migrations.list, chat = #chat.migrations, langgraph = #langgraph.migrations }, scopes_of(db))
      for _, l in ipairs(migrations.LEGACY) do assert.is_false(exists(db, l.table), l.table) end
      assert.equal(checkpoints.migrations[#checkpoints.migrations].version, migrations.current(db, "checkpoint"))
      assert.is_true(migrations.applied_all(db, "store", pstore.migrations))
      assert.equal(0, migrations.current(db, "nothing"))
    end)
  end)

  it("takes over a database laid out by earlier versions, applying only what is new", function()
    local url = fresh_db()
    mg.run(function()
      local db = assert(pg.connect(url))
      -- as earlier versions left it: the saver's three steps and the
      -- Store's, each recorded in a table of its own
      assert(db:exec([[
        CREATE TABLE moongraph_migrations (version integer PRIMARY KEY, name text NOT NULL,
          applied_at timestamptz NOT NULL DEFAULT now());
        CREATE TABLE moongraph_store_migrations (version integer PRIMARY KEY, name text NOT NULL,
          applied_at timestamptz NOT NULL DEFAULT now());]]))
      for i = 1, 3 do
        local m = checkpoints.migrations[i]
        assert(db:exec(m.sql))
        assert(db:query("INSERT INTO moongraph_migrations (version, name) VALUES ($1, $2)", { m.version, m.name }))
      end
      for _, m in ipairs(pstore.migrations) do
        assert(db:exec(m.sql))
        assert(db:query("INSERT INTO moongraph_store_migrations (version, name) VALUES ($1, $2)", { m.version, m.name }))
      end
      -- (before this version's first call, read from the old table)
      assert.equal(pstore.migrations[#pstore.migrations].version, migrations.current(db, "store"))
      -- this version: only the saver's fourth step is new
      assert.equal(#checkpoints.migrations - 3, checkpoints.migrate(db))
      assert.equal(0, pstore.migrate(db))
      assert.same({ checkpoint = #checkpoints.migrations, store = #pstore.migrations }, scopes_of(db))
      -- the old tables are kept in step, for an earlier version still running beside this one
      local old = assert(db:query("SELECT max(version)::int AS v FROM moongraph_migrations"))[1].v
      assert.equal(checkpoints.migrations[#checkpoints.migrations].version, old)
      -- and the schema works: a conflict has its own SQLSTATE now (step 4)
      local s = checkpoints.new(db)
      local c1 = assert(s:put({ thread_id = "t" }, { v = 1, id = "0001", step = 0, values = {}, next = {} }, {}))
      assert(s:put(c1, { v = 1, id = "0002", step = 1, values = {}, next = {} }, {}))
      local r, err = s:put(c1, { v = 1, id = "0003", step = 1, values = {}, next = {} }, {})
      assert.is_nil(r)
      assert.equal("conflict", err.code)
    end)
  end)

  it("reports unknown versions of the scopes it is given only", function()
    local url = fresh_db()
    local unknown = mg.run(function()
      local db = assert(pg.connect(url))
      assert(checkpoints.migrate(db))
      local list = { { version = 1, name = "one", sql = "CREATE TABLE one_t (a int)" } }
      assert(migrations.migrate(db, { { scope = "app", list = list } }))
      assert(db:query("INSERT INTO moongraph_schema (scope, version, name) VALUES ('app', 7, 'from a newer app')"))
      local _, u = assert(migrations.migrate(db, { { scope = "app", list = list } }))
      return u
    end)
    assert.same({ { scope = "app", version = 7, name = "from a newer app" } }, unknown)
  end)

  it("rolls a failed call back entirely, saying the step's SQL is at fault", function()
    local url = fresh_db()
    local applied, err, permanent, left = mg.run(function()
      local db = assert(pg.connect(url))
      local a, e, p = migrations.migrate(db, { { scope = "app", list = {
        { version = 1, name = "good", sql = "CREATE TABLE good_t (a int)" },
        { version = 2, name = "bad", sql = "CREATE TABLE broken (" } } } })
      return a, e, p, migrations.current(db, "app")
    end)
    assert.is_nil(applied)
    assert.matches("migration 2 %(bad%) of scope 'app' failed", err)
    assert.equal("pg:42601", err.code)
    assert.is_true(permanent)
    assert.equal(0, left)
  end)

  it("applies each step once when processes start together", function()
    local url = fresh_db()
    local counts = mg.run(function()
      local list = { { version = 1, name = "t", sql = "CREATE TABLE together_t (a int)" } }
      local tasks = {}
      for i = 1, 4 do
        tasks[i] = mg.spawn(function()
          local db = assert(pg.connect(url))
          local a = assert(migrations.migrate(db, { { scope = "app", list = list },
            { scope = "checkpoint", list = checkpoints.migrations } }))
          db:close()
          return #a
        end)
      end
      local out = {}
      for i = 1, 4 do
        local _, c = assert(tasks[i]:join())
        out[i] = c
      end
      table.sort(out)
      return out
    end)
    assert.same({ 0, 0, 0, 1 + #checkpoints.migrations }, counts)
  end)

  it("refuses a malformed list before it touches the database", function()
    local ok, err, permanent = migrations.migrate({}, { { scope = "bad scope!", list = {} } })
    assert.is_nil(ok)
    assert.matches("migration scope must be", err)
    assert.is_true(permanent)
  end)
end)
