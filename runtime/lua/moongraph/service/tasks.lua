--[[
moongraph.service.tasks — the service's executor that runs each run as a
task in this process, one run at a time per thread (a memory coordinator
of moongraph.multitask hands out the threads' leases).

  local tasks = require "moongraph.service.tasks"
  local ex = tasks.new()   -- given to moongraph.service.new{executor = ex}

A run's events are kept in memory while it goes (followers wait on them)
and written to the storage with its final record when it ends, so a
finished run is joined and replayed from the storage, also after a
restart. When the executor starts it settles what an earlier process left:
each run still pending or running is marked failed, its reason in its
record and its event log; the thread keeps its last checkpoint, and a new
run with input null continues it.

multitask_strategy for a run on a busy thread: enqueue (runs after the
ones before it), interrupt (the running run stops, its checkpoints stay)
and rollback (the running run stops and the thread goes back to the
checkpoint it started from); reject is answered when the storage admits
the run.
]]

local mg = require "moongraph"
local json = require "moongraph.json"
local text = require "moongraph.text"
local public_error = require "moongraph.public_error"
local multitask = require "moongraph.multitask"
local lgrun = require "moongraph.langgraph_run"
local wconfig = require "moongraph.worker.config"
local service = require "moongraph.service"

local type, pairs, ipairs, tostring, tonumber, setmetatable, pcall, xpcall =
  type, pairs, ipairs, tostring, tonumber, setmetatable, pcall, xpcall
local table_remove = table.remove
local wall = lgrun.wall

local _M = {}
local X = {}
X.__index = X
local Run = {}
Run.__index = Run

_M.LOST = "the server stopped before the run finished; the thread keeps its last checkpoint " ..
  "(a new run with input null continues it)"

-- new([{id}]) -> executor. id: what its runs' records name as their
-- executor (default "tasks@<host>"): a storage shared by several processes
-- settles only the runs of the executor that starts.
function _M.new(opts)
  opts = opts or {}
  return setmetatable({ id = opts.id or ("tasks@" .. (wconfig.hostname() or "localhost")), live = {}, threads = {},
    coord = multitask.memory() }, X)
end

-- the thread's runs in this process: {active = run, queue = {run...}}
function X:_thread(id)
  local t = self.threads[id]
  if not t then t = { queue = {} }; self.threads[id] = t end
  return t
end

function X:_done_with(thread_id)
  local t = self.threads[thread_id]
  if t and not t.active and not t.queue[1] then self.threads[thread_id] = nil end
end

-- attach(service): settles the runs an earlier process of this executor left
function X:attach(svc)
  self.svc, self.storage = svc, svc.storage
  local list, err = self.storage:runs_unfinished(self.id)
  if not list then return nil, "the runs could not be read: " .. text.error_message(err) end
  for _, r in ipairs(list) do
    local e = { error = "RunError", message = _M.LOST }
    local events = { { seq = 1, event = "metadata", data = json.encode { run_id = r.run_id, attempt = 1 } },
      { seq = 2, event = "error", data = json.encode(e) } }
    local ok, serr = self.storage:run_set(r.run_id, { status = "error", error = e, events = events })
    if ok == nil then return nil, "run " .. r.run_id .. ": " .. text.error_message(serr) end
    if not r.temporary then
      local th = self.storage:thread(r.thread_id)
      if th then svc:refresh(r.thread_id, (svc:app_of(th)), nil, nil, r.run_id) end
    end
  end
  return true
end

function X:close() end

---------------------------------------------------------------- a run's events

local function new_run(rec, fields)
  local run = setmetatable(fields or {}, Run)
  for k, v in pairs(rec) do run[k] = v end
  run.events, run.waiters, run.joiners = run.events or {}, {}, {}
  return run
end

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

-- wait() -> the run's final record {status, output, error}
function Run:wait()
  if not self.done then
    local q = mg.queue()
    self.joiners[#self.joiners + 1] = q
    q:get()
  end
  return self
end

-- ask the run to stop: "interrupt" keeps its checkpoints, "rollback" takes
-- the thread back to where the run started
function Run:stop(action, by)
  if self.done then return end
  self.stop_action = action or "interrupt"
  self.stopped_by = by
  if self.task and not self.task:done() then self.task:cancel() end
end

--[[ A run read back from the storage: a finished run's events are its
stored log. One that is not finished belongs to another process sharing
the storage (or is ending here right now): it is looked at again until its
record says it is over. ]]
local Stored = {}
Stored.__index = Stored

function Stored:cursor(last_event_id)
  if type(last_event_id) ~= "string" or not last_event_id:find("^%d+$") or #last_event_id > 15 then return 0 end
  return tonumber(last_event_id)
end

local FINAL = service.FINAL

function Stored:_over()
  if FINAL[self.status] then return true end
  local r = self.storage:run(self.run_id)
  if not r then
    self.status, self.error = "error", { error = "RunError", message = "the run was deleted" }
    return true
  end
  for k, v in pairs(r) do self[k] = v end
  return FINAL[self.status] == true
end

function Stored:events_after(seq, timeout)
  if not self.events then
    if not self:_over() then
      mg.sleep(math.min(timeout or 1, 1))
      return {}, false
    end
    self.events = self.storage:run_events(self.run_id) or {}
  end
  local out = {}
  for i = seq + 1, #self.events do out[#out + 1] = self.events[i] end
  return out, true
end

function Stored:wait()
  while not self:_over() do mg.sleep(0.2) end
  return self
end

function Stored:stop() end

-- handle(rec) -> the run of a stored record: the live one while it goes
function X:handle(rec)
  local live = self.live[rec.run_id]
  if live then return live end
  local s = setmetatable({ storage = self.storage }, Stored)
  for k, v in pairs(rec) do s[k] = v end
  return s
end

function X:forget(run) self.live[run.run_id] = nil end

---------------------------------------------------------------- running

-- The run is over: its record and event log stored, its lease passed on,
-- its followers released. A run that ends interrupted (cancelled, or
-- stopped by a later run's multitask_strategy) says so with an error event
-- (UserInterrupt, UserRollback), so neither its stream nor its wait looks
-- like a success.
function X:_finish(run, status, lease)
  if run.done then return end
  if status == "interrupted" and not run.error then
    local by = run.stopped_by
    run.error = { error = run.stop_action == "rollback" and "UserRollback" or "UserInterrupt",
      message = by and by.by and ("stopped by run " .. tostring(by.by) .. " (multitask_strategy " ..
        tostring(by.strategy) .. ")") or "the run was cancelled" }
    run:publish("error", run.error)
  end
  run.status = status
  run.updated_at = wall()
  local ok, err = self.storage:run_set(run.run_id, { status = status, output = run.output, error = run.error,
    events = run.events })
  if not ok and ok ~= false then
    io.stderr:write("moongraph serve: run ", run.run_id, ": its record could not be stored: ",
      text.error_message(err), "\n")
  end
  local t = self.threads[run.thread_id]
  if t and t.active == run then t.active = nil end
  -- the next run gets the thread before followers of this one wake up
  if lease then lease:release() end
  self:_done_with(run.thread_id)
  run.done = true
  self.live[run.run_id] = nil
  run:wake()
  for _, q in ipairs(run.joiners) do q:put(true) end
  run.joiners = {}
end

-- Runs one run to its end: its stream into its events, then the thread's
-- record and the run's output.
local function body(self, run)
  local svc = self.svc
  run.status = "running"
  run.updated_at = wall()
  self.storage:run_started(run.run_id)
  local app = run.app
  local cfg = { thread_id = run.thread_id, run_id = run.run_id, stream_mode = run.req.engine_modes,
    subgraphs = run.req.subgraphs, recursion_limit = run.req.recursion_limit,
    checkpoint_id = run.req.checkpoint_id, context = run.req.context, configurable = run.req.configurable,
    metadata = run.req.metadata, durability = run.req.durability }
  -- where the run starts, for a rollback
  local before = app:get_state { thread_id = run.thread_id }
  if before then run.from = before.config and before.config.checkpoint_id or "" end
  local failure
  if not run.stop_action then
    local modes = run.req.modes
    local names = { run_id = run.run_id, thread_id = run.thread_id, subgraphs = run.req.subgraphs }
    run.task = mg.spawn(function()
      for ev in app:stream(run.req.input, cfg) do
        if modes[ev.mode] then
          local name, data = lgrun.translate(names, ev)
          run:publish(name, data)
        end
      end
    end)
    local ok, err = run.task:join()
    if not ok and err ~= "cancelled" then failure = err end
  end
  local status, errmsg
  if run.stop_action then
    if run.stop_action == "rollback" then
      mg.checkpoint.settle(svc.saver, run.thread_id)
      if run.from == "" then
        svc.saver:delete_thread(run.thread_id)
      elseif run.from then
        pcall(app.update_state, app, { thread_id = run.thread_id, checkpoint_id = run.from }, nil)
      end
    end
    status = "interrupted"
  elseif failure then
    -- the client learns which node failed; the detail is the server's
    io.stderr:write("moongraph serve: run ", run.run_id, " failed: ", text.error_message(failure), "\n")
    io.stderr:flush()
    errmsg = public_error.message(failure, "run " .. run.run_id)
    run.error = { error = "GraphError", message = errmsg }
    run:publish("error", run.error)
    status = "error"
  else
    status = "success"
  end
  -- the thread's record and the run's output (what wait and join answer)
  -- from its state now, taken before a stateless run's thread goes away
  local snap = app:get_state { thread_id = run.thread_id }
  if not run.temporary then
    svc:refresh(run.thread_id, app, errmsg and "error" or nil, errmsg, run.run_id, snap or false)
  end
  if snap then
    local out, list = lgrun.output(snap)
    if list and status == "success" then
      if run.req.modes.values then run:publish("values", { __interrupt__ = list }) end
      if run.req.modes.updates then run:publish("updates", { __interrupt__ = list }) end
    end
    run.output = out
  end
  if run.temporary then
    mg.checkpoint.settle(svc.saver, run.thread_id)
    svc.saver:delete_thread(run.thread_id)
  end
  return status
end

local function leave_queue(t, run)
  for i, q in ipairs(t.queue) do
    if q == run then table_remove(t.queue, i) return end
  end
end

-- the thread's lease for a run; when another run interrupts or rolls back
-- this one, it stops
local function acquire(self, run, strategy)
  return self.coord:acquire(run.thread_id, { run_id = run.run_id, strategy = strategy,
    on_preempt = function(p) run:stop(p.strategy, p) end })
end

-- Runs one run to its end, in its own task: with the thread's lease, or
-- first waits for it (a pending run; cancelling it cancels this task while
-- it waits). Whatever happens, the run finishes and the lease goes to the
-- next run.
local function execute(self, run, lease)
  local t = self:_thread(run.thread_id)
  if not lease then
    local err
    lease, err = acquire(self, run, run.wait_strategy or run.multitask_strategy)
    leave_queue(t, run)
    if not lease then
      run.error = { error = "BusyError", message = "thread '" .. run.thread_id .. "': " .. tostring(err) }
      run:publish("error", run.error)
      self:_finish(run, "error")
      return
    end
    t.active = run
  end
  local ok, status = xpcall(body, debug.traceback, self, run)
  if not ok then
    io.stderr:write("moongraph serve: run ", run.run_id, ": ", tostring(status), "\n")
    run.error = { error = "InternalError", message = "the run failed inside the server" }
    run:publish("error", run.error)
    status = "error"
  end
  self:_finish(run, status, lease)
end

-- submit(rec, req, script) -> run: starts the admitted run at once, or
-- when its turn on the thread comes
function X:submit(rec, req, script)
  local run = new_run(rec, { req = req, app = script.app })
  self.live[run.run_id] = run
  run:publish("metadata", { run_id = run.run_id, attempt = 1 })
  -- the thread's lease now when the thread is free; else the run waits for
  -- it by its strategy (reject was answered when it was admitted)
  local lease = self.coord:acquire(run.thread_id, { run_id = run.run_id, strategy = "reject",
    on_preempt = function(p) run:stop(p.strategy, p) end })
  if not lease and run.multitask_strategy == "reject" then run.wait_strategy = "enqueue" end
  local t = self:_thread(run.thread_id)
  if lease then t.active = run else t.queue[#t.queue + 1] = run end
  run.exec = mg.spawn(execute, self, run, lease)
  return run
end

-- cancel(run, action, wait): a run still waiting for its thread leaves the
-- line at once; a running one is asked to stop
function X:cancel(run, action, wait)
  if run.done or not self.live[run.run_id] then return true end
  local t = self.threads[run.thread_id]
  if run.status == "pending" and t and t.active ~= run then
    run.exec:cancel()
    leave_queue(t, run)
    self:_finish(run, "interrupted")
    if not run.temporary and not (t.active or t.queue[1]) then
      self.svc:refresh(run.thread_id, run.app)
    end
    return true
  end
  run:stop(action)
  if wait then run:wait() end
  return true
end

-- thread_deleted(thread_id): its queued runs end, its running one stops
function X:thread_deleted(thread_id)
  local t = self.threads[thread_id]
  if not t then return end
  for _, q in ipairs(t.queue) do
    q.exec:cancel()
    self:_finish(q, "interrupted")
  end
  t.queue = {}
  local a = t.active
  if a then
    a:stop("interrupt")
    a:wait()
  end
  mg.checkpoint.settle(self.svc.saver, thread_id)   -- the stopped run's last writes first
end

return _M
