-- moongraph.worker.migrations — the worker's Postgres schema, versioned.
--
--   local migrations = require "moongraph.worker.migrations"
--   local applied, err = migrations.migrate(db)   -- { {version=, name=}, ... } newly applied
--
-- Each migration runs once, in version order, inside one transaction that
-- also records it in moongraph_worker_migrations (a table of its own: the
-- Postgres checkpoint saver keeps its versions in moongraph_migrations); a
-- transaction-scoped advisory lock makes workers that start together apply
-- them one at a time (the others wait, then find nothing left to do). A new schema change is a new
-- entry at the end of the list; applied entries are never edited.

local ipairs, tostring = ipairs, tostring

local _M = {}

_M.LOCK_KEY = 0x6d67776b -- "mgwk"

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
    version = 2,
    name = "conversation memory and user profiles",
    sql = [[
CREATE TABLE conversations (
  thread_id   text PRIMARY KEY,
  user_id     text NOT NULL,
  turn        integer NOT NULL DEFAULT 0,
  last_intent text,
  summary     jsonb,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE messages (
  id         bigserial PRIMARY KEY,
  thread_id  text NOT NULL REFERENCES conversations (thread_id) ON DELETE CASCADE,
  turn       integer NOT NULL,
  role       text NOT NULL,
  content    text NOT NULL,
  intent     text,
  job_id     text,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_thread ON messages (thread_id, id);
CREATE UNIQUE INDEX messages_job_role ON messages (job_id, role);
CREATE TABLE user_profiles (
  user_id     text PRIMARY KEY,
  location    text,
  turns       integer NOT NULL DEFAULT 0,
  last_intent text,
  intents     jsonb NOT NULL DEFAULT '{}'::jsonb,
  first_seen  timestamptz NOT NULL DEFAULT now(),
  last_seen   timestamptz NOT NULL DEFAULT now()
);
]],
  },
}

-- migrate(db) -> list of newly applied {version, name} | nil, err
function _M.migrate(db)
  return db:transaction(function(tx)
    local ok, err = tx:query("SELECT pg_advisory_xact_lock($1)", { _M.LOCK_KEY })
    if not ok then error("migrations: cannot take the lock: " .. tostring(err), 0) end
    ok, err = tx:exec([[
CREATE TABLE IF NOT EXISTS moongraph_worker_migrations (
  version    integer PRIMARY KEY,
  name       text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)]])
    if not ok then error("migrations: " .. tostring(err), 0) end
    local rows, qerr = tx:query("SELECT version FROM moongraph_worker_migrations")
    if not rows then error("migrations: " .. tostring(qerr), 0) end
    local have = {}
    for _, r in ipairs(rows) do have[r.version] = true end
    local applied = {}
    for _, m in ipairs(_M.list) do
      if not have[m.version] then
        ok, err = tx:exec(m.sql)
        if not ok then
          error(("migration %d (%s) failed: %s"):format(m.version, m.name, tostring(err)), 0)
        end
        ok, err = tx:query("INSERT INTO moongraph_worker_migrations (version, name) VALUES ($1, $2)",
          { m.version, m.name })
        if not ok then error("migrations: " .. tostring(err), 0) end
        applied[#applied + 1] = { version = m.version, name = m.name }
      end
    end
    return applied
  end)
end

-- The highest applied version, or 0.
function _M.current(db)
  local rows, err = db:query([[
SELECT coalesce(max(version), 0) AS v FROM moongraph_worker_migrations]])
  if not rows then
    if tostring(err):find("does not exist", 1, true) then return 0 end
    return nil, err
  end
  return rows[1].v
end

return _M
