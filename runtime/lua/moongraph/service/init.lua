--[[
moongraph.service — what `moongraph serve` serves, written once: the
assistants (the scripts loaded), their threads, runs with their event
logs, over two plug points chosen independently:

  storage   where thread and run records live
              moongraph.service.files      local files under a data directory
              moongraph.service.postgres   PostgreSQL tables
  executor  where runs run
              moongraph.service.tasks      tasks in this process
              moongraph.service.jobs       jobs on the Redis queue, run by `moongraph worker`

  local service = require "moongraph.service"
  local svc = assert(service.new {
    storage = assert(require("moongraph.service.files").open(".moongraph")),
    executor = require("moongraph.service.tasks").new(),
    scripts = { {name = "agent", path = "agent.lua"}, ... },
  })

The storage also gives the checkpoint saver the scripts are built with
(storage.saver), so a thread's state is where its records are.

Route modules (moongraph.api.langgraph) translate HTTP to these calls.
Operations take decoded request bodies (tables) and the caller's user (nil
without API keys) and return a result, or nil, HTTP status, message. A
thread belongs to the user who created it: others get 404, as for an id
that does not exist. A storage that fails answers 503.

  assistants   svc:assistants_search(body), assistants_count, assistant(id),
               assistant_graph(id), assistant_schemas(id)
  threads      svc:thread_create(user, body), thread_get, thread_patch,
               thread_search -> page, total; thread_count; thread_delete;
               thread_state(user, id, checkpoint_id); thread_update_state;
               thread_history; thread_active_run -> run | false
  runs         svc:run_create(user, thread_id | nil, body) -> run;
               svc:run(user, thread_id, run_id); run_list; run_cancel(user,
               thread_id, run_id, action, wait); run_delete; run_output(run);
               run_json(run)

A run (what run_create, run and thread_active_run give) has the fields of
its record (run_id, thread_id, assistant_id, status, ...) and:

  run:cursor(last_event_id) -> where a stream that got that event goes on
  run:events_after(cursor, timeout) -> {{seq, event, data (JSON text)}...}, done
  run:wait() -> the run's final record {status, output, error}
  run:stop(action)   what a client that went away asks (interrupt | rollback)

A run is admitted atomically by the storage (the thread is the caller's,
of the run's graph, and — multitask_strategy reject — has no pending or
running run: else 409), then handed to the executor: enqueue waits for the
runs before it, interrupt and rollback stop the one that holds the thread.
Run records are durable in both storages: a run that was pending or
running when its process stopped is marked failed with the reason when an
in-process executor starts again (the thread keeps its last checkpoint; a
new run with input null continues it); a worker that dies mid-run has its
job taken over by another (moongraph.worker).
]]

local ids = require "moongraph.ids"
local json = require "moongraph.json"
local text = require "moongraph.text"
local scripts_mod = require "moongraph.worker.scripts"
local lgrun = require "moongraph.langgraph_run"
local lgstate = require "moongraph.api.langgraph_state"
local lgassistants = require "moongraph.api.langgraph_assistants"
local lgrequest = require "moongraph.api.langgraph_request"

local type, ipairs, tostring, setmetatable, error = type, ipairs, tostring, setmetatable, error
local null, array = json.null, json.array
local wall, iso = lgrun.wall, lgrun.iso
local error_message = text.error_message

local _M = {}
local S = {}
S.__index = S
lgassistants.install(S)

-- Finished runs kept per thread (with their events), and stateless runs
-- kept in all; older finished ones are deleted as new ones come.
_M.MAX_RUNS_PER_THREAD = 100
_M.MAX_STATELESS_RUNS = 1000

_M.FINAL = { success = true, error = true, interrupted = true }

local function isnull(v) return v == nil or v == null end
local function fail(status, msg) return nil, status, msg end
local function unavailable(what, err) return nil, 503, what .. ": " .. error_message(err) end

-- the user as stored: "" without API keys
local function who(user) return user or "" end

---------------------------------------------------------------- shapes

function _M.thread_json(rec)
  return { thread_id = rec.thread_id, created_at = iso(rec.created_at), updated_at = iso(rec.updated_at),
    metadata = rec.metadata or {}, status = rec.status, config = {},
    values = rec.values == nil and null or rec.values,
    interrupts = rec.interrupts or {}, error = rec.error }
end
local thread_json = _M.thread_json

