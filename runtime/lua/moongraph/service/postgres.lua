--[[
moongraph.service.postgres — the service's storage in PostgreSQL: thread
and run records in tables that any number of serve processes and workers
share, the threads' checkpoints in the saver the workers use.

  local postgres = require "moongraph.service.postgres"
  local st = assert(postgres.open {
    pg = "postgresql://...", redis = "redis://...",   -- redis: for a saver that needs it
    checkpoint = "cached",                             -- the workers' --checkpoint
  })
  st.saver

Tables (the scope "langgraph" of moongraph.migrations, applied by open):

  langgraph_threads  thread_id, user_id, metadata, status, values, interrupts,
                     error, created_at, updated_at
  langgraph_runs     run_id, thread_id, user_id, assistant_id, status
                     (pending | running | success | error | interrupted),
                     multitask_strategy, metadata, kwargs, stateless,
                     started_from (the thread's checkpoint when it started,
                     for a rollback), output, error, executor (which
                     executor runs it), events (the event log of a run an
                     in-process executor ran), created_at, updated_at

A run is admitted in one transaction that locks its thread's row, so
serve processes agree on multitask_strategy reject. The operations are
moongraph.service's storage interface (see moongraph.service.files).
]]

local pg = require "moongraph.pg"
local json = require "moongraph.json"
local migrations = require "moongraph.migrations"
local checkpointer = require "moongraph.worker.checkpointer"
local wconfig = require "moongraph.worker.config"

local type, tostring, pairs, ipairs, setmetatable, error, assert =
  type, tostring, pairs, ipairs, setmetatable, error, assert
local array = json.array

local _M = {}
local P = {}
P.__index = P

