-- moongraph.worker.migrations — the worker's schema (job_results, thread
-- fences) as the scope "worker" of moongraph.migrations, applied with the
-- scopes of the scripts it runs.
--
--   local migrations = require "moongraph.worker.migrations"
--   local applied, unknown = migrations.migrate(db [, scopes])
--     -- the worker's scope first, then scopes { {scope = "app", list = {...}}, ... }
--     -- (nil, err, permanent as moongraph.migrations.migrate)
--   local ok, err = migrations.check(scope, list)    -- the shape of a list
--   migrations.current(db [, scope]) -> highest recorded version (0: none)
--
-- A script's hooks name their own scope (docs/worker.md). Versions
-- recorded but no longer listed are left alone: a database keeps the
-- history of what was applied to it. The worker's version 2 created
-- tables that now belong to an application script's own scope; it stays
-- recorded in old databases and is never reused (RETIRED).

local schema = require "moongraph.migrations"

local ipairs, type = ipairs, type

local _M = {}

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

-- check(scope, list) -> true | nil, err
function _M.check(scope, list, retired)
  return schema.check(scope, list, retired)
end

-- The worker's scope first, then the scripts'.
local function all_scopes(scopes)
  local out = { { scope = _M.SCOPE, list = _M.list, retired = _M.RETIRED } }
  for _, s in ipairs(scopes or {}) do out[#out + 1] = s end
  return out
end

-- migrate(db [, scopes]) -> applied, unknown | nil, err, permanent
function _M.migrate(db, scopes)
  if scopes ~= nil and type(scopes) ~= "table" then
    return nil, "migrations: scopes must be a list of {scope, list}", true
  end
  return schema.migrate(db, all_scopes(scopes))
end

-- The highest recorded version of a scope (default the worker's), or 0.
function _M.current(db, scope)
  return schema.current(db, scope or _M.SCOPE)
end

return _M
