-- moongraph.migrations — versioned Postgres schemas, one mechanism for all:
-- the checkpoint saver's, the Store's, the worker's, the service APIs' and
-- those of the scripts a worker runs.
--
--   local migrations = require "moongraph.migrations"
--   local applied, unknown = migrations.migrate(db, {
--     { scope = "app", list = { { version = 1, name = "notes", sql = "CREATE TABLE ..." } } },
--   })
--   -- applied: { {scope=, version=, name=}, ... } newly applied
--   -- unknown: versions recorded under these scopes that no list names
--   --          (applied by a newer version)
--   -- nil, err, permanent: permanent when a migration's SQL itself failed
--   --          (trying again will not help), not the connection
--   migrations.check(scope, list [, retired]) -> true | nil, err
--   migrations.current(db, scope) -> highest recorded version (0: none)
--
-- An entry is { version, name, sql } or { version, name, run = function(tx)
-- -> true | nil, err } (Lua that migrates data through the transaction).
-- A scope is a namespace of versions. Each call runs in one transaction
-- under one advisory lock: processes that start together apply the steps
-- one at a time (the others wait, then find nothing left to do); every
-- step is recorded in moongraph_schema (scope, version, name, applied_at).
-- A schema change is a new entry at the end of its list; applied entries
-- are never edited.
--
-- Earlier versions kept three record tables of their own, each under its
-- own lock: moongraph_migrations (the checkpoint saver: scope
-- "checkpoint"), moongraph_store_migrations ("store") and
-- moongraph_worker_migrations (the worker's and the scripts' scopes). Where
-- one exists its records are taken over, its lock is taken too and new
-- steps of its scopes are recorded in it as well, so an earlier version
-- running beside this one (a rolling upgrade) sees what was applied.

local errors = require "moongraph.errors"

local ipairs, pairs, pcall, tostring, type, error = ipairs, pairs, pcall, tostring, type, error
local math_type, format = math.type, string.format

local _M = {}

_M.TABLE = "moongraph_schema"

-- "mgschema" as a big-endian int8
_M.LOCK_KEY = string.unpack(">i8", "mgschema")

-- The record tables of earlier versions: the scopes they hold and their
-- locks (taken in this order after LOCK_KEY).
local LEGACY = {
  { table = "moongraph_migrations", scope = "checkpoint", lock = string.unpack(">i8", "moongrap") },
  { table = "moongraph_store_migrations", scope = "store", lock = string.unpack(">i8", "mgstore1") },
  -- every scope but the two above (its own column)
  { table = "moongraph_worker_migrations", scoped = true, lock = 0x6d67776b },
}
_M.LEGACY = LEGACY

local function legacy_of(scope)
  for _, l in ipairs(LEGACY) do
    if l.scope == scope then return l end
  end
  return LEGACY[#LEGACY]
end

local CREATE = [[
CREATE TABLE IF NOT EXISTS moongraph_schema (
  scope      text NOT NULL,
  version    integer NOT NULL,
  name       text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope, version)
)]]

-- moongraph_worker_migrations from before it had a scope column (then
-- every recorded version was the worker's)
local WORKER_TABLE_UPGRADE = [[
ALTER TABLE moongraph_worker_migrations ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'worker';
DO $$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM pg_index i
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
    WHERE i.indrelid = 'moongraph_worker_migrations'::regclass AND i.indisprimary
      AND a.attname = 'scope') THEN
    ALTER TABLE moongraph_worker_migrations DROP CONSTRAINT IF EXISTS moongraph_worker_migrations_pkey;
    ALTER TABLE moongraph_worker_migrations ADD PRIMARY KEY (scope, version);
  END IF;
END $$;
]]

local SCOPE_NAME = "^[%w_%-%.]+$"