function _M.run_json(run)
  local kw = run.kwargs or {}
  return { run_id = run.run_id, thread_id = run.thread_id, assistant_id = run.assistant_id,
    created_at = iso(run.created_at), updated_at = iso(run.updated_at), status = run.status,
    metadata = run.metadata or {}, multitask_strategy = run.multitask_strategy,
    kwargs = { stream_mode = kw.stream_mode, stream_subgraphs = kw.stream_subgraphs == true,
      stream_resumable = true, config = kw.config or {} } }
end
function S:run_json(run) return _M.run_json(run) end

---------------------------------------------------------------- construction

--[[ new{storage, executor, scripts = {{name, path}, ...}} -> service | nil, err
Loads the scripts (each must compile its graph with the checkpointer
build{} gets: threads need it), then starts the executor, which settles
what an earlier process left (moongraph.service.tasks). ]]
function _M.new(opts)
  if type(opts) ~= "table" or type(opts.storage) ~= "table" or type(opts.executor) ~= "table" then
    error("bad argument #1 to 'new' (a table with storage and executor expected)", 2)
  end
  if type(opts.scripts) ~= "table" then
    error("bad argument #1 to 'new': scripts must be a list of {name =, path =}", 2)
  end
  local storage = opts.storage
  local reg = scripts_mod.new(opts.scripts, storage.saver)
  local ok, err = reg:load()
  if not ok then return nil, err end
  for _, s in ipairs(reg.set.list) do
    if s.app.checkpointer == nil then
      return nil, "script '" .. s.name .. "': build{checkpointer = saver} must compile the graph with " ..
        "that checkpointer (threads need it)"
    end
  end
  local self = setmetatable({ storage = storage, executor = opts.executor, reg = reg,
    saver = storage.saver, created = wall() }, S)
  ok, err = opts.executor:attach(self)
  if not ok then return nil, err end
  return self
end

function S:close()
  self.executor:close()
  self.storage:close()
end

---------------------------------------------------------------- threads

local function script_of(self, id) return lgassistants.script(self.reg, id) end

function S:app_of(rec)
  local gid = rec and rec.metadata and rec.metadata.graph_id
  local s = script_of(self, gid)
  return s and s.app, gid
end

local function not_found(id) return fail(404, "thread '" .. tostring(id) .. "' not found") end

-- the caller's thread record | nil, 404 | nil, 503
function S:mine(user, id)
  if not ids.valid(id) then return not_found(id) end
  local rec, err = self.storage:thread(id)
  if rec == nil then return unavailable("the thread could not be read", err) end
  if not rec or rec.owner ~= who(user) then return not_found(id) end
  return rec
end

function S:thread_create(user, body)
  local q, st, msg = lgrequest.thread_create(body or {})
  if not q then return fail(st, msg) end
  local id = q.thread_id
  if id == nil then id = ids.uuid4()
  else
    local ok, err = ids.check(id, "thread_id")
    if not ok then return fail(422, err) end
  end
  if not isnull(q.supersteps) then
    return fail(422, "supersteps are not supported: create the thread, then update its state")
  end
  local now = wall()
  local rec = { thread_id = id, owner = who(user), created_at = now, updated_at = now,
    metadata = q.metadata, status = "idle" }
  local made, err = self.storage:thread_insert(rec)
  if made == nil then return unavailable("the thread could not be stored", err) end
  if made then return thread_json(made) end
  if q.if_exists == "do_nothing" then
    local old = self:mine(user, id)
    if old then return thread_json(old) end
  end
  return fail(409, "thread '" .. id .. "' already exists")
end

function S:thread_get(user, id)
  local rec, st, msg = self:mine(user, id)
  if not rec then return fail(st, msg) end
  return thread_json(rec)
end

function S:thread_patch(user, id, body)
  local q, st, msg = lgrequest.thread_patch(body or {})
  if not q then return fail(st, msg) end
  if not ids.valid(id) then return not_found(id) end
  local rec, err = self.storage:thread_merge_metadata(id, who(user), q.metadata)
  if rec == nil then return unavailable("the thread could not be stored", err) end
  if not rec then return not_found(id) end
  return thread_json(rec)
end

-- thread_search(user, body) -> page, total | nil, status, msg
function S:thread_search(user, body)
  local q, st, msg = lgrequest.thread_search(body or {})
  if not q then return fail(st, msg) end
  local list, total = self.storage:thread_search(who(user), q)
  if not list then return unavailable("the threads could not be read", total) end
  local select = q.select
  local page = array()
  for i, rec in ipairs(list) do
    local t = thread_json(rec)
    if select then
      local s = {}
      for _, k in ipairs(select) do s[k] = t[k] end
      t = s
    end
    page[i] = t
  end
  return page, total
