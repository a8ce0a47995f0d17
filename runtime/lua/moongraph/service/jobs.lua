--[[
moongraph.service.jobs — the service's executor that queues each run as a
job on the Redis stream the `moongraph worker` processes read
(moongraph.worker.langgraph runs it there). The workers update the run's
and the thread's records in the shared PostgreSQL storage
(moongraph.service.postgres) and write the run's events to the job's
event stream, which this executor relays: a serve process keeps no state
of its own, and any number of them can stand behind a load balancer.

  local jobs = require "moongraph.service.jobs"
  local ex = assert(jobs.new { redis = "redis://127.0.0.1:6379/0", prefix = "moongraph" })

A run is accepted once its record is stored and its job is on the stream
(its `metadata` event first in the job's event stream); event ids are the
stream's entry ids, so a client resumes with Last-Event-ID on any serve.
multitask_strategy: reject is answered when the storage admits the run;
enqueue, interrupt and rollback are the workers' (a run of the thread
waits for the thread's lease, or stops the one that holds it). Cancelling
a run that runs sets its cancel key, which the worker running it watches;
one still pending is marked interrupted here and ends at once.
]]

local mg = require "moongraph"
local redis = require "moongraph.redis"
local json = require "moongraph.json"
local ids = require "moongraph.ids"
local text = require "moongraph.text"
local client_mod = require "moongraph.worker.client"
local events = require "moongraph.worker.events"
local lg = require "moongraph.worker.langgraph"

local type, tostring, ipairs, pairs, setmetatable, error, next, pcall =
  type, tostring, ipairs, pairs, setmetatable, error, next, pcall
local math_floor, math_max = math.floor, math.max

local _M = {}
local X = {}
X.__index = X
local Run = {}
Run.__index = Run

-- Seconds the Redis keys of a run (its cancel key, its metadata event
-- before a worker took it) live.
_M.KEY_TTL = 86400

local FINAL = require("moongraph.service").FINAL

-- new{redis = url, prefix} -> executor | nil, err
function _M.new(opts)
  if type(opts) ~= "table" or type(opts.redis) ~= "string" then
    error("bad argument #1 to 'new' (a table with a redis URL expected)", 2)
  end
  local conn, err = redis.connect(opts.redis)
  if not conn then return nil, "redis: " .. tostring(err) end
  local prefix = opts.prefix or "moongraph"
  return setmetatable({ id = "jobs", redis = conn, prefix = prefix,
    client = assert(client_mod.connect({ redis = conn }, { prefix = prefix,
      replicas = opts.redis:lower():find("^redis%-sentinel://") and 1 or 0 })) }, X)
end

-- (a worker that dies mid-run has its job taken over by another: nothing
-- to settle here)
function X:attach(svc)
  self.svc, self.storage = svc, svc.storage
  return true
end

function X:close() self.redis:close() end

function X:_cancel_key(run_id) return lg.cancel_key(self.prefix, run_id) end

-- handle(rec) -> the run of a stored record
function X:handle(rec)
  local run = setmetatable({ ex = self, key = self.client:events_key(rec.run_id) }, Run)
  for k, v in pairs(rec) do run[k] = v end
  return run
end

function X:forget(run) self.redis:call("DEL", run.key) end

-- submit(rec, req, script) -> run | nil, err: the metadata event, then the job
function X:submit(rec, r, s)
  local run = self:handle(rec)
  local res, xerr = self.redis:pipeline {
    { "XADD", run.key, "*", "type", "metadata", "data", json.encode { run_id = rec.run_id, attempt = 1 } },
    { "EXPIRE", run.key, _M.KEY_TTL },
  }
  if res and type(res[1]) == "table" then res, xerr = nil, res[1][2] end
  local jid, qerr
  if res then
    -- (reject was answered when the run was admitted; the worker waits for
    -- a run finishing on the thread)
    local strategy = r.strategy == "reject" and "enqueue" or r.strategy
    local user = rec.owner ~= "" and rec.owner or nil
    local sok, a, b = pcall(self.client.submit, self.client, {
      job_id = rec.run_id, thread_id = rec.thread_id, user_id = ids.valid(user) and user or nil, script = s.name,
      input = r.command == nil and r.input or nil, multitask_strategy = strategy,
      run = { stream_mode = r.engine_modes, subgraphs = r.subgraphs, command = r.command,
        checkpoint_id = r.checkpoint_id, recursion_limit = r.recursion_limit, configurable = r.configurable,
        context = r.context, metadata = next(r.metadata) and r.metadata or nil, durability = r.durability,
        temporary = rec.temporary or nil },
    })
    if not sok then jid, qerr = nil, a else jid, qerr = a, b end
  end
  if not jid then
    self.redis:call("DEL", run.key)
    return nil, qerr or xerr
  end
  return run
end

-- cancel(run, action, wait): a run no worker started yet ends here (the
-- worker that gets it finds it stopped); a running one is asked to stop
function X:cancel(run, action, wait)
  local ok, err = self.redis:call("SET", self:_cancel_key(run.run_id), action, "EX", _M.KEY_TTL)
  if not ok then return nil, 503, "the run could not be cancelled: " .. text.error_message(err) end
  local stopped = { error = action == "rollback" and "UserRollback" or "UserInterrupt",
    message = "cancelled (" .. action .. ") before it started" }
  local set = self.storage:run_set(run.run_id, { status = "interrupted", error = stopped }, { pending = true })
  if set then
    events.finish(self.redis, run.key, { { "error", stopped }, { "done", { status = "interrupted",
      run_status = "interrupted", job_id = run.run_id } } }, { ttl = _M.KEY_TTL })
    if not run.stateless then
      local th = self.storage:thread(run.thread_id)
      if th then self.svc:refresh(run.thread_id, (self.svc:app_of(th))) end
    end
    return true
  end
  if wait then run:wait() end
  return true
end

-- thread_deleted(thread_id, going): the runs that were going stop on their workers
function X:thread_deleted(_, going)
  for _, run_id in ipairs(going or {}) do
    self.redis:call("SET", self:_cancel_key(run_id), "interrupt", "EX", _M.KEY_TTL)
  end
end

---------------------------------------------------------------- a run's events

function Run:cursor(last_event_id)
  if type(last_event_id) == "string" and last_event_id:find("^%d+%-%d+$") then return last_event_id end
  return "0-0"
end

-- the run's record: status, output, error | nil, err
function Run:row()
  local r, err = self.ex.storage:run(self.run_id)
  if r == nil then return nil, err end
  if not r then return { status = "error", error = { error = "RunError", message = "the run was deleted" } } end
  return r
end

-- the run is over when its stream has its done, or (its events expired)
-- its record says so
local function over(self)
  local r = self:row()
  return r ~= nil and FINAL[r.status] == true
end

--[[ events_after(cursor, timeout) -> {seq (the entry id), event, data}...,
done: what the job's event stream has after cursor, waiting up to timeout
seconds for something; done once the run's done event is read ]]
function Run:events_after(cursor, timeout)
  local block = math_max(1, math_floor((timeout or 15) * 1000))
  local conn = self.ex.redis
  local res, err = conn:call("XREAD", "COUNT", 256, "BLOCK", block, "STREAMS", self.key, cursor)
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
  if conn:call("EXISTS", self.key) == 0 and over(self) then return out, true end
  return out, false
end

-- wait() -> the run's final record {status, output, error}
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
  self.ex.redis:call("SET", self.ex:_cancel_key(self.run_id), action or "interrupt", "EX", _M.KEY_TTL)
end

return _M