_M.SCHEMA = [[
CREATE TABLE IF NOT EXISTS langgraph_threads (
  thread_id   text PRIMARY KEY,
  user_id     text NOT NULL,
  metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
  status      text NOT NULL DEFAULT 'idle',
  "values"    jsonb,
  interrupts  jsonb NOT NULL DEFAULT '{}'::jsonb,
  error       text,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS langgraph_threads_user ON langgraph_threads (user_id, created_at);
CREATE TABLE IF NOT EXISTS langgraph_runs (
  run_id             text PRIMARY KEY,
  thread_id          text NOT NULL,
  user_id            text NOT NULL,
  assistant_id       text NOT NULL,
  status             text NOT NULL DEFAULT 'pending',
  multitask_strategy text NOT NULL,
  metadata           jsonb NOT NULL DEFAULT '{}'::jsonb,
  kwargs             jsonb NOT NULL DEFAULT '{}'::jsonb,
  stateless          boolean NOT NULL DEFAULT false,
  started_from       text,
  output             jsonb,
  error              jsonb,
  created_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS langgraph_runs_thread ON langgraph_runs (thread_id, created_at);
]]

-- (the first step creates only what is missing: earlier versions made the
-- same tables without recording it)
_M.migrations = {
  { version = 1, name = "threads and runs", sql = _M.SCHEMA },
  { version = 2, name = "runs of in-process executors: executor, event log; stateless runs by age", sql = [[
ALTER TABLE langgraph_runs ADD COLUMN IF NOT EXISTS executor text;
ALTER TABLE langgraph_runs ADD COLUMN IF NOT EXISTS events jsonb;
CREATE INDEX IF NOT EXISTS langgraph_runs_stateless ON langgraph_runs (created_at) WHERE stateless;
CREATE INDEX IF NOT EXISTS langgraph_runs_going ON langgraph_runs (executor) WHERE status IN ('pending', 'running');
]] },
}

local function decode(v)
  if v == nil or v == pg.null then return nil end
  local t = json.decode(v)
  if t == json.null then return nil end
  return t
end

local function enc(v)
  if v == nil then return pg.null end
  return (json.encode(v, { valid_utf8 = true }))
end

--[[ open{pg, redis, checkpoint, pool_size} -> storage | nil, err. The
saver is the workers' kind (moongraph.worker.checkpointer: cached, postgres,
redis; default the workers' default). ]]
function _M.open(opts)
  if type(opts) ~= "table" or type(opts.pg) ~= "string" then
    error("bad argument #1 to 'open' (a table with a pg URL expected)", 2)
  end
  local saver, serr = checkpointer.open(opts.checkpoint or wconfig.defaults.checkpoint or "cached",
    { redis_url = opts.redis, pg_url = opts.pg })
  if not saver then return nil, "checkpointer: " .. tostring(serr) end
  local db, perr = pg.pool(opts.pg, { size = opts.pool_size or 32 })
  if not db then return nil, "postgres: " .. tostring(perr) end
  local ok, merr = migrations.migrate(db, { { scope = "langgraph", list = _M.migrations } })
  if not ok then db:close(); return nil, "postgres: " .. tostring(merr) end
  return setmetatable({ db = db, saver = saver }, P)
end

function P:close() self.db:close() end

---------------------------------------------------------------- threads

local THREAD_COLUMNS = [[thread_id, user_id, extract(epoch FROM created_at)::float8 AS created_at,
  extract(epoch FROM updated_at)::float8 AS updated_at, metadata::text AS metadata, status,
  "values"::text AS "values", interrupts::text AS interrupts, error]]

local function thread_rec(r)
  return { thread_id = r.thread_id, owner = r.user_id, created_at = r.created_at, updated_at = r.updated_at,
    metadata = decode(r.metadata) or {}, status = r.status, values = decode(r.values),
    interrupts = decode(r.interrupts) or {}, error = r.error ~= pg.null and r.error or nil }
end

local function one_thread(rows) return rows[1] and thread_rec(rows[1]) or false end

function P:thread(id)
  local rows, err = self.db:query("SELECT " .. THREAD_COLUMNS .. " FROM langgraph_threads WHERE thread_id = $1", { id })
  if not rows then return nil, err end
  return one_thread(rows)
end

-- thread_insert(rec) -> the stored record | false (the id exists)
function P:thread_insert(rec)
  local rows, err = self.db:query([[
INSERT INTO langgraph_threads (thread_id, user_id, metadata) VALUES ($1, $2, $3::jsonb)
ON CONFLICT (thread_id) DO NOTHING RETURNING ]] .. THREAD_COLUMNS, { rec.thread_id, rec.owner, enc(rec.metadata) })
  if not rows then return nil, err end
  return one_thread(rows)
end

function P:thread_merge_metadata(id, owner, metadata)
  local rows, err = self.db:query([[
UPDATE langgraph_threads SET metadata = metadata || $3::jsonb, updated_at = clock_timestamp()
 WHERE thread_id = $1 AND user_id = $2 RETURNING ]] .. THREAD_COLUMNS, { id, owner, enc(metadata) })
  if not rows then return nil, err end
  return one_thread(rows)
end

local SORT_KEYS = { thread_id = "thread_id", status = "status", created_at = "created_at",
  updated_at = "updated_at" }

-- thread_search(owner, q) -> the page of records, the total
function P:thread_search(owner, q)
  local want_ids = q.ids and json.encode(array(q.ids)) or pg.null
  local column = SORT_KEYS[q.sort_by or "created_at"]
  local dir = q.sort_order == "asc" and "ASC" or "DESC"
  local offset, limit = q.offset or 0, q.limit or 10
  local where = [[ FROM langgraph_threads WHERE user_id = $1 AND metadata @> $2::jsonb
    AND coalesce("values", '{}'::jsonb) @> $3::jsonb AND ($4::text IS NULL OR status = $4)
    AND ($5::jsonb IS NULL OR thread_id IN (SELECT jsonb_array_elements_text($5::jsonb)))]]
  local params = { owner, json.encode(q.metadata or {}), json.encode(q.values or {}), q.status or pg.null, want_ids }
  local page = {}
  if limit > 0 then
    local rows, err = self.db:query("SELECT " .. THREAD_COLUMNS .. where ..
      " ORDER BY " .. column .. " " .. dir .. ", thread_id " .. dir .. " LIMIT " .. limit .. " OFFSET " .. offset, params)
    if not rows then return nil, err end
    for i, r in ipairs(rows) do page[i] = thread_rec(r) end
  end
  local count, err = self.db:query("SELECT count(*)::int AS n" .. where, params)
  if not count then return nil, err end
  return page, count[1].n
end

-- thread_set(id, {values, interrupts, status, error, except_run}): values
-- nil keeps them; the status is busy while another run is going
function P:thread_set(id, f)
  return self.db:query([[
UPDATE langgraph_threads SET "values" = coalesce($2::jsonb, "values"), interrupts = $3::jsonb,
       error = $5, updated_at = clock_timestamp(),
       status = CASE WHEN EXISTS (SELECT 1 FROM langgraph_runs WHERE thread_id = $1 AND run_id <> $6
                                  AND status IN ('pending', 'running')) THEN 'busy' ELSE $4 END
 WHERE thread_id = $1]], { id, enc(f.values), enc(f.interrupts or {}), f.status or "idle", f.error or pg.null,
    f.except_run or "" })
end

-- thread_delete(id, owner) -> the ids of its runs that were going | false
function P:thread_delete(id, owner)
  local found, going = false, {}
  local ok, err = self.db:transaction(function(tx)
    local rows = assert(tx:query("SELECT thread_id FROM langgraph_threads WHERE thread_id = $1 AND user_id = $2 FOR UPDATE",
      { id, owner }))
    if not rows[1] then return true end
    found = true
    for _, r in ipairs(assert(tx:query([[SELECT run_id FROM langgraph_runs WHERE thread_id = $1
                                          AND status IN ('pending', 'running')]], { id }))) do
      going[#going + 1] = r.run_id
    end
    assert(tx:query("DELETE FROM langgraph_runs WHERE thread_id = $1", { id }))
    assert(tx:query("DELETE FROM langgraph_threads WHERE thread_id = $1", { id }))
    return true
  end)
  if ok == nil then return nil, err end
  return found and going
end

---------------------------------------------------------------- runs

local RUN_COLUMNS = [[run_id, thread_id, user_id, assistant_id, status, multitask_strategy,
  metadata::text AS metadata, kwargs::text AS kwargs, stateless, executor, output::text AS output,
  error::text AS error, extract(epoch FROM created_at)::float8 AS created_at,
  extract(epoch FROM updated_at)::float8 AS updated_at]]

local function run_rec(r)
  local kwargs = decode(r.kwargs) or {}
  return { run_id = r.run_id, thread_id = r.thread_id, owner = r.user_id, assistant_id = r.assistant_id,
    status = r.status, multitask_strategy = r.multitask_strategy, metadata = decode(r.metadata) or {},
    kwargs = kwargs, stateless = r.stateless == true, temporary = kwargs.temporary,
    executor = r.executor ~= pg.null and r.executor or nil,
    output = decode(r.output), error = decode(r.error), created_at = r.created_at, updated_at = r.updated_at }
end

local ACTIVE_SQL = [[SELECT run_id FROM langgraph_runs WHERE thread_id = $1
  AND status IN ('pending', 'running') LIMIT 1]]

--[[ run_admit(rec, {graph, reject}) -> true | false, why, detail | nil, err
(see moongraph.service.files) ]]
function P:run_admit(rec, o)
  local refused
  local kwargs = {}
  for k, v in pairs(rec.kwargs or {}) do kwargs[k] = v end
  kwargs.temporary = rec.temporary
  local ok, err = self.db:transaction(function(tx)
    if not rec.temporary then
      local rows = assert(tx:query("SELECT metadata->>'graph_id' AS gid FROM langgraph_threads " ..
        "WHERE thread_id = $1 AND user_id = $2 FOR UPDATE", { rec.thread_id, rec.owner }))
      if not rows[1] then refused = { "missing" }; return true end
      local gid = rows[1].gid
      if gid ~= pg.null and gid ~= o.graph then refused = { "graph", gid }; return true end
      if o.reject and assert(tx:query(ACTIVE_SQL, { rec.thread_id }))[1] then
        refused = { "busy" }
        return true
      end
      assert(tx:query([[UPDATE langgraph_threads SET status = 'busy', updated_at = clock_timestamp(),
        metadata = CASE WHEN metadata ? 'graph_id' THEN metadata ELSE metadata || $2::jsonb END
        WHERE thread_id = $1]], { rec.thread_id, json.encode { graph_id = o.graph, assistant_id = o.graph } }))
    end
    assert(tx:query([[INSERT INTO langgraph_runs (run_id, thread_id, user_id, assistant_id, multitask_strategy,
        metadata, kwargs, stateless, executor) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9)]],
      { rec.run_id, rec.thread_id, rec.owner, rec.assistant_id, rec.multitask_strategy, enc(rec.metadata),
        enc(kwargs), rec.stateless == true, rec.executor or pg.null }))
    return true
  end)
  if ok == nil then return nil, err end
  if refused then return false, refused[1], refused[2] end
  return true
end

function P:run(id)
  local rows, err = self.db:query("SELECT " .. RUN_COLUMNS .. " FROM langgraph_runs WHERE run_id = $1", { id })
  if not rows then return nil, err end
  return rows[1] and run_rec(rows[1]) or false
end

-- thread_runs(thread_id, {status, offset, limit}) -> records, newest first
function P:thread_runs(thread_id, q)
  local rows, err = self.db:query("SELECT " .. RUN_COLUMNS .. [[ FROM langgraph_runs
    WHERE thread_id = $1 AND ($2::text IS NULL OR status = $2)
    ORDER BY created_at DESC, run_id DESC LIMIT $3 OFFSET $4]],
    { thread_id, q.status or pg.null, q.limit or 10, q.offset or 0 })
  if not rows then return nil, err end
  local out = {}
  for i, r in ipairs(rows) do out[i] = run_rec(r) end
  return out
end

-- the thread's running (else first pending) run | false
function P:run_active(thread_id)
  local rows, err = self.db:query("SELECT " .. RUN_COLUMNS .. [[ FROM langgraph_runs
    WHERE thread_id = $1 AND status IN ('running', 'pending')
    ORDER BY status = 'running' DESC, created_at LIMIT 1]], { thread_id })
  if not rows then return nil, err end
  return rows[1] and run_rec(rows[1]) or false
end

-- run_set(id, fields [, from]) -> true | false (not in a status of `from`,
-- or gone) | nil, err. fields: status, output, error, events.
function P:run_set(id, f, from)
  local statuses = pg.null
  if from then
    local l = array()
    for s in pairs(from) do l[#l + 1] = s end
    statuses = json.encode(l)
  end
  local rows, err = self.db:query([[
UPDATE langgraph_runs SET status = coalesce($2, status), output = coalesce($3::jsonb, output),
       error = coalesce($4::jsonb, error), events = coalesce($5::jsonb, events), updated_at = clock_timestamp()
 WHERE run_id = $1 AND ($6::jsonb IS NULL OR $6::jsonb ? status) RETURNING run_id]],
    { id, f.status or pg.null, enc(f.output), enc(f.error), enc(f.events and array(f.events)), statuses })
  if not rows then return nil, err end
  return rows[1] ~= nil
end

-- run_started(id): the run is running
function P:run_started(id)
  return self.db:query([[UPDATE langgraph_runs SET status = 'running', updated_at = clock_timestamp()
    WHERE run_id = $1 AND status = 'pending']], { id })
end

function P:run_events(id)
  local rows, err = self.db:query("SELECT events::text AS events FROM langgraph_runs WHERE run_id = $1", { id })
  if not rows then return nil, err end
  return rows[1] and decode(rows[1].events) or false
end

function P:run_delete(id)
  local rows, err = self.db:query("DELETE FROM langgraph_runs WHERE run_id = $1", { id })
  if not rows then return nil, err end
  return true
end

-- runs_prune(thread_id | nil (stateless runs), keep): the oldest finished
-- runs over keep go
function P:runs_prune(thread_id, keep)
  if thread_id then
    return self.db:query([[
DELETE FROM langgraph_runs WHERE run_id IN (SELECT run_id FROM langgraph_runs WHERE thread_id = $1
   AND status NOT IN ('pending', 'running') ORDER BY created_at DESC OFFSET $2)]], { thread_id, keep })
  end
  return self.db:query([[
DELETE FROM langgraph_runs WHERE run_id IN (SELECT run_id FROM langgraph_runs WHERE stateless
   AND status NOT IN ('pending', 'running') ORDER BY created_at DESC OFFSET $1)]], { keep })
end

-- runs_unfinished(executor) -> records of that executor's runs still
-- pending or running
function P:runs_unfinished(executor)
  local rows, err = self.db:query("SELECT " .. RUN_COLUMNS .. [[ FROM langgraph_runs
    WHERE status IN ('pending', 'running') AND executor = $1 ORDER BY created_at]], { executor })
  if not rows then return nil, err end
  local out = {}
  for i, r in ipairs(rows) do out[i] = run_rec(r) end
  return out
end

return _M