end

-- thread_count(user, body) -> n | nil, status, msg (body: metadata, values, status)
function S:thread_count(user, body)
  body = body or {}
  local q, st, msg = lgrequest.thread_search { metadata = body.metadata, values = body.values, status = body.status }
  if not q then return fail(st, msg) end
  q.limit, q.offset = 0, 0
  local list, total = self.storage:thread_search(who(user), q)
  if not list then return unavailable("the threads could not be counted", total) end
  return total
end

-- Deleting a thread stops its runs and removes its runs and checkpoints.
function S:thread_delete(user, id)
  if not ids.valid(id) then return not_found(id) end
  local going, err = self.storage:thread_delete(id, who(user))
  if going == nil then return unavailable("the thread could not be deleted", err) end
  if not going then return not_found(id) end
  self.executor:thread_deleted(id, going)
  local ok, derr = self.saver:delete_thread(id)
  if not ok then return unavailable("cannot delete the thread's checkpoints", derr) end
  return true
end

function S:thread_state(user, id, checkpoint_id)
  local rec, st, msg = self:mine(user, id)
  if not rec then return fail(st, msg) end
  return lgstate.get(self:app_of(rec), id, checkpoint_id)
end

--[[ refresh(thread_id, app [, status, errmsg, except_run, snap]) -> true |
nil, err: after a change of the thread's state (or of its runs), its
values, interrupts and status from its latest checkpoint (snap: that
state, when the caller has just read it). The thread stays busy while a
run of it (other than except_run) is pending or running. ]]
function S:refresh(thread_id, app, status, errmsg, except_run, snap)
  if snap == nil then snap = app and app:get_state { thread_id = thread_id } end
  local f = snap and lgrun.thread_fields(snap) or { interrupts = {}, status = "idle" }
  return self.storage:thread_set(thread_id, { values = f.values, interrupts = f.interrupts,
    status = status or f.status, error = errmsg, except_run = except_run })
end

function S:thread_update_state(user, id, body)
  local rec, st, msg = self:mine(user, id)
  if not rec then return fail(st, msg) end
  local going, err = self.storage:run_active(id)
  if going == nil then return unavailable("the thread's runs could not be read", err) end
  if going then return fail(409, "thread '" .. id .. "' is busy: a run is going") end
  local q
  q, st, msg = lgrequest.state_update(body or {})
  if not q then return fail(st, msg) end
  local app, gid = self:app_of(rec)
  local out
  out, st, msg = lgstate.update(app, gid, id, q)
  if not out then return fail(st, msg) end
  self:refresh(id, app)
  return out
end

function S:thread_history(user, id, body)
  local q, st, msg = lgrequest.history(body or {})
  if not q then return fail(st, msg) end
  local rec
  rec, st, msg = self:mine(user, id)
  if not rec then return fail(st, msg) end
  return lgstate.history(self:app_of(rec), id, q)
end

-- the thread's running (else first pending) run, for /threads/:id/stream | false
function S:thread_active_run(user, thread_id)
  local rec, st, msg = self:mine(user, thread_id)
  if not rec then return fail(st, msg) end
  local r, err = self.storage:run_active(thread_id)
  if r == nil then return unavailable("the runs could not be read", err) end
  return r and self.executor:handle(r) or false
end

---------------------------------------------------------------- runs

local function busy_msg(thread_id)
  return "thread '" .. thread_id .. "' is already running a run; wait for it to finish " ..
    "or choose another multitask_strategy (enqueue, interrupt, rollback)"
end