-- check(scope, list [, retired]) -> true | nil, err: versions are positive
-- integers, increasing, none of the retired ones; each entry has a name
-- and SQL text or a run function.
function _M.check(scope, list, retired)
  if type(scope) ~= "string" or not scope:match(SCOPE_NAME) or #scope > 100 then
    return nil, "migration scope must be 1..100 letters, digits or _ - . (got " .. tostring(scope) .. ")"
  end
  if type(list) ~= "table" then return nil, "migrations of scope '" .. scope .. "' must be a list" end
  local last = 0
  for i, m in ipairs(list) do
    local where = format("migration #%d of scope '%s'", i, scope)
    if type(m) ~= "table" then return nil, where .. " must be a table {version, name, sql or run}" end
    if math_type(m.version) ~= "integer" or m.version < 1 then
      return nil, where .. ": version must be a positive integer"
    end
    if m.version <= last then
      return nil, format("%s: version %d does not follow %d (versions must increase)", where, m.version, last)
    end
    if retired and retired[m.version] then
      return nil, format("%s: version %d was used before (%s); take a new one", where, m.version, retired[m.version])
    end
    if type(m.name) ~= "string" or m.name == "" then return nil, where .. ": name must be a non-empty string" end
    if m.run ~= nil then
      if type(m.run) ~= "function" then return nil, where .. ": run must be a function(tx)" end
      if m.sql ~= nil then return nil, where .. ": give sql or run, not both" end
    elseif type(m.sql) ~= "string" or not m.sql:find("%S") then
      return nil, where .. ": sql must be SQL text (or run a function(tx))"
    end
    last = m.version
  end
  return true
end

local function check_all(scopes)
  if type(scopes) ~= "table" then return nil, "migrations: scopes must be a list of {scope, list}" end
  local seen = {}
  for _, s in ipairs(scopes) do
    if type(s) ~= "table" then return nil, "migrations: each scope must be a table {scope, list}" end
    if seen[s.scope] then return nil, "migrations: scope '" .. tostring(s.scope) .. "' given twice" end
    seen[s.scope] = true
    local ok, err = _M.check(s.scope, s.list, s.retired)
    if not ok then return nil, err end
  end
  return true
end

-- SQLSTATE classes of failures that another attempt may not meet:
-- connection, rolled back (deadlock, serialization), resources, operator
-- intervention (shutdown), system errors.
local TRANSIENT = { ["08"] = true, ["40"] = true, ["53"] = true, ["57"] = true, ["58"] = true }

local function must(ok, err, what)
  if not ok then error(errors.wrap(err, nil, "migrations: " .. (what or "") .. tostring(err)), 0) end
  return ok
end

-- Lock, make the record table, take over the records of earlier versions'
-- tables -> the legacy tables that exist (by name)
local function prepare(tx)
  must(tx:query("SELECT pg_advisory_xact_lock($1)", { _M.LOCK_KEY }), nil, "cannot take the lock: ")
  local present = {}
  local names = {}
  for i, l in ipairs(LEGACY) do names[i] = l.table end
  local rows = must(tx:query([[SELECT t FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NOT NULL]],
    { "{" .. table.concat(names, ",") .. "}" }))
  for _, r in ipairs(rows) do present[r.t] = true end
  for _, l in ipairs(LEGACY) do
    if present[l.table] then
      must(tx:query("SELECT pg_advisory_xact_lock($1)", { l.lock }), nil, "cannot take the lock: ")
    end
  end
  must(tx:exec(CREATE))
  for _, l in ipairs(LEGACY) do
    if present[l.table] then
      if l.scoped then must(tx:exec(WORKER_TABLE_UPGRADE)) end
      must(tx:exec(format([[
INSERT INTO moongraph_schema (scope, version, name, applied_at)
  SELECT %s, version, name, applied_at FROM %s
ON CONFLICT (scope, version) DO NOTHING]], l.scoped and "scope" or ("'" .. l.scope .. "'"), l.table)))
    end
  end
  return present
end

local function run_step(tx, m)
  if m.run then
    local rok, r, rerr, rstate = pcall(m.run, tx)
    if not rok then return nil, r, "XX000" end   -- a raised error: the step's own fault
    return r, rerr, rstate
  end
  return tx:exec(m.sql)
end

