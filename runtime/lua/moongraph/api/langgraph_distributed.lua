--[[
moongraph.api.langgraph_distributed — the distributed backend of the
LangGraph Agent API (`moongraph serve --redis --pg`): threads and runs in
PostgreSQL, runs executed as jobs by `moongraph worker` processes
(moongraph.worker.langgraph), their events relayed from the jobs' Redis
event streams, state read and written through the saver the workers use.
A serve process keeps no state of its own: any number of them can stand
behind a load balancer.

  local lgdist = require "moongraph.api.langgraph_distributed"
  local b = assert(lgdist.new{
    redis = "redis://127.0.0.1:6379/0", pg = "postgresql://...",
    prefix = "moongraph",          -- the workers' --prefix
    checkpoint = "cached",         -- the workers' --checkpoint
    scripts = { {name = "agent", path = "..."}, ... },   -- as the workers run them
  })
  -- the methods moongraph.api.langgraph calls (see moongraph.api.embedded)

Tables: moongraph.worker.langgraph.migrations (the scope "langgraph" of
moongraph.migrations, applied here).

A run is accepted once its row is committed and its job is on the stream
(its `metadata` event first in the job's event stream); event ids are the
stream's entry ids, so a client resumes with Last-Event-ID on any serve.
multitask_strategy: reject is answered here (409) while the thread has a
pending or running run (run creation on a thread takes its row's lock, so
serves agree); enqueue, interrupt and rollback are the workers' (a run of
the thread waits for the thread's lease, or stops the one that holds it).
Cancelling a run that runs sets its cancel key, which the worker running
it watches; one still pending is marked interrupted here and ends at once.
]]

local mg = require "moongraph"
local migrations = require "moongraph.migrations"
local pg = require "moongraph.pg"
local redis = require "moongraph.redis"
local json = require "moongraph.json"
local ids = require "moongraph.ids"
local client_mod = require "moongraph.worker.client"
local events = require "moongraph.worker.events"
local checkpointer = require "moongraph.worker.checkpointer"
local wconfig = require "moongraph.worker.config"
local scripts_mod = require "moongraph.worker.scripts"
local lg = require "moongraph.worker.langgraph"
local lgrun = require "moongraph.langgraph_run"
local lgstate = require "moongraph.api.langgraph_state"
local lgassistants = require "moongraph.api.langgraph_assistants"
local lgrequest = require "moongraph.api.langgraph_request"
local embedded = require "moongraph.api.embedded"
local text = require "moongraph.text"

local type, tostring, tonumber, ipairs, setmetatable, error, next, pcall =
  type, tostring, tonumber, ipairs, setmetatable, error, next, pcall
local math_floor, math_max = math.floor, math.max
local null, array = json.null, json.array
local error_message = text.error_message

local _M = {}
local B = {}
B.__index = B
lgassistants.install(B)
local Run = {}
Run.__index = Run

-- Seconds the Redis keys of a run (its cancel key, its metadata event
-- before a worker took it) live.
_M.KEY_TTL = 86400

local FINAL = { success = true, error = true, interrupted = true }

local function isnull(v) return v == nil or v == null end
local function fail(status, msg) return nil, status, msg end
local function unavailable(what, err) return nil, 503, what .. ": " .. error_message(err) end

-- the user as stored: "" without API keys
local function who(user) return user or "" end

local function decode(v)
  if v == nil or v == pg.null then return nil end
  local t = json.decode(v)
  if t == json.null then return nil end
  return t
end

-- new{redis, pg, prefix, checkpoint, scripts} -> backend | nil, err
function _M.new(opts)
  if type(opts) ~= "table" then error("bad argument #1 to 'new' (options table expected)", 2) end
  if type(opts.redis) ~= "string" or type(opts.pg) ~= "string" then
    error("bad argument #1 to 'new' (redis and pg URLs expected)", 2)
  end
  local saver, serr = checkpointer.open(opts.checkpoint or wconfig.defaults.checkpoint or "cached",
    { redis_url = opts.redis, pg_url = opts.pg })
  if not saver then return nil, "checkpointer: " .. tostring(serr) end
  local reg = scripts_mod.new(opts.scripts or {}, saver)
  local lok, lerr = reg:load()
  if not lok then return nil, lerr end
  if not reg.set.list[1] then return nil, "no script: give --script [NAME=]PATH as the workers run it" end
  for _, s in ipairs(reg.set.list) do
    if s.app.checkpointer == nil then
      return nil, "script '" .. s.name .. "': build{checkpointer = saver} must compile the graph with " ..
        "that checkpointer (threads need it)"
    end
  end
  local conn, rerr = redis.connect(opts.redis)
  if not conn then return nil, "redis: " .. tostring(rerr) end
  local db, perr = pg.pool(opts.pg, { size = opts.pool_size or 32 })
  if not db then conn:close(); return nil, "postgres: " .. tostring(perr) end
  local ok, merr = migrations.migrate(db, { { scope = "langgraph", list = lg.migrations } })
  if not ok then conn:close(); db:close(); return nil, "postgres: " .. tostring(merr) end
  local prefix = opts.prefix or "moongraph"
  return setmetatable({
    redis = conn, db = db, prefix = prefix, saver = saver, reg = reg, created = lgrun.wall(),
    client = assert(client_mod.connect({ redis = conn }, { prefix = prefix,
      replicas = opts.redis:lower():find("^redis%-sentinel://") and 1 or 0 })),
  }, B)
end

function B:close()
  self.redis:close()
  self.db:close()
end

---------------------------------------------------------------- threads

local THREAD_COLUMNS = [[thread_id, extract(epoch FROM created_at)::float8 AS created_at,
  extract(epoch FROM updated_at)::float8 AS updated_at, metadata::text AS metadata, status,
  "values"::text AS "values", interrupts::text AS interrupts, error]]

local function thread_rec(r)
  return { thread_id = r.thread_id, created_at = r.created_at, updated_at = r.updated_at,
    metadata = decode(r.metadata) or {}, status = r.status, values = decode(r.values),
    interrupts = decode(r.interrupts) or {}, error = r.error ~= pg.null and r.error or nil }
end

-- the caller's thread record | nil, 404 | nil, 503
local function mine(self, user, id, tx)
  if type(id) ~= "string" or not ids.valid(id) then return fail(404, "thread '" .. tostring(id) .. "' not found") end
  local rows, err = (tx or self.db):query("SELECT " .. THREAD_COLUMNS ..
    " FROM langgraph_threads WHERE thread_id = $1 AND user_id = $2" .. (tx and " FOR UPDATE" or ""), { id, who(user) })
  if not rows then return unavailable("the thread could not be read", err) end
  if not rows[1] then return fail(404, "thread '" .. id .. "' not found") end
  return thread_rec(rows[1])
end

local function app_of(self, rec)
  local gid = rec.metadata and rec.metadata.graph_id
  local s = lgassistants.script(self.reg, gid)
  return s and s.app, gid
end

-- a graph's run on this thread is pending or running
local function active(db, thread_id)
  local rows, err = db:query([[SELECT run_id FROM langgraph_runs WHERE thread_id = $1
    AND status IN ('pending', 'running') ORDER BY created_at LIMIT 1]], { thread_id })
  if not rows then return nil, err end
  return rows[1] and rows[1].run_id or false
end

-- after a change of the thread's state (or of its runs): its values,
-- interrupts and status, from its latest checkpoint
local function refresh(self, thread_id, app)
  local snap = app and app:get_state { thread_id = thread_id }
  local f = snap and lgrun.thread_fields(snap) or { interrupts = {}, status = "idle" }
  return self.db:query([[
UPDATE langgraph_threads SET "values" = coalesce($2::jsonb, "values"), interrupts = $3::jsonb,
       error = NULL, updated_at = clock_timestamp(),
       status = CASE WHEN EXISTS (SELECT 1 FROM langgraph_runs WHERE thread_id = $1
                                  AND status IN ('pending', 'running')) THEN 'busy' ELSE $4 END
 WHERE thread_id = $1]], { thread_id, f.values ~= nil and json.encode(f.values) or pg.null,
    json.encode(f.interrupts), f.status })
end

function B:thread_create(user, body)
  local q, st, msg = lgrequest.thread_create(body or {})
  if not q then return fail(st, msg) end
  body = q
  local metadata = q.metadata
  local id = q.thread_id
  if id == nil then id = embedded.uuid4()
  else
    local ok, err = ids.check(id, "thread_id")
    if not ok then return fail(422, err) end
  end
  if not isnull(body.supersteps) then
    return fail(422, "supersteps are not supported: create the thread, then update its state")
  end
  local rows, err = self.db:query([[
INSERT INTO langgraph_threads (thread_id, user_id, metadata) VALUES ($1, $2, $3::jsonb)
ON CONFLICT (thread_id) DO NOTHING RETURNING ]] .. THREAD_COLUMNS, { id, who(user), json.encode(metadata) })
  if not rows then return unavailable("the thread could not be stored", err) end
  if rows[1] then return embedded.thread_json(thread_rec(rows[1])) end
  if body.if_exists == "do_nothing" then
    local rec = mine(self, user, id)
    if rec then return embedded.thread_json(rec) end
  end
  return fail(409, "thread '" .. id .. "' already exists")
end

function B:thread_get(user, id)
  local rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  return embedded.thread_json(rec)
end

function B:thread_patch(user, id, body)
  local q, st, msg = lgrequest.thread_patch(body or {})
  if not q then return fail(st, msg) end
  local metadata = q.metadata
  if type(id) ~= "string" or not ids.valid(id) then return fail(404, "thread '" .. tostring(id) .. "' not found") end
  local rows, err = self.db:query([[
UPDATE langgraph_threads SET metadata = metadata || $3::jsonb, updated_at = clock_timestamp()
 WHERE thread_id = $1 AND user_id = $2 RETURNING ]] .. THREAD_COLUMNS, { id, who(user), json.encode(metadata) })
  if not rows then return unavailable("the thread could not be stored", err) end
  if not rows[1] then return fail(404, "thread '" .. id .. "' not found") end
  return embedded.thread_json(thread_rec(rows[1]))
end

local SORT_KEYS = { thread_id = "thread_id", status = "status", created_at = "created_at",
  updated_at = "updated_at" }

-- thread_search(user, body) -> page, total | nil, 422, msg
function B:thread_search(user, body)
  local q, st, msg = lgrequest.thread_search(body or {})
  if not q then return fail(st, msg) end
  return self:_search(user, q)
end

-- thread_count(user, body) -> n | nil, status, msg (body: metadata, values, status)
function B:thread_count(user, body)
  body = body or {}
  local q, st, msg = lgrequest.thread_search { metadata = body.metadata, values = body.values, status = body.status }
  if not q then return fail(st, msg) end
  q.limit = 0
  local _, total
  _, total, msg = self:_search(user, q)
  if not _ then return fail(total, msg) end
  return total
end

function B:_search(user, q)
  local metadata, values = q.metadata, q.values
  local want_ids = q.ids and json.encode(array(q.ids)) or pg.null
  local column = SORT_KEYS[q.sort_by or "created_at"]
  local dir = q.sort_order == "asc" and "ASC" or "DESC"
  local offset, limit = q.offset or 0, q.limit or 10
  local where = [[ FROM langgraph_threads WHERE user_id = $1 AND metadata @> $2::jsonb
    AND coalesce("values", '{}'::jsonb) @> $3::jsonb AND ($4::text IS NULL OR status = $4)
    AND ($5::jsonb IS NULL OR thread_id IN (SELECT jsonb_array_elements_text($5::jsonb)))]]
  local params = { who(user), json.encode(metadata), json.encode(values), q.status or pg.null, want_ids }
  local rows, err = self.db:query("SELECT " .. THREAD_COLUMNS .. where ..
    " ORDER BY " .. column .. " " .. dir .. ", thread_id " .. dir .. " LIMIT " .. limit .. " OFFSET " .. offset, params)
  if not rows then return unavailable("the threads could not be read", err) end
  local count
  count, err = self.db:query("SELECT count(*)::int AS n" .. where, params)
  if not count then return unavailable("the threads could not be counted", err) end
  local select = q.select
  local page = array()
  for i, r in ipairs(rows) do
    local t = embedded.thread_json(thread_rec(r))
    if select then
      local s = {}
      for _, k in ipairs(select) do s[k] = t[k] end
      t = s
    end
    page[i] = t
  end
  return page, count[1].n
end

function B:thread_delete(user, id)
  if type(id) ~= "string" or not ids.valid(id) then return fail(404, "thread '" .. tostring(id) .. "' not found") end
  local found, going = false, {}
  local ok, err = self.db:transaction(function(tx)
    local rows = assert(tx:query("SELECT thread_id FROM langgraph_threads WHERE thread_id = $1 AND user_id = $2 FOR UPDATE",
      { id, who(user) }))
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
  if ok == nil then return unavailable("the thread could not be deleted", err) end
  if not found then return fail(404, "thread '" .. id .. "' not found") end
  for _, run_id in ipairs(going) do
    self.redis:call("SET", lg.cancel_key(self.prefix, run_id), "interrupt", "EX", _M.KEY_TTL)
  end
  local dok, derr = self.saver:delete_thread(id)
  if not dok then return fail(503, "cannot delete the thread's checkpoints: " .. tostring(derr)) end
  return true
end

function B:thread_state(user, id, checkpoint_id)
  local rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  return lgstate.get(app_of(self, rec), id, checkpoint_id)
end

function B:thread_update_state(user, id, body)
  local rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  local busy, err = active(self.db, id)
  if busy == nil then return unavailable("the thread's runs could not be read", err) end
  if busy then return fail(409, "thread '" .. id .. "' is busy: a run is going") end
  local q
  q, st, msg = lgrequest.state_update(body or {})
  if not q then return fail(st, msg) end
  local app, gid = app_of(self, rec)
  local out
  out, st, msg = lgstate.update(app, gid, id, q)
  if not out then return fail(st, msg) end
  refresh(self, id, app)
  return out
end

function B:thread_history(user, id, body)
  local q, st, msg = lgrequest.history(body or {})
  if not q then return fail(st, msg) end
  local rec
  rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  return lgstate.history(app_of(self, rec), id, q)
end

---------------------------------------------------------------- runs

local RUN_COLUMNS = [[run_id, thread_id, user_id, assistant_id, status, multitask_strategy,
  metadata::text AS metadata, kwargs::text AS kwargs, stateless,
  extract(epoch FROM created_at)::float8 AS created_at, extract(epoch FROM updated_at)::float8 AS updated_at]]

local function run_of(self, r)
  local kwargs = decode(r.kwargs) or {}
  return setmetatable({
    run_id = r.run_id, thread_id = r.thread_id, owner = r.user_id, assistant_id = r.assistant_id,
    status = r.status, multitask_strategy = r.multitask_strategy, metadata = decode(r.metadata) or {},
    stream_mode = kwargs.stream_mode, subgraphs = kwargs.stream_subgraphs == true,
    config_in = kwargs.config or {}, stateless = r.stateless == true,
    created_at = r.created_at, updated_at = r.updated_at,
    backend = self, key = self.client:events_key(r.run_id),
  }, Run)
end

function B:run_json(run) return embedded.run_json(run) end

local function busy_msg(thread_id)
  return "thread '" .. thread_id .. "' is already running a run; wait for it to finish " ..
    "or choose another multitask_strategy (enqueue, interrupt, rollback)"
end

--[[ run_create(user, thread_id | nil, body) -> run | nil, status, msg
thread_id nil: a stateless run (on a temporary thread, deleted when the
run ends unless on_completion = "keep"). ]]
function B:run_create(user, thread_id, body)
  local r, st, msg = lgrequest.run(body)
  if not r then return fail(st, msg) end
  local s = lgassistants.script(self.reg, body.assistant_id)
  if not s then return fail(404, "assistant '" .. tostring(body.assistant_id) .. "' not found") end
  local stateless = thread_id == nil
  local temporary = stateless and r.on_completion ~= "keep"
  if stateless then
    thread_id = embedded.uuid4()
    if not temporary then
      local t, cst, cmsg = self:thread_create(user, { thread_id = thread_id,
        metadata = { graph_id = s.name, assistant_id = s.name } })
      if not t then return fail(cst, cmsg) end
    end
  elseif r.if_not_exists == "create" then
    -- (a thread of another user stays theirs: 404 below)
    local t, cst, cmsg = self:thread_create(user, { thread_id = thread_id, if_exists = "do_nothing" })
    if not t and cst ~= 409 then return fail(cst, cmsg) end
  end
  local run_id = embedded.uuid4()
  local kwargs = { stream_mode = r.names, stream_subgraphs = r.subgraphs, stream_resumable = true,
    config = r.config }
  local refused
  local ok, err = self.db:transaction(function(tx)
    if not temporary then
      local rec, rst, rmsg = mine(self, user, thread_id, tx)
      if not rec then refused = { rst, rmsg }; return true end
      local gid = rec.metadata and rec.metadata.graph_id
      if gid ~= nil and gid ~= s.name then
        refused = { 409, "thread '" .. thread_id .. "' belongs to graph '" .. tostring(gid) .. "', not '" ..
          s.name .. "'" }
        return true
      end
      local going, aerr = active(tx, thread_id)
      if going == nil then error(aerr, 0) end
      if going and r.strategy == "reject" then
        refused = { 409, busy_msg(thread_id) }
        return true
      end
      assert(tx:query([[UPDATE langgraph_threads SET status = 'busy', updated_at = clock_timestamp(),
        metadata = CASE WHEN metadata ? 'graph_id' THEN metadata ELSE metadata || $2::jsonb END
        WHERE thread_id = $1]], { thread_id, json.encode { graph_id = s.name, assistant_id = s.name } }))
    end
    assert(tx:query([[INSERT INTO langgraph_runs (run_id, thread_id, user_id, assistant_id, multitask_strategy,
        metadata, kwargs, stateless) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8)]],
      { run_id, thread_id, who(user), s.name, r.strategy, json.encode(r.metadata), json.encode(kwargs), stateless }))
    return true
  end)
  if ok == nil then return unavailable("the run could not be stored", err) end
  if refused then return fail(refused[1], refused[2]) end
  local run = run_of(self, { run_id = run_id, thread_id = thread_id, user_id = who(user), assistant_id = s.name,
    status = "pending", multitask_strategy = r.strategy, metadata = json.encode(r.metadata),
    kwargs = json.encode(kwargs), stateless = stateless, created_at = lgrun.wall(), updated_at = lgrun.wall() })
  local key = run.key
  local res, xerr = self.redis:pipeline {
    { "XADD", key, "*", "type", "metadata", "data", json.encode { run_id = run_id, attempt = 1 } },
    { "EXPIRE", key, _M.KEY_TTL },
  }
  if res and type(res[1]) == "table" then res, xerr = nil, res[1][2] end
  local jid, qerr
  if res then
    -- (reject was answered above; the worker waits for a run finishing on the thread)
    local strategy = r.strategy == "reject" and "enqueue" or r.strategy
    local sok, a, b = pcall(self.client.submit, self.client, {
      job_id = run_id, thread_id = thread_id, user_id = ids.valid(user) and user or nil, script = s.name,
      input = r.command == nil and r.input or nil, multitask_strategy = strategy,
      run = { stream_mode = r.engine_modes, subgraphs = r.subgraphs, command = r.command,
        checkpoint_id = r.checkpoint_id, recursion_limit = r.recursion_limit, configurable = r.configurable,
        context = r.context, metadata = next(r.metadata) and r.metadata or nil, durability = r.durability,
        temporary = temporary or nil },
    })
    if not sok then jid, qerr = nil, a else jid, qerr = a, b end
  end
  if not jid then
    self.db:query("DELETE FROM langgraph_runs WHERE run_id = $1", { run_id })
    if not temporary then refresh(self, thread_id, s.app) end
    self.redis:call("DEL", key)
    return fail(503, "the run could not be queued: " .. error_message(qerr or xerr))
  end
  return run
end

-- the caller's run | nil, 404, msg (thread_id nil: a stateless run)
function B:run(user, thread_id, run_id)
  if type(run_id) ~= "string" or not ids.valid(run_id) then
    return fail(404, "run '" .. tostring(run_id) .. "' not found")
  end
  local rows, err = self.db:query("SELECT " .. RUN_COLUMNS .. " FROM langgraph_runs WHERE run_id = $1 AND user_id = $2",
    { run_id, who(user) })
  if not rows then return unavailable("the run could not be read", err) end
  local r = rows[1]
  if not r or (thread_id ~= nil and r.thread_id ~= thread_id) or (thread_id == nil and r.stateless ~= true) then
    return fail(404, "run '" .. tostring(run_id) .. "' not found")
  end
  return run_of(self, r)
end

-- run_list(user, thread_id, query) -> runs | nil, status, msg
function B:run_list(user, thread_id, query)
  local q, st, msg = lgrequest.run_list(query or {})
  if not q then return fail(st, msg) end
  local rec
  rec, st, msg = mine(self, user, thread_id)
  if not rec then return fail(st, msg) end
  local rows, err = self.db:query("SELECT " .. RUN_COLUMNS .. [[ FROM langgraph_runs
    WHERE thread_id = $1 AND ($2::text IS NULL OR status = $2)
    ORDER BY created_at DESC, run_id DESC LIMIT $3 OFFSET $4]],
    { thread_id, q.status or pg.null, q.limit, q.offset })
  if not rows then return unavailable("the runs could not be read", err) end
  local out = array()
  for i, r in ipairs(rows) do out[i] = embedded.run_json(run_of(self, r)) end
  return out
end

function B:run_cancel(user, thread_id, run_id, action, wait)
  local run, st, msg = self:run(user, thread_id, run_id)
  if not run then return fail(st, msg) end
  action = action or "interrupt"
  if action ~= "interrupt" and action ~= "rollback" then
    return fail(422, "action must be interrupt or rollback")
  end
  if FINAL[run.status] then return true end
  local ok, err = self.redis:call("SET", lg.cancel_key(self.prefix, run.run_id), action, "EX", _M.KEY_TTL)
  if not ok then return unavailable("the run could not be cancelled", err) end
  -- a run no worker started yet ends here: the worker that gets it finds it stopped
  local stopped = { error = action == "rollback" and "UserRollback" or "UserInterrupt",
    message = "cancelled (" .. action .. ") before it started" }
  local rows = self.db:query([[UPDATE langgraph_runs SET status = 'interrupted', error = $2::jsonb,
    updated_at = clock_timestamp() WHERE run_id = $1 AND status = 'pending' RETURNING run_id]],
    { run.run_id, json.encode(stopped) })
  if rows and rows[1] then
    events.finish(self.redis, run.key, { { "error", stopped }, { "done", { status = "interrupted",
      run_status = "interrupted", job_id = run.run_id } } }, { ttl = _M.KEY_TTL })
    if not run.stateless then
      local rec = mine(self, user, run.thread_id)
      if rec then refresh(self, run.thread_id, (app_of(self, rec))) end
    end
    return true
  end
  if wait then run:wait() end
  return true
end

function B:run_delete(user, thread_id, run_id)
  local run, st, msg = self:run(user, thread_id, run_id)
  if not run then return fail(st, msg) end
  if not FINAL[run.status] then return fail(409, "run '" .. run_id .. "' is still going: cancel it first") end
  local rows, err = self.db:query("DELETE FROM langgraph_runs WHERE run_id = $1", { run_id })
  if not rows then return unavailable("the run could not be deleted", err) end
  self.redis:call("DEL", run.key)
  return true
end

-- the output of a finished run: the thread's values (with __interrupt__
-- when it paused), or {__error__ = {error, message}} when it failed or was
-- stopped (cancelled, or by a later run's multitask_strategy)
function B:run_output(run)
  local r = run:wait()
  if r.status == "error" then return { __error__ = r.error or { error = "RunError", message = "the run failed" } } end
  if r.status == "interrupted" then
    return { __error__ = r.error or { error = "UserInterrupt", message = "the run was interrupted" } }
  end
  return r.output or {}
end

-- the thread's running (else first pending) run, for /threads/:id/stream | false
function B:thread_active_run(user, thread_id)
  local rec, st, msg = mine(self, user, thread_id)
  if not rec then return fail(st, msg) end
  local rows, err = self.db:query("SELECT " .. RUN_COLUMNS .. [[ FROM langgraph_runs
    WHERE thread_id = $1 AND status IN ('running', 'pending')
    ORDER BY status = 'running' DESC, created_at LIMIT 1]], { thread_id })
  if not rows then return unavailable("the runs could not be read", err) end
  return rows[1] and run_of(self, rows[1]) or false
end

---------------------------------------------------------------- a run's events

function Run:cursor(last_event_id)
  if type(last_event_id) == "string" and last_event_id:find("^%d+%-%d+$") then return last_event_id end
  return "0-0"
end

-- the run's row: status, output, error | nil, err
function Run:row()
  local rows, err = self.backend.db:query([[SELECT status, output::text AS output, error::text AS error
    FROM langgraph_runs WHERE run_id = $1]], { self.run_id })
  if not rows then return nil, err end
  local r = rows[1]
  if not r then return { status = "error", error = { error = "RunError", message = "the run was deleted" } } end
  return { status = r.status, output = decode(r.output), error = decode(r.error) }
end

-- the run is over when its stream has its done, or (its events expired)
-- its row says so
local function over(self)
  local r = self:row()
  return r ~= nil and FINAL[r.status] == true
end

--[[ events_after(cursor, timeout) -> {seq (the entry id), event, data}...,
done: what the job's event stream has after cursor, waiting up to timeout
seconds for something; done once the run's done event is read ]]
function Run:events_after(cursor, timeout)
  local block = math_max(1, math_floor((timeout or 15) * 1000))
  local redis_conn = self.backend.redis
  local res, err = redis_conn:call("XREAD", "COUNT", 256, "BLOCK", block, "STREAMS", self.key, cursor)
  local out = {}
  if res == nil and err ~= nil then
    mg.sleep(1)   -- Redis away: the stream goes on (with heartbeats) once it is back
    return out, false
  end
  if type(res) == "table" and res[1] then
    for _, e in ipairs(res[1][2]) do
      local ev = events.to_event(e)
      if ev.type == "done" then return out, true end
      out[#out + 1] = { seq = ev.id, event = ev.type, data = ev.raw or "{}" }
    end
    return out, false
  end
  if redis_conn:call("EXISTS", self.key) == 0 and over(self) then return out, true end
  return out, false
end

-- wait() -> the run's final row {status, output, error}
function Run:wait()
  local cursor = "0-0"
  local last_error
  while true do
    local r = self:row()
    if r and FINAL[r.status] then return r end
    local evs, done = self:events_after(cursor, 1)
    for _, ev in ipairs(evs) do
      cursor = ev.seq
      if ev.event == "error" then last_error = json.decode(ev.data) end
    end
    if done then
      r = self:row()
      if r and FINAL[r.status] then return r end
      -- the job ended without a result (refused by the workers)
      local e = type(last_error) == "table" and last_error or {}
      return { status = "error", error = { error = "RunError",
        message = tostring(e.message or e.error or "the run ended without a result") } }
    end
  end
end

-- stop(action): what a client that went away asks (on_disconnect = cancel)
function Run:stop(action)
  self.backend.redis:call("SET", lg.cancel_key(self.backend.prefix, self.run_id), action or "interrupt",
    "EX", _M.KEY_TTL)
end

return _M