--[[ run_create(user, thread_id | nil, body) -> run | nil, status, msg
thread_id nil: a stateless run (on a temporary thread, deleted when the run
ends unless on_completion = "keep"). ]]
function S:run_create(user, thread_id, body)
  local r, st, msg = lgrequest.run(body)
  if not r then return fail(st, msg) end
  local s = script_of(self, body.assistant_id)
  if not s then return fail(404, "assistant '" .. tostring(body.assistant_id) .. "' not found") end
  local stateless = thread_id == nil
  local temporary = stateless and r.on_completion ~= "keep"
  if stateless then
    thread_id = ids.uuid4()
    if not temporary then
      local t, cst, cmsg = self:thread_create(user, { thread_id = thread_id,
        metadata = { graph_id = s.name, assistant_id = s.name } })
      if not t then return fail(cst, cmsg) end
    end
  elseif not ids.valid(thread_id) then
    return not_found(thread_id)
  elseif r.if_not_exists == "create" then
    -- (a thread of another user stays theirs: 404 below)
    local t, cst, cmsg = self:thread_create(user, { thread_id = thread_id, if_exists = "do_nothing" })
    if not t and cst ~= 409 then return fail(cst, cmsg) end
  end
  local now = wall()
  local rec = { run_id = ids.uuid4(), thread_id = thread_id, owner = who(user), assistant_id = s.name,
    status = "pending", multitask_strategy = r.strategy, metadata = r.metadata,
    kwargs = { stream_mode = r.names, stream_subgraphs = r.subgraphs, stream_resumable = true, config = r.config },
    stateless = stateless, temporary = temporary or nil, executor = self.executor.id,
    created_at = now, updated_at = now }
  local ok, refusal, err = self.storage:run_admit(rec, { graph = s.name, reject = r.strategy == "reject" })
  if ok == nil then return unavailable("the run could not be stored", refusal) end
  if not ok then
    if refusal == "busy" then return fail(409, busy_msg(thread_id)) end
    if refusal == "graph" then
      return fail(409, "thread '" .. thread_id .. "' belongs to graph '" .. tostring(err) .. "', not '" ..
        s.name .. "'")
    end
    return not_found(thread_id)
  end
  local run, serr = self.executor:submit(rec, r, s)
  if not run then
    self.storage:run_delete(rec.run_id)
    if not temporary then self:refresh(thread_id, s.app) end
    return unavailable("the run could not be queued", serr)
  end
  self.storage:runs_prune(not stateless and thread_id or nil,
    stateless and _M.MAX_STATELESS_RUNS or _M.MAX_RUNS_PER_THREAD)
  return run
end

-- the caller's run | nil, 404, msg (thread_id nil: a stateless run)
function S:run(user, thread_id, run_id)
  if not ids.valid(run_id) then return fail(404, "run '" .. tostring(run_id) .. "' not found") end
  local r, err = self.storage:run(run_id)
  if r == nil then return unavailable("the run could not be read", err) end
  if not r or r.owner ~= who(user) or (thread_id ~= nil and r.thread_id ~= thread_id)
     or (thread_id == nil and not r.stateless) then
    return fail(404, "run '" .. tostring(run_id) .. "' not found")
  end
  return self.executor:handle(r)
end

-- run_list(user, thread_id, query) -> runs | nil, status, msg (newest first)
function S:run_list(user, thread_id, query)
  local q, st, msg = lgrequest.run_list(query or {})
  if not q then return fail(st, msg) end
  local rec
  rec, st, msg = self:mine(user, thread_id)
  if not rec then return fail(st, msg) end
  local list, err = self.storage:thread_runs(thread_id, q)
  if not list then return unavailable("the runs could not be read", err) end
  local out = array()
  for i, r in ipairs(list) do out[i] = _M.run_json(r) end
  return out
end

function S:run_cancel(user, thread_id, run_id, action, wait)
  local run, st, msg = self:run(user, thread_id, run_id)
  if not run then return fail(st, msg) end
  action = action or "interrupt"
  if action ~= "interrupt" and action ~= "rollback" then
    return fail(422, "action must be interrupt or rollback")
  end
  if _M.FINAL[run.status] then return true end
  return self.executor:cancel(run, action, wait)
end

function S:run_delete(user, thread_id, run_id)
  local run, st, msg = self:run(user, thread_id, run_id)
  if not run then return fail(st, msg) end
  if not _M.FINAL[run.status] then return fail(409, "run '" .. run_id .. "' is still going: cancel it first") end
  local ok, err = self.storage:run_delete(run_id)
  if not ok then return unavailable("the run could not be deleted", err) end
  self.executor:forget(run)
  return true
end

-- the output of a finished run: the thread's values (with __interrupt__
-- when it paused), or {__error__ = {error, message}} when it failed or was
-- stopped (cancelled, or by a later run's multitask_strategy)
function S:run_output(run)
  local r = run:wait()
  if r.status == "error" then return { __error__ = r.error or { error = "RunError", message = "the run failed" } } end
  if r.status == "interrupted" then
    return { __error__ = r.error or { error = "UserInterrupt", message = "the run was interrupted" } }
  end
  return r.output or {}
end

return _M
