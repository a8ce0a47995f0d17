-- moongraph.worker.migrations — versioned Postgres schemas: the worker's own
-- and those of the scripts it runs.
--
--   local migrations = require "moongraph.worker.migrations"
--   local applied, err, permanent = migrations.migrate(db [, scopes])
--     -- scopes: { {scope = "app", list = { {version=, name=, sql=}, ... }}, ... }
--     -- an entry may have run = function(tx) -> true | nil, err instead of
--     -- sql: Lua that migrates data through the transaction (one step of it)
--     -- applied: { {scope=, version=, name=}, ... } newly applied
--     -- (also returns `unknown`: { {scope=, version=, name=}, ... } recorded
--     --  versions no list names, e.g. applied by a newer worker)
--     -- permanent: true when a migration's SQL itself failed (trying again
--     --  will not help), not the connection
--   local ok, err = migrations.check(scope, list)    -- the shape of a list
--   migrations.current(db [, scope]) -> highest recorded version (0: none)
--
-- Each scope is a namespace of versions: the worker's own schema is the
-- scope "worker" (job_results), and a script's hooks name their own scope
-- (docs/worker.md). A migration runs once, in version order within its
-- scope, inside one transaction that also records it in
-- moongraph_worker_migrations (scope, version, name); a transaction-scoped
-- advisory lock makes workers that start together apply them one at a time
-- (the others wait, then find nothing left to do). A schema change is a new
-- entry at the end of its list; applied entries are never edited.
--
-- Versions recorded but no longer listed are left alone: a database keeps
-- the history of what was applied to it. The worker's version 2 created
-- tables that now belong to an application script's own scope; it stays
-- recorded in old databases and is never reused (RETIRED).

local errors = require "moongraph.errors"
local ipairs, tostring, type, error = ipairs, tostring, type, error
local math_type, format = math.type, string.format

local _M = {}

_M.LOCK_KEY = 0x6d67776b -- "mgwk"

_M.TABLE = "moongraph_worker_migrations"

-- The worker's own scope.
_M.SCOPE = "worker"

-- Versions of the worker's scope that were applied in the past and are no
-- longer listed; no new migration may take them.
_M.RETIRED = {
  [2] = "conversation memory and user profiles (moved to an application script's own scope)",
}

