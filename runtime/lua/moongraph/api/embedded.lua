--[[
moongraph.api.embedded — the embedded backend of the LangGraph Agent API:
assistants, threads and runs of the scripts loaded into this process, runs
executed in-process as tasks, checkpoints and thread records in durable
local files under a data directory.

  local embedded = require "moongraph.api.embedded"
  local b = assert(embedded.new{
    data = ".moongraph",                               -- data directory
    scripts = { {name = "chat", path = "scripts/eco/chat.lua"}, ... },
  })

Every script is an assistant whose id is its name (the graph id). Layout
of the data directory:

  <data>/checkpoints/...            the threads' checkpoints (checkpoint.file)
  <data>/threads/<thread>.json      thread records: owner, metadata, status, values

Runs (their records and their event logs, which resumable streams replay)
live in this process: a restart keeps threads and checkpoints and forgets
runs; a run that was going when the process stopped has its last
checkpoint, and a new run on the thread with input null continues it.

Operations take decoded request bodies (tables) and the caller's user (nil
without API keys) and return a result, or nil, HTTP status, message. A
thread belongs to the user who created it: others get 404, as for an id
that does not exist. Events of a run are {seq, event, data} with data
already encoded as JSON; run:events_after(seq, timeout) waits for more.

multitask_strategy for a run on a busy thread: reject (the default: 409),
enqueue (runs after the ones before it), interrupt (the running run stops,
its checkpoints stay) and rollback (the running run stops and the thread
goes back to the checkpoint it started from). A run holds its thread's
lease from moongraph.multitask (a memory coordinator: runs of this process)
while it runs; the strategies are that module's.
]]

local mg = require "moongraph"
local json = require "moongraph.json"
local ids = require "moongraph.ids"
local core = require "moongraph.core"
local scripts = require "moongraph.worker.scripts"
local text = require "moongraph.text"
local public_error = require "moongraph.public_error"
local multitask = require "moongraph.multitask"
local lgrun = require "moongraph.langgraph_run"
local lgstate = require "moongraph.api.langgraph_state"
local lgassistants = require "moongraph.api.langgraph_assistants"
local lgrequest = require "moongraph.api.langgraph_request"

local type, pairs, ipairs, tostring, tonumber, setmetatable, pcall, error, next =
  type, pairs, ipairs, tostring, tonumber, setmetatable, pcall, error, next
local string_format, string_gsub, string_byte, string_char =
  string.format, string.gsub, string.byte, string.char
local table_sort, table_remove = table.sort, table.remove
local null = json.null
local array = json.array

local store = core.files

local _M = {}
local B = {}
B.__index = B
local Run = {}
Run.__index = Run

_M.STREAM_MODES = lgrun.STREAM_MODES
_M.STRATEGIES = lgrequest.STRATEGIES
_M.MAX_RUNS_PER_THREAD = 100   -- finished runs kept (with their events) per thread

---------------------------------------------------------------- helpers

local function isnull(v) return v == nil or v == null end

local wall, iso = lgrun.wall, lgrun.iso

local urandom
local function uuid4()
  if not urandom then urandom = io.open("/dev/urandom", "rb") end
  local b = urandom and urandom:read(16)
  if not b or #b ~= 16 then
    local t = {}
    for i = 1, 16 do t[i] = string_char(math.random(0, 255)) end
    b = table.concat(t)
  end
  local x = { string_byte(b, 1, 16) }
  x[7] = (x[7] & 0x0f) | 0x40
  x[9] = (x[9] & 0x3f) | 0x80
  return string_format("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
    table.unpack(x))
end
_M.uuid4 = uuid4

local function enc_char(c) return string_format("%%%02X", string_byte(c)) end
local function component(s) return (string_gsub(s, "[^%w_%-]", enc_char)) end

local function fail(status, msg) return nil, status, msg end

local object = lgrequest.object

local contains = lgstate.contains

---------------------------------------------------------------- construction