local function record(tx, present, scope, m)
  must(tx:query("INSERT INTO moongraph_schema (scope, version, name) VALUES ($1, $2, $3)",
    { scope, m.version, m.name }))
  local l = legacy_of(scope)
  if present[l.table] then
    if l.scoped then
      must(tx:query("INSERT INTO moongraph_worker_migrations (scope, version, name) VALUES ($1, $2, $3)",
        { scope, m.version, m.name }))
    else
      must(tx:query("INSERT INTO " .. l.table .. " (version, name) VALUES ($1, $2)", { m.version, m.name }))
    end
  end
end

-- migrate(db, scopes) -> applied, unknown | nil, err, permanent
function _M.migrate(db, scopes)
  local ok, cerr = check_all(scopes)
  if not ok then return nil, cerr, true end
  local a, b = db:transaction(function(tx)
    local present = prepare(tx)
    local have, mine = {}, {}
    for _, s in ipairs(scopes) do mine[s.scope] = s end
    local names = {}
    for i, s in ipairs(scopes) do names[i] = s.scope end   -- (scope names need no quoting)
    local rows = must(tx:query("SELECT scope, version, name FROM moongraph_schema WHERE scope = ANY($1::text[])",
      { "{" .. table.concat(names, ",") .. "}" }))
    for _, r in ipairs(rows) do have[r.scope .. "\0" .. r.version] = r end
    local applied, listed = {}, {}
    for _, s in ipairs(scopes) do
      for _, m in ipairs(s.list) do
        local k = s.scope .. "\0" .. m.version
        listed[k] = true
        if not have[k] then
          local sok, err, state = run_step(tx, m)
          if not sok then
            local msg = format("migration %d (%s) of scope '%s' failed: %s", m.version, m.name, s.scope,
              tostring(err))
            local permanent = type(state) == "string" and not TRANSIENT[state:sub(1, 2)] or nil
            error(errors.wrap(err, nil, msg, { permanent = permanent }), 0)
          end
          record(tx, present, s.scope, m)
          applied[#applied + 1] = { scope = s.scope, version = m.version, name = m.name }
        end
      end
    end
    local unknown = {}
    for _, r in ipairs(rows) do
      local s = mine[r.scope]
      local retired = s.retired and s.retired[r.version]
      if not listed[r.scope .. "\0" .. r.version] and not retired then
        unknown[#unknown + 1] = { scope = r.scope, version = r.version, name = r.name }
      end
    end
    return applied, unknown
  end)
  if a == nil then return nil, b, errors.is(b) and b.details and b.details.permanent or nil end
  return a, b
end

-- What is recorded of a scope -> { [version] = true } | nil, err. Asks
-- before it reads (to_regclass), so that it never fails a caller's
-- transaction on a database without the tables.
local function recorded(db, scope)
  local l = legacy_of(scope)
  local rows, err = db:query([[
SELECT to_regclass('moongraph_schema') IS NOT NULL AS new,
       to_regclass($1) IS NOT NULL AS old]], { l.table })
  if not rows then return nil, err end
  local q, args = nil, { scope }
  if rows[1].new then
    q = "SELECT version FROM moongraph_schema WHERE scope = $1"
  elseif rows[1].old then
    q = l.scoped and "SELECT version FROM moongraph_worker_migrations WHERE scope = $1"
      or ("SELECT version FROM " .. l.table)
    if not l.scoped then args = nil end
  else
    return {}
  end
  local list
  list, err = db:query(q, args)
  if not list then return nil, err end
  local out = {}
  for _, r in ipairs(list) do out[r.version] = true end
  return out
end

-- The highest recorded version of a scope, or 0.
function _M.current(db, scope)
  local have, err = recorded(db, scope)
  if not have then return nil, err end
  local max = 0
  for v in pairs(have) do
    if v > max then max = v end
  end
  return max
end

-- Is every version of a scope's list recorded? -> bool | nil, err (a look
-- that takes no lock)
function _M.applied_all(db, scope, list)
  local have, err = recorded(db, scope)
  if not have then return nil, err end
  for _, m in ipairs(list) do
    if not have[m.version] then return false end
  end
  return true
end

return _M