_M.list = {
  {
    version = 1,
    name = "job results",
    sql = [[
CREATE TABLE job_results (
  job_id     text PRIMARY KEY,
  thread_id  text NOT NULL,
  user_id    text,
  status     text NOT NULL DEFAULT 'done',
  answer     text,
  error      text,
  state      jsonb NOT NULL DEFAULT '{}'::jsonb,
  worker     text,
  deliveries integer,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_results_thread ON job_results (thread_id, created_at);
]],
  },
  {
    version = 3,
    name = "thread fences",
    sql = [[
CREATE TABLE thread_fences (
  thread_id  text PRIMARY KEY,
  token      numeric NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);
]],
  },
  {
    -- json keeps the text the worker wrote: jsonb rewrote numbers (a float
    -- 1e15 came back as the integer 1000000000000000) and cost a parse
    -- and a rebuild per result
    version = 4,
    name = "job results keep the state's JSON text",
    sql = [[
ALTER TABLE job_results ALTER COLUMN state DROP DEFAULT;
ALTER TABLE job_results ALTER COLUMN state TYPE json USING state::json;
ALTER TABLE job_results ALTER COLUMN state SET DEFAULT '{}'::json;
-- a state over 2 kB is compressed: lz4 where the server has it (pglz,
-- the default, takes several times the CPU)
DO $$ BEGIN
  EXECUTE 'ALTER TABLE job_results ALTER COLUMN state SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error OR undefined_object THEN NULL;
END $$;
]],
  },
  {
    -- the result insert raises its refusal, so that it can go with the
    -- transaction's COMMIT (moongraph.worker.results)
    version = 5,
    name = "a refused job result rolls its transaction back",
    sql = [[
CREATE OR REPLACE FUNCTION moongraph_result_refused(reason text) RETURNS integer
  LANGUAGE plpgsql AS $f$
  BEGIN
    RAISE EXCEPTION 'moongraph job result refused: %', reason;
  END $f$;
]],
  },
  {
    -- a thread's stored results, counted: a job resumed from its
    -- checkpoint compares the count it started under with its claim's
    -- (moongraph.worker.results)
    version = 6,
    name = "thread fences count the thread's results",
    sql = [[
ALTER TABLE thread_fences ADD COLUMN commits bigint NOT NULL DEFAULT 0;
]],
  },
  {
    -- each refusal its own SQLSTATE (class MG: ours), so that the worker
    -- knows which without reading the message (moongraph.worker.results)
    version = 7,
    name = "a refused job result says why in its SQLSTATE",
    sql = [[
CREATE OR REPLACE FUNCTION moongraph_result_refused(reason text) RETURNS integer
  LANGUAGE plpgsql AS $f$
  BEGIN
    IF reason = 'stale' THEN
      RAISE EXCEPTION 'moongraph job result refused: %', reason USING ERRCODE = 'MGR01';
    END IF;
    RAISE EXCEPTION 'moongraph job result refused: %', reason USING ERRCODE = 'MGR02';
  END $f$;
]],
  },
}

-- The record table, and its upgrade from the time it had no scope column
-- (then every recorded version was the worker's).
local BOOTSTRAP = [[
CREATE TABLE IF NOT EXISTS moongraph_worker_migrations (
  scope      text NOT NULL DEFAULT 'worker',
  version    integer NOT NULL,
  name       text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (scope, version)
);
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

-- check(scope, list) -> true | nil, err: versions are positive integers,
-- increasing, each entry has a name and SQL text.
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

-- The worker's scope first, then the scripts'.
local function all_scopes(scopes)
  local out = { { scope = _M.SCOPE, list = _M.list, retired = _M.RETIRED } }
  local seen = { [_M.SCOPE] = true }
  for _, s in ipairs(scopes or {}) do
    if type(s) ~= "table" then return nil, "migrations: each scope must be a table {scope, list}" end
    if seen[s.scope] then return nil, "migrations: scope '" .. tostring(s.scope) .. "' given twice" end
    seen[s.scope] = true
    out[#out + 1] = s
  end
  for _, s in ipairs(out) do
    local ok, err = _M.check(s.scope, s.list, s.retired)
    if not ok then return nil, err end
  end
  return out
end

-- SQLSTATE classes of failures that another attempt may not meet:
-- connection, rolled back (deadlock, serialization), resources, operator
-- intervention (shutdown), system errors.
local TRANSIENT = { ["08"] = true, ["40"] = true, ["53"] = true, ["57"] = true, ["58"] = true }

-- migrate(db [, scopes]) -> applied, unknown | nil, err, permanent
function _M.migrate(db, scopes)
  local list, lerr = all_scopes(scopes)
  if not list then return nil, lerr, true end
  local a, b = db:transaction(function(tx)
    local ok, err = tx:query("SELECT pg_advisory_xact_lock($1)", { _M.LOCK_KEY })
    if not ok then error(errors.wrap(err, nil, "migrations: cannot take the lock: " .. tostring(err)), 0) end
    ok, err = tx:exec(BOOTSTRAP)
    if not ok then error(errors.wrap(err, nil, "migrations: " .. tostring(err)), 0) end
    local rows, qerr = tx:query("SELECT scope, version, name FROM moongraph_worker_migrations")
    if not rows then error(errors.wrap(qerr, nil, "migrations: " .. tostring(qerr)), 0) end
    local have = {}
    for _, r in ipairs(rows) do have[r.scope .. "\0" .. r.version] = r end
    local applied, listed = {}, {}
    for _, s in ipairs(list) do
      for _, m in ipairs(s.list) do
        local k = s.scope .. "\0" .. m.version
        listed[k] = true
        if not have[k] then
          local state
          if m.run then
            local rok, r, rerr, rstate = pcall(m.run, tx)
            if not rok then
              ok, err, state = nil, r, "XX000"          -- a raised error: the step's own fault
            else
              ok, err, state = r, rerr, rstate
            end
          else
            ok, err, state = tx:exec(m.sql)
          end
          if not ok then
            local msg = format("migration %d (%s) of scope '%s' failed: %s", m.version, m.name, s.scope,
              tostring(err))
            local permanent = type(state) == "string" and not TRANSIENT[state:sub(1, 2)] or nil
            error(errors.wrap(err, nil, msg, { permanent = permanent }), 0)
          end
          ok, err = tx:query("INSERT INTO moongraph_worker_migrations (scope, version, name) VALUES ($1, $2, $3)",
            { s.scope, m.version, m.name })
          if not ok then error(errors.wrap(err, nil, "migrations: " .. tostring(err)), 0) end
          applied[#applied + 1] = { scope = s.scope, version = m.version, name = m.name }
        end
      end
    end
    local unknown = {}
    for _, r in ipairs(rows) do
      local retired = r.scope == _M.SCOPE and _M.RETIRED[r.version]
      if not listed[r.scope .. "\0" .. r.version] and not retired then
        unknown[#unknown + 1] = { scope = r.scope, version = r.version, name = r.name }
      end
    end
    return applied, unknown
  end)
  if a == nil then return nil, b, errors.is(b) and b.details.permanent or nil end
  return a, b
end

-- The highest recorded version of a scope (default the worker's), or 0.
function _M.current(db, scope)
  local rows, err = db:query([[
SELECT coalesce(max(version), 0) AS v FROM moongraph_worker_migrations WHERE scope = $1]], { scope or _M.SCOPE })
  if not rows then
    if errors.has(err, "pg:42P01") then return 0 end   -- undefined_table: none recorded yet
    return nil, err
  end
  return rows[1].v
end

return _M