-- new{data = dir, scripts = {{name, path}, ...}} -> backend | nil, err
function _M.new(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'new': options table expected, got " .. type(opts), 2)
  end
  local data = opts.data or ".moongraph"
  if type(data) ~= "string" or data == "" then
    error("bad argument #1 to 'new': data must be a directory path", 2)
  end
  if type(opts.scripts) ~= "table" then
    error("bad argument #1 to 'new': scripts must be a list of {name =, path =}", 2)
  end
  data = data:gsub("/+$", "")
  local ok, err = store.mkdir(data .. "/threads")
  if not ok then return nil, "cannot create " .. data .. "/threads: " .. tostring(err) end
  local saver = mg.checkpoint.file(data .. "/checkpoints")
  local reg = scripts.new(opts.scripts, saver)
  local lok, lerr = reg:load()
  if not lok then return nil, lerr end
  for _, s in ipairs(reg.set.list) do
    if s.app.checkpointer == nil then
      return nil, "script '" .. s.name .. "': build{checkpointer = saver} must compile the graph with " ..
        "that checkpointer (threads need it)"
    end
  end
  local self = setmetatable({
    data = data, saver = saver, reg = reg,
    threads = {},       -- thread_id -> record (loaded from files)
    runs = {},          -- run_id -> run
    coord = multitask.memory(),   -- one run at a time per thread
    created = wall(),
  }, B)
  local names, lerr2, code = store.list(data .. "/threads")
  if not names and code ~= "ENOENT" then return nil, lerr2 end
  for _, n in ipairs(names or {}) do
    if n:match("%.json$") then
      local body = store.read(data .. "/threads/" .. n)
      local rec = body and json.decode(body)
      if type(rec) == "table" and type(rec.thread_id) == "string" then
        rec.runs = {}
        -- a run that was going when the last process stopped is over
        if rec.status == "busy" then rec.status = "idle" end
        self.threads[rec.thread_id] = rec
      end
    end
  end
  return self
end

---------------------------------------------------------------- assistants

lgassistants.install(B)
local function script_of(self, id) return lgassistants.script(self.reg, id) end

---------------------------------------------------------------- threads

local function thread_path(self, id)
  return self.data .. "/threads/" .. component(id) .. ".json"
end

local SAVED = { "thread_id", "owner", "created_at", "updated_at", "metadata", "status", "values",
  "interrupts", "error" }

local function save_thread(self, rec)
  if rec.deleted or rec.temporary then return true end
  local out = {}
  for _, k in ipairs(SAVED) do out[k] = rec[k] end
  local s, err = json.encode(out)
  if not s then return nil, "thread " .. rec.thread_id .. ": " .. err end
  return store.write(thread_path(self, rec.thread_id), s)
end

local function thread_json(rec)
  return { thread_id = rec.thread_id, created_at = iso(rec.created_at), updated_at = iso(rec.updated_at),
    metadata = rec.metadata or {}, status = rec.status, config = {},
    values = rec.values == nil and null or rec.values,
    interrupts = rec.interrupts or {}, error = rec.error }
end
_M.thread_json = thread_json

-- the caller's thread | nil, 404, msg
local function mine(self, user, id)
  local rec = type(id) == "string" and self.threads[id]
  if not rec or rec.owner ~= user or rec.temporary then
    return fail(404, "thread '" .. tostring(id) .. "' not found")
  end
  return rec
end

function B:thread_create(user, body)
  local q, st, msg = lgrequest.thread_create(body or {})
  if not q then return fail(st, msg) end
  body = q
  local metadata = q.metadata
  local id = q.thread_id
  if id == nil then id = uuid4()
  else
    local ok, err = ids.check(id, "thread_id")
    if not ok then return fail(422, err) end
  end
  local existing = self.threads[id]
  if existing then
    if existing.owner == user and body.if_exists == "do_nothing" then return thread_json(existing) end
    return fail(409, "thread '" .. id .. "' already exists")
  end
  if not isnull(body.supersteps) then
    return fail(422, "supersteps are not supported: create the thread, then update its state")
  end
  local now = wall()
  local rec = { thread_id = id, owner = user, created_at = now, updated_at = now,
    metadata = metadata, status = "idle", runs = {} }
  local ok, err = save_thread(self, rec)
  if not ok then return fail(503, "cannot store the thread: " .. tostring(err)) end
  self.threads[id] = rec
  return thread_json(rec)
end

function B:thread_get(user, id)
  local rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  return thread_json(rec)
end

function B:thread_patch(user, id, body)
  local q, st, msg = lgrequest.thread_patch(body or {})
  if not q then return fail(st, msg) end
  local rec
  rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  local metadata = q.metadata
  rec.metadata = rec.metadata or {}
  for k, v in pairs(metadata) do rec.metadata[k] = v end
  rec.updated_at = wall()
  local ok, err = save_thread(self, rec)
  if not ok then return fail(503, "cannot store the thread: " .. tostring(err)) end
  return thread_json(rec)
end

-- the caller's threads q selects, sorted as it asks
local function search(self, user, q)
  local metadata, values = q.metadata, q.values
  local want_ids
  if q.ids then
    want_ids = {}
    for _, i in ipairs(q.ids) do want_ids[i] = true end
  end
  local sort_by = q.sort_by or "created_at"
  local desc = q.sort_order ~= "asc"
  local list = {}
  for _, rec in pairs(self.threads) do
    if rec.owner == user and not rec.temporary and (q.status == nil or rec.status == q.status)
       and (not want_ids or want_ids[rec.thread_id])
       and contains(rec.metadata or {}, metadata) and contains(rec.values or {}, values) then
      list[#list + 1] = rec
    end
  end
  table_sort(list, function(a, b)
    local x, y = a[sort_by], b[sort_by]
    if x == y then x, y = a.thread_id, b.thread_id end
    if desc then return x > y end
    return x < y
  end)
  return list
end

-- thread_search(user, body) -> page, total | nil, 422, msg
function B:thread_search(user, body)
  local q, st, msg = lgrequest.thread_search(body or {})
  if not q then return fail(st, msg) end
  local list = search(self, user, q)
  local offset, limit = q.offset, q.limit
  local select = q.select
  local page = array()
  for i = offset + 1, math.min(#list, offset + limit) do
    local t = thread_json(list[i])
    if select then
      local s = {}
      for _, k in ipairs(select) do s[k] = t[k] end
      t = s
    end
    page[#page + 1] = t
  end
  return page, #list
end

-- thread_count(user, body) -> n | nil, 422, msg (body: metadata, values, status)
function B:thread_count(user, body)
  body = body or {}
  local q, st, msg = lgrequest.thread_search { metadata = body.metadata, values = body.values, status = body.status }
  if not q then return fail(st, msg) end
  return #search(self, user, q)
end

-- the thread's active run, or runs waiting for its lease
local function busy(rec)
  return rec.active ~= nil or (rec.queue and rec.queue[1] ~= nil)
end

function B:thread_delete(user, id)
  local rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  for _, q in ipairs(rec.queue or {}) do
    q.exec:cancel()
    q:finish("interrupted")
  end
  rec.queue = nil
  if rec.active then rec.active:stop("interrupt") end
  for _, r in ipairs(rec.runs or {}) do self.runs[r.run_id] = nil end
  rec.deleted = true
  self.threads[id] = nil
  mg.checkpoint.settle(self.saver, id)   -- the stopped run's last writes first
  local ok, err = self.saver:delete_thread(id)
  if not ok then return fail(503, "cannot delete the thread's checkpoints: " .. tostring(err)) end
  local rok, rerr, code = store.remove(thread_path(self, id))
  if not rok and code ~= "ENOENT" then return fail(503, "cannot delete the thread: " .. tostring(rerr)) end
  return true
end

---------------------------------------------------------------- state

local function app_of(self, rec)
  local gid = rec.metadata and rec.metadata.graph_id
  local s = script_of(self, gid)
  return s and s.app, gid
end

_M.interrupts_json = lgrun.interrupts_json
_M.state_json = lgstate.state_json

function B:thread_state(user, id, checkpoint_id)
  local rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  return lgstate.get(app_of(self, rec), id, checkpoint_id)
end

-- after a change of the thread's state: its values, interrupts and status
local function refresh(self, rec, app, status, errmsg)
  local snap = app and app:get_state { thread_id = rec.thread_id }
  if snap then
    local f = lgrun.thread_fields(snap)
    rec.values, rec.interrupts = f.values, f.interrupts
    if status == nil then status = f.status end
  end
  rec.status = status or "idle"
  rec.error = errmsg
  rec.updated_at = wall()
  return save_thread(self, rec)
end

function B:thread_update_state(user, id, body)
  local rec, st, msg = mine(self, user, id)
  if not rec then return fail(st, msg) end
  if busy(rec) then return fail(409, "thread '" .. id .. "' is busy: a run is going") end
  local q
  q, st, msg = lgrequest.state_update(body or {})
  if not q then return fail(st, msg) end
  local app, gid = app_of(self, rec)
  local out
  out, st, msg = lgstate.update(app, gid, id, q)
  if not out then return fail(st, msg) end
  refresh(self, rec, app)
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

local function run_json(run)
  return { run_id = run.run_id, thread_id = run.thread_id, assistant_id = run.assistant_id,
    created_at = iso(run.created_at), updated_at = iso(run.updated_at), status = run.status,
    metadata = run.metadata, multitask_strategy = run.multitask_strategy,
    kwargs = { stream_mode = run.stream_mode, stream_subgraphs = run.subgraphs,
      stream_resumable = true, config = run.config_in or {} } }
end
_M.run_json = run_json
function B:run_json(run) return run_json(run) end

-- an event of the run, kept for followers and later joins
function Run:publish(event, data)
  local s, err = json.encode(data, { valid_utf8 = true })
  if not s then
    event, s = "error", json.encode({ error = "EncodingError",
      message = "a " .. event .. " event cannot be sent as JSON: " .. err }, { valid_utf8 = true })
  end
  local seq = #self.events + 1
  self.events[seq] = { seq = seq, event = event, data = s }
  self:wake()
end

function Run:wake()
  local w = self.waiters
  if w[1] then
    self.waiters = {}
    for _, q in ipairs(w) do q:put(true) end
  end
end

-- cursor(last_event_id) -> where a stream that got that event id goes on
-- (nil or not an event id of this run: from the start)
function Run:cursor(last_event_id)
  if type(last_event_id) ~= "string" or not last_event_id:find("^%d+$") or #last_event_id > 15 then return 0 end
  return math.min(tonumber(last_event_id), #self.events)
end

-- events_after(seq [, timeout]) -> list of events after seq (maybe empty on
-- timeout), done: waits for at least one event unless the run is over.
function Run:events_after(seq, timeout)
  local ev = self.events
  if #ev <= seq and not self.done then
    local q = mg.queue()
    self.waiters[#self.waiters + 1] = q
    q:get(timeout)
    for i, x in ipairs(self.waiters) do
      if x == q then table_remove(self.waiters, i) break end
    end
  end
  local out = {}
  for i = seq + 1, #ev do out[#out + 1] = ev[i] end
  return out, self.done and #ev <= seq + #out
end

-- the run is over (status set, followers released). A run that ends
-- interrupted (cancelled, or stopped by a later run's multitask_strategy)
-- says so with an error event (UserInterrupt, UserRollback), so neither
-- its stream nor its wait looks like a success.
function Run:finish(status)
  if self.done then return end
  if status == "interrupted" and not self.stop_told then
    self.stop_told = true
    local by = self.stopped_by
    self:publish("error", { error = self.stop_action == "rollback" and "UserRollback" or "UserInterrupt",
      message = by and by.by and ("stopped by run " .. tostring(by.by) .. " (multitask_strategy " ..
        tostring(by.strategy) .. ")") or "the run was cancelled" })
  end
  self.status = status
  self.updated_at = wall()
  self.done = true
  self:wake()
  for _, q in ipairs(self.joiners) do q:put(true) end
  self.joiners = {}
end

-- wait() -> waits until the run is over
function Run:wait()
  if self.done then return end
  local q = mg.queue()
  self.joiners[#self.joiners + 1] = q
  q:get()
end

-- ask the run to stop: "interrupt" keeps its checkpoints, "rollback" takes
-- the thread back to where the run started
function Run:stop(action, by)
  if self.done then return end
  self.stop_action = action or "interrupt"
  self.stopped_by = by
  if self.task and not self.task:done() then self.task:cancel() end
end

local translate = lgrun.translate

-- Runs one run to its end (in its own task), then starts the next queued.
local function run_body(self, rec, run)
  run.status = "running"
  run.updated_at = wall()
  rec.status = "busy"
  local app = run.app
  local cfg = { thread_id = run.thread_id, run_id = run.run_id, stream_mode = run.engine_modes,
    subgraphs = run.subgraphs, recursion_limit = run.recursion_limit,
    checkpoint_id = run.checkpoint_id, context = run.context, configurable = run.configurable,
    metadata = run.metadata, durability = run.durability }
  -- where the run starts, for a rollback
  local before = app:get_state { thread_id = run.thread_id }
  if before then run.from = before.config and before.config.checkpoint_id or "" end
  local input = run.input
  local failure
  if not run.stop_action then
    run.task = mg.spawn(function()
      for ev in app:stream(input, cfg) do
        if run.modes[ev.mode] then
          local name, data = translate(run, ev)
          run:publish(name, data)
        end
      end
    end)
    local ok, err = run.task:join()
    if not ok and err ~= "cancelled" then failure = err end
  end
  local status
  if run.stop_action then
    if run.stop_action == "rollback" then
      mg.checkpoint.settle(self.saver, run.thread_id)
      if run.from == "" then
        self.saver:delete_thread(run.thread_id)
      elseif run.from then
        pcall(app.update_state, app, { thread_id = run.thread_id, checkpoint_id = run.from }, nil)
      end
    end
    status = "interrupted"
    refresh(self, rec, app)
  elseif failure then
    -- the client learns which node failed; the detail is the server's
    local msg = text.error_message(failure)
    io.stderr:write("moongraph serve: run ", run.run_id, " failed: ", msg, "\n")
    io.stderr:flush()
    local public = public_error.message(failure, "run " .. run.run_id)
    run:publish("error", { error = "GraphError", message = public })
    status = "error"
    refresh(self, rec, app, "error", public)
  else
    status = "success"
    refresh(self, rec, app)
  end
  -- the run's output (what wait and join answer), taken before a
  -- stateless run's thread goes away
  local snap = app:get_state { thread_id = run.thread_id }
  if snap then
    local out, list = lgrun.output(snap)
    if list then
      if status == "success" then
        if run.modes.values then run:publish("values", { __interrupt__ = list }) end
        if run.modes.updates then run:publish("updates", { __interrupt__ = list }) end
      end
    end
    run.output = out
  end
  if run.temporary then
    mg.checkpoint.settle(self.saver, run.thread_id)
    self.saver:delete_thread(run.thread_id)
    self.threads[run.thread_id] = nil
    store.remove(thread_path(self, run.thread_id))
  end
  return status
end

-- the thread's lease for a run; when another run interrupts or rolls back
-- this one, it stops
local function acquire(self, run, strategy)
  return self.coord:acquire(run.thread_id, { run_id = run.run_id, strategy = strategy,
    on_preempt = function(p) run:stop(p.strategy, p) end })
end

local function leave_queue(rec, run)
  for i, q in ipairs(rec.queue or {}) do
    if q == run then table_remove(rec.queue, i) return end
  end
end

-- Runs one run to its end, in its own task: with the thread's lease, or
-- first waits for it (a pending run; cancelling it cancels this task while
-- it waits). Whatever happens, the run finishes and the lease goes to the
-- next run.
local function execute(self, rec, run, lease)
  if not lease then
    local err
    lease, err = acquire(self, run, run.multitask_strategy)
    leave_queue(rec, run)
    if not lease then
      run:publish("error", { error = "BusyError", message = "thread '" .. run.thread_id .. "': " .. tostring(err) })
      run:finish("error")
      return
    end
    rec.active = run
  end
  local ok, status = xpcall(run_body, debug.traceback, self, rec, run)
  if not ok then
    io.stderr:write("moongraph serve: run ", run.run_id, ": ", tostring(status), "\n")
    run:publish("error", { error = "InternalError", message = "the run failed inside the server" })
    rec.status = "error"
    status = "error"
  end
  if rec.active == run then rec.active = nil end
  -- the next run gets the thread before followers of this one wake up
  lease:release()
  run:finish(status)
end

--[[ run_create(user, thread_id | nil, body) -> run | nil, status, msg
thread_id nil: a stateless run (on a temporary thread, deleted when the run
ends unless on_completion = "keep"). The run starts at once, or waits its
turn (enqueue); see the module's note on multitask_strategy. ]]
function B:run_create(user, thread_id, body)
  local r, st, msg = lgrequest.run(body)
  if not r then return fail(st, msg) end
  local s = script_of(self, body.assistant_id)
  if not s then return fail(404, "assistant '" .. tostring(body.assistant_id) .. "' not found") end
  local strategy = r.strategy
  local rec
  local temporary, stateless = false, thread_id == nil
  if thread_id == nil then
    thread_id = uuid4()
    temporary = r.on_completion ~= "keep"
    local now = wall()
    rec = { thread_id = thread_id, owner = user, created_at = now, updated_at = now,
      metadata = { graph_id = s.name, assistant_id = s.name }, status = "idle", runs = {},
      temporary = temporary or nil }
    self.threads[thread_id] = rec
  else
    rec, st, msg = mine(self, user, thread_id)
    if not rec then
      if r.if_not_exists == "create" and not self.threads[thread_id] then
        local t, cst, cmsg = self:thread_create(user, { thread_id = thread_id })
        if not t then return fail(cst, cmsg) end
        rec = self.threads[thread_id]
      else
        return fail(st, msg)
      end
    end
    local gid = rec.metadata and rec.metadata.graph_id
    if gid ~= nil and gid ~= s.name then
      return fail(409, "thread '" .. thread_id .. "' belongs to graph '" .. tostring(gid) ..
        "', not '" .. s.name .. "'")
    end
  end
  local run_id = uuid4()
  local run
  -- the thread's lease now when the thread is free; else the run waits for
  -- it by its strategy (reject: 409)
  local lease = self.coord:acquire(thread_id, { run_id = run_id, strategy = "reject",
    on_preempt = function(p) run:stop(p.strategy, p) end })
  if not lease and strategy == "reject" then
    return fail(409, "thread '" .. thread_id .. "' is already running a run; wait for it to finish " ..
      "or choose another multitask_strategy (enqueue, interrupt, rollback)")
  end
  if not (rec.metadata and rec.metadata.graph_id) then
    rec.metadata = rec.metadata or {}
    rec.metadata.graph_id = s.name
    rec.metadata.assistant_id = s.name
  end
  local now = wall()
  run = setmetatable({
    run_id = run_id, thread_id = thread_id, assistant_id = s.name, owner = user,
    created_at = now, updated_at = now, status = "pending",
    metadata = r.metadata, multitask_strategy = strategy, stream_mode = r.names,
    modes = r.modes, engine_modes = r.engine_modes, subgraphs = r.subgraphs,
    input = r.input, checkpoint_id = r.checkpoint_id, config_in = r.config, durability = r.durability,
    recursion_limit = r.recursion_limit, configurable = r.configurable, context = r.context,
    app = s.app, temporary = temporary, stateless = stateless,
    events = {}, waiters = {}, joiners = {}, done = false,
  }, Run)
  self.runs[run.run_id] = run
  rec.runs[#rec.runs + 1] = run
  -- forget the oldest finished runs of a long-lived thread
  while #rec.runs > _M.MAX_RUNS_PER_THREAD do
    local old = rec.runs[1]
    if not old.done then break end
    table_remove(rec.runs, 1)
    self.runs[old.run_id] = nil
  end
  run:publish("metadata", { run_id = run.run_id, attempt = 1 })
  rec.status = "busy"
  rec.updated_at = now
  save_thread(self, rec)
  if lease then
    rec.active = run
  else
    rec.queue = rec.queue or {}
    rec.queue[#rec.queue + 1] = run
  end
  run.exec = mg.spawn(execute, self, rec, run, lease)
  return run
end

-- the caller's run | nil, 404, msg (thread_id nil: a stateless run)
function B:run(user, thread_id, run_id)
  local run = type(run_id) == "string" and self.runs[run_id]
  if not run or run.owner ~= user or (thread_id ~= nil and run.thread_id ~= thread_id)
     or (thread_id == nil and not run.stateless) then
    return fail(404, "run '" .. tostring(run_id) .. "' not found")
  end
  return run
end

-- run_list(user, thread_id, query) -> runs | nil, status, msg
function B:run_list(user, thread_id, query)
  local q, st, msg = lgrequest.run_list(query or {})
  if not q then return fail(st, msg) end
  local rec
  rec, st, msg = mine(self, user, thread_id)
  if not rec then return fail(st, msg) end
  local out = array()
  local offset, limit = q.offset, q.limit
  local n = 0
  for i = #rec.runs, 1, -1 do
    local r = rec.runs[i]
    if q.status == nil or r.status == q.status then
      n = n + 1
      if n > offset and #out < limit then out[#out + 1] = run_json(r) end
    end
  end
  return out
end

function B:run_cancel(user, thread_id, run_id, action, wait)
  local run, st, msg = self:run(user, thread_id, run_id)
  if not run then return fail(st, msg) end
  action = action or "interrupt"
  if action ~= "interrupt" and action ~= "rollback" then
    return fail(422, "action must be interrupt or rollback")
  end
  if run.done then return true end
  local rec = self.threads[run.thread_id]
  if run.status == "pending" and rec and rec.active ~= run then
    -- still waiting for the thread: it leaves the coordinator's queue
    run.exec:cancel()
    leave_queue(rec, run)
    run:finish("interrupted")
    if not busy(rec) then refresh(self, rec, run.app) end
    return true
  end
  run:stop(action)
  if wait then run:wait() end
  return true
end

function B:run_delete(user, thread_id, run_id)
  local run, st, msg = self:run(user, thread_id, run_id)
  if not run then return fail(st, msg) end
  if not run.done then return fail(409, "run '" .. run_id .. "' is still going: cancel it first") end
  self.runs[run_id] = nil
  local rec = self.threads[run.thread_id]
  if rec then
    for i, r in ipairs(rec.runs) do
      if r == run then table_remove(rec.runs, i) break end
    end
  end
  return true
end

-- the output of a finished run: the thread's values (with __interrupt__
-- when it paused), or {__error__ = {error, message}} when it failed or was
-- stopped
function B:run_output(run)
  run:wait()
  if run.status == "error" or run.status == "interrupted" then
    for i = #run.events, 1, -1 do
      local e = run.events[i]
      if e.event == "error" then return { __error__ = json.decode(e.data) } end
    end
  end
  return run.output or {}
end

-- the thread's active run (for /threads/:id/stream) | nil
function B:thread_active_run(user, thread_id)
  local rec, st, msg = mine(self, user, thread_id)
  if not rec then return fail(st, msg) end
  return rec.active or false
end

return _M
