-- moongraph.worker — the worker process: jobs from a Redis stream, results
-- in Postgres, events back to Redis; many workers side by side.
--
--   local worker = require "moongraph.worker"
--   local w = worker.new(cfg)        -- cfg from moongraph.worker.config.parse
--   local code = w:run()             -- until SIGTERM (or w:stop()); the exit status
--
-- Inside one process up to cfg.concurrency jobs run at once, each in its
-- own task, next to these loops:
--
--   reader     XREADGROUP new jobs while a slot is free
--   reclaimer  XAUTOCLAIM jobs idle for claim_idle seconds (their worker
--              died or stalled) and resume them
--   renewer    keeps the idle time of this worker's running jobs low, so
--              nobody claims them; a job found claimed elsewhere is
--              cancelled here (its new owner carries on)
--   heartbeat  PREFIX:workers:<consumer> (JSON, expires after 3 beats), and
--              the --metrics file
--   signals    SIGTERM or SIGINT: drain (stop reading, wait up to `grace`
--              seconds for the running jobs, release the rest for other
--              workers); a second one stops at once. SIGHUP: reload the
--              scripts (running jobs keep the graph they started with).
--
-- There is no coordinator: the consumer group hands each job to one
-- worker, Postgres (job_results keyed by job_id) makes its result unique,
-- and a crashed worker's jobs are claimed by the others.

local errors = require "moongraph.errors"
local mg = require "moongraph"
local core = require "moongraph.core"
local redis_mod = require "moongraph.redis"
local pg = require "moongraph.pg"
local json = require "moongraph.json"
local cjson = json.wire()
local logm = require "moongraph.worker.log"
local metricsm = require "moongraph.worker.metrics"
local queuem = require "moongraph.worker.queue"
local config = require "moongraph.worker.config"
local scriptsm = require "moongraph.worker.scripts"
local migrations = require "moongraph.worker.migrations"
local checkpointer = require "moongraph.worker.checkpointer"
local runner = require "moongraph.worker.runner"
local multitask = require "moongraph.multitask"

local type, tostring, pairs, ipairs, pcall, setmetatable, error =
  type, tostring, pairs, ipairs, pcall, setmetatable, error
local min, max, ceil, random = math.min, math.max, math.ceil, math.random

local _M = {}
local W = {}
W.__index = W

-- A wake-up for tasks waiting on a condition the loop changes.
local Notify = {}
Notify.__index = Notify
local function notify_new() return setmetatable({ waiters = {} }, Notify) end
function Notify:wait(timeout)
  local q = mg.queue()
  self.waiters[#self.waiters + 1] = q
  local got = q:get(timeout)
  for i = #self.waiters, 1, -1 do
    if self.waiters[i] == q then table.remove(self.waiters, i) end
  end
  return got
end
function Notify:signal()
  local w = self.waiters
  if #w == 0 then return end
  self.waiters = {}
  for i = 1, #w do w[i]:put(true) end
end

-- new(cfg [, opts]) opts: log_out (file for the JSON log, default stderr),
-- metrics_out (for `--metrics -`, default stdout), llm (a client for the
-- pipelines; default from the environment).
function _M.new(cfg, opts)
  opts = opts or {}
  local self = setmetatable({
    cfg = cfg,
    log = logm.new { level = cfg.log_level, out = opts.log_out or io.stderr,
                     fields = { worker = cfg.consumer } },
    metrics = metricsm.new(),
    metrics_out = opts.metrics_out or io.stdout,
    llm = opts.llm,
    key = config.key_helper(cfg.prefix),
    jobs = {}, inflight = 0,
    freed = notify_new(), stopped_ev = notify_new(),
    stopping = false, tasks = {},
    started = logm.wall(),
  }, W)
  return self
end

-- Retry fn until it returns a value, for at most `limit` seconds.
local function with_retry(log, what, limit, fn)
  local deadline = mg.now() + limit
  local delay = 0.1
  while true do
    local ok, v, err = pcall(fn)
    if not ok then return nil, tostring(v) end
    if v then return v end
    -- a refusal waiting cannot heal (a wrong password, a permission): stop
    -- now and say so, rather than retry until the limit
    if errors.is(err) and not err.retryable then return nil, what .. ": " .. tostring(err) end
    if mg.now() + delay > deadline then return nil, what .. ": " .. tostring(err) end
    log:warn(what .. " failed; retrying", { error = tostring(err), retry_in = delay })
    mg.sleep(delay)
    delay = min(delay * 2, 5)
  end
end

local function log_migrations(log, applied, unknown)
  for _, m in ipairs(applied or {}) do
    log:info("migration applied", { scope = m.scope, version = m.version, name = m.name })
  end
  for _, m in ipairs(unknown or {}) do
    log:warn("the database has a migration this worker does not list (applied by a newer version?)",
      { scope = m.scope, version = m.version, name = m.name })
  end
end

-- start() -> true | nil, err: connect, open the saver, load the scripts,
-- migrate (the worker's schema and the scripts'), make sure the consumer
-- group exists.
function W:start()
  local cfg, log = self.cfg, self.log
  local limit = cfg.startup_timeout or 60
  local r, err = with_retry(log, "connecting to Redis", limit, function()
    return redis_mod.connect(cfg.redis)
  end)
  if not r then return nil, err end
  self.redis = r
  self.db = pg.pool(cfg.pg, { size = cfg.pg_pool or max(2, min(8, ceil(cfg.concurrency / 4))) })
  local saver
  saver, err = checkpointer.open(cfg.checkpoint, {
    redis_url = cfg.redis, pg_url = cfg.pg, concurrency = cfg.concurrency })
  if not saver then return nil, "checkpointer: " .. tostring(err) end
  self.saver = saver
  self.scripts = scriptsm.new(cfg.scripts, saver)
  local ok
  ok, err = self.scripts:load()
  if not ok then return nil, err end
  local unknown
  ok, err = with_retry(log, "migrating Postgres", limit, function()
    local applied, u, permanent = migrations.migrate(self.db, self.scripts:scopes())
    if not applied then
      if permanent then error(u, 0) end   -- the SQL itself: no retry
      return nil, u
    end
    log_migrations(log, applied, nil)
    unknown = u
    return true
  end)
  if not ok then return nil, err end
  log_migrations(log, nil, unknown)
  self.queue = queuem.new { redis = r, keys = cfg.keys, group = cfg.group, consumer = cfg.consumer }
  -- one job of a thread at a time; a thread's lease lives as long as a
  -- job's claim (renewed with it)
  self.threads = multitask.redis(r, { prefix = cfg.prefix, ttl = cfg.claim_idle })
  ok, err = with_retry(log, "creating the consumer group", limit, function()
    return self.queue:ensure_group()
  end)
  if not ok then return nil, err end
  log:info("worker started", {
    stream = cfg.keys.jobs, group = cfg.group, concurrency = cfg.concurrency,
    scripts = self.scripts:names(), checkpoint = cfg.checkpoint,
    llm = self.llm and "configured" or "none" })
  return true
end

-- Start one job in its own task (unless this worker already runs it).
function W:dispatch(entry)
  if self.jobs[entry.id] then return end
  local js = { id = entry.id, phase = "starting" }
  self.jobs[entry.id] = js
  self.inflight = self.inflight + 1
  self.metrics:set("inflight", self.inflight)
  js.task = mg.spawn(function()
    local guard <close> = setmetatable({}, { __close = function()
      self.jobs[entry.id] = nil
      self.inflight = self.inflight - 1
      self.metrics:set("inflight", self.inflight)
      self.freed:signal()
    end })
    local ok, err = pcall(runner.run, self, entry, js)
    if not ok then
      self.metrics:inc("jobs_released")
      self.log:error("job crashed the runner; left pending", { entry_id = entry.id, error = tostring(err) })
    end
  end)
end

function W:free_slots()
  return self.cfg.concurrency - self.inflight
end

local function quiet_warn(self, what, err, state)
  local now = mg.now()
  if not state.last or now - state.last > 5 then
    state.last = now
    self.log:warn(what, { error = tostring(err) })
  end
end

-- The reader. A read whose reply was lost (the connection dropped) may
-- still have delivered jobs to this consumer; once Redis answers again,
-- such jobs (pending here, run by no task) are released for the next claim
-- pass instead of waiting out claim_idle.
function W:reader()
  local backoff, warned = 0.05, {}
  local lost_reply = false
  while not self.stopping do
    local free = self:free_slots()
    if free <= 0 then
      self.freed:wait(1)
    else
      local entries, err = self.queue:read(free, self.cfg.block)
      if not entries then
        quiet_warn(self, "reading jobs failed; retrying", err, warned)
        lost_reply = true
        mg.sleep(backoff)
        backoff = min(backoff * 2, 2)
      else
        backoff = 0.05
        if self.stopping then
          local ids = {}
          for i, e in ipairs(entries) do ids[i] = e.id end
          self.queue:release(ids, self.cfg.claim_idle)
        else
          for _, e in ipairs(entries) do self:dispatch(e) end
        end
        if lost_reply and not self.stopping then
          local ids = self:release_orphans()
          if ids then
            lost_reply = false
            if #ids > 0 then
              self.log:info("released jobs delivered during a lost read", { entries = ids })
            end
          end
        end
      end
    end
  end
end

-- Remove the consumers of dead workers from the group (nothing pending on
-- them, idle for claim_idle, heartbeat expired), so they do not pile up.
function W:reap()
  local removed, err = self.queue:reap(max(self.cfg.claim_idle, 3 * self.cfg.heartbeat), self.cfg.keys.worker)
  if not removed then return nil, err end
  if #removed > 0 then
    self.metrics:inc("consumers_reaped", #removed)
    self.log:info("removed the consumers of dead workers from the group", { consumers = removed })
  end
  return removed
end

function W:reclaimer()
  local warned = {}
  local reap_every = max(self.cfg.claim_idle, 5 * self.cfg.claim_interval)
  local next_reap = mg.now() + reap_every * random()
  while not self.stopping do
    mg.sleep(self.cfg.claim_interval * (0.75 + 0.5 * random()))
    if self.stopping then break end
    if mg.now() >= next_reap then
      next_reap = mg.now() + reap_every
      local ok, err = self:reap()
      if not ok then quiet_warn(self, "removing dead consumers failed", err, warned) end
    end
    local free = self:free_slots()
    if free > 0 then
      local entries, err = self.queue:claim(free, self.cfg.claim_idle)
      if not entries then
        quiet_warn(self, "claiming idle jobs failed", err, warned)
      else
        for _, e in ipairs(entries) do
          if not self.jobs[e.id] then
            self.metrics:inc("jobs_reclaimed")
            self.log:info("job claimed from a stalled or dead worker", {
              entry_id = e.id, deliveries = e.deliveries })
            self:dispatch(e)
          end
        end
      end
    end
  end
end

-- One renewal pass over this worker's running jobs. A job that is being
-- (or has been) acknowledged here is not ours in the pending list any
-- more, which is no loss: only a job still running that the pending list
-- gives to another consumer is stopped here.
function W:renew_once(warned)
  local ids = {}
  for id, js in pairs(self.jobs) do
    if not js.acking then ids[#ids + 1] = id end
  end
  if #ids == 0 then return true end
  local lost, err = self.queue:renew(ids)
  if not lost then
    quiet_warn(self, "renewing job leases failed", err, warned or {})
    return nil, err
  end
  for _, id in ipairs(lost) do
    local js = self.jobs[id]
    -- (the reply may come back after the job's own XACK went out)
    if js and not js.acking and js.task and not js.task:done() then
      self.log:warn("job claimed by another worker; stopping it here", { entry_id = id, phase = js.phase })
      self.metrics:inc("jobs_released")
      js.task:cancel()
    end
  end
  return self:renew_threads(warned)
end

-- A later job of the job's thread interrupts or rolls it back: its run is
-- told to stop, once. Heard at once from the thread's lease (on_preempt),
-- or at the lease's next renewal.
function W:preempt(js, info)
  if js.preempted or js.acking then return end
  js.preempted = info
  self.log:info("job asked to stop by a later job of its thread", {
    entry_id = js.id, by = info.by, strategy = info.strategy, phase = js.phase })
  if js.stop_run then js.stop_run() end
end

-- Renew the thread leases of the running jobs; a job whose thread a
-- later job interrupts or rolls back is told to stop its run, and one that
-- lost its thread (this worker stalled past the lease) is stopped here:
-- its commit would be refused anyway.
function W:renew_threads(warned)
  for id, js in pairs(self.jobs) do
    local lease = js.lease
    if lease and not js.acking then
      local ok, why, info = lease:check()
      if js.lease ~= lease or js.acking then
        -- (the job moved on meanwhile)
      elseif not ok and why == "preempted" then
        self:preempt(js, info)
      elseif not ok and why == "lost" then
        if js.task and not js.task:done() then
          self.log:warn("job lost its thread's lease to a later job; stopping it here",
            { entry_id = id, phase = js.phase })
          self.metrics:inc("jobs_released")
          js.task:cancel()
        end
      elseif not ok then
        quiet_warn(self, "renewing thread leases failed", why, warned or {})
      end
    end
  end
  return true
end

function W:renewer()
  local warned = {}
  local every = max(0.05, self.cfg.claim_idle / 3)
  while true do
    mg.sleep(every)
    self:renew_once(warned)
  end
end

function W:heartbeat_record()
  local snap = self.metrics:snapshot()
  return cjson.encode {
    consumer = self.cfg.consumer, group = self.cfg.group,
    started = logm.iso(self.started), ts = logm.iso(),
    inflight = self.inflight, concurrency = self.cfg.concurrency,
    stopping = self.stopping, scripts = self.scripts:names(),
    generation = self.scripts.generation,
    counters = snap.counters,
  }
end

function W:write_metrics()
  local path = self.cfg.metrics
  if not path or path == "-" then return true end
  local text = self.metrics:prometheus { worker = self.cfg.consumer }
  return core.files.write(path, text)
end

function W:heartbeat()
  local key = self.cfg.keys.worker .. self.cfg.consumer
  local ttl = max(1, ceil(self.cfg.heartbeat * 3))
  local warned = {}
  while true do
    local ok, err = self.redis:call("SET", key, self:heartbeat_record(), "EX", ttl)
    if not ok then quiet_warn(self, "heartbeat failed", err, warned) end
    local wok, werr = self:write_metrics()
    if not wok then quiet_warn(self, "writing metrics failed", werr, warned) end
    mg.sleep(self.cfg.heartbeat)
  end
end

-- Reload the scripts; the new set's migrations are applied before it is
-- taken (a set whose migrations fail is not taken).
function W:reload()
  local ok, err = self.scripts:reload(function(set)
    local applied, u = migrations.migrate(self.db, self.scripts:scopes(set))
    if not applied then return nil, "migrating Postgres: " .. tostring(u) end
    log_migrations(self.log, applied, nil)
    return true
  end)
  if ok then
    self.metrics:inc("reloads")
    self.log:info("scripts reloaded", { generation = self.scripts.generation, scripts = self.scripts:names() })
  else
    self.log:error("reloading the scripts failed; the previous ones stay in use", { error = tostring(err) })
  end
end

function W:on_signals()
  local signal = core.signal
  self.tasks.hup = mg.spawn(function()
    while true do
      signal.wait("HUP")
      mg.spawn(self.reload, self)
    end
  end)
  -- SIGTERM and SIGINT drain; a second one (either) stops at once
  local function stopper(name)
    return function()
      while true do
        signal.wait(name)
        if not self.stopping then
          self.log:info("SIG" .. name .. ": draining", { inflight = self.inflight, grace = self.cfg.grace })
          self:stop()
        else
          self.log:warn("second SIG" .. name .. ": stopping now", { inflight = self.inflight })
          self.force = true
          self.freed:signal()
        end
      end
    end
  end
  self.tasks.term = mg.spawn(stopper("TERM"))
  self.tasks.int = mg.spawn(stopper("INT"))
end

-- stop(): begin the drain (what SIGTERM does).
function W:stop()
  if self.stopping then return end
  self.stopping = true
  self.stopped_ev:signal()
  self.freed:signal()
end

local function cancel(t)
  if t and not t:done() then t:cancel() end
end

-- Release this consumer's pending jobs that no task here is running
-- (delivered during the last read, or left by cancelled jobs), so the next
-- claim pass of another worker takes them at once.
function W:release_orphans()
  local res, err = self.redis:call("XPENDING", self.cfg.keys.jobs, self.cfg.group,
    "-", "+", 10000, self.cfg.consumer)
  if not res then return nil, err end
  local ids = {}
  for _, row in ipairs(type(res) == "table" and res or {}) do
    local js = self.jobs[row[1]]
    if not (js and js.task and not js.task:done()) then ids[#ids + 1] = row[1] end
  end
  if #ids == 0 then return ids end
  local ok, rerr = self.queue:release(ids, self.cfg.claim_idle)
  if not ok then return nil, rerr end
  return ids
end

function W:drain()
  local cfg, log = self.cfg, self.log
  local t0 = mg.now()
  cancel(self.tasks.reader)
  cancel(self.tasks.reclaimer)
  local deadline = t0 + cfg.grace
  while self.inflight > 0 and not self.force do
    local left = deadline - mg.now()
    if left <= 0 then break end
    self.freed:wait(min(left, 0.5))
  end
  local left = {}
  for id, js in pairs(self.jobs) do
    left[#left + 1] = id
    cancel(js.task)
  end
  if #left > 0 then
    self.metrics:inc("jobs_released", #left)
    log:warn("grace period over: jobs left pending for other workers", { jobs = left })
  end
  local released, rerr = self:release_orphans()
  if not released then
    log:warn("could not release pending jobs; they will be claimed after claim_idle", { error = tostring(rerr) })
  end
  cancel(self.tasks.renewer)
  cancel(self.tasks.heartbeat)
  -- leave the group unless jobs are still pending on this consumer (they
  -- would be lost with it; a live worker removes it once they are claimed)
  local still, lerr = self.queue:leave()
  if still == nil then
    log:warn("could not leave the consumer group; a live worker will remove this consumer",
      { error = tostring(lerr) })
  elseif still ~= 0 then
    log:info("jobs still pending on this consumer: it stays in the group until they are claimed",
      { pending = still })
  end
  self.redis:call("DEL", cfg.keys.worker .. cfg.consumer)
  self:write_metrics()
  log:info("worker stopped", { drained_in_ms = math.floor((mg.now() - t0) * 1000), left_pending = #left,
                               counters = self.metrics:snapshot().counters })
end

-- run() -> exit status. Starts (unless start() was called already),
-- serves until stop, drains.
function W:run()
  if not self.queue then
    local ok, err = self:start()
    if not ok then
      self.log:error("worker could not start", { error = tostring(err) })
      return 1
    end
  end
  -- if this task is cancelled, take every task of the worker with it
  local guard <close> = setmetatable({}, { __close = function()
    for _, t in pairs(self.tasks) do cancel(t) end
    for _, js in pairs(self.jobs) do cancel(js.task) end
  end })
  self:on_signals()
  self.tasks.reader = mg.spawn(self.reader, self)
  self.tasks.reclaimer = mg.spawn(self.reclaimer, self)
  self.tasks.renewer = mg.spawn(self.renewer, self)
  self.tasks.heartbeat = mg.spawn(self.heartbeat, self)
  while not self.stopping do self.stopped_ev:wait() end
  self:drain()
  cancel(self.tasks.hup)
  cancel(self.tasks.term)
  cancel(self.tasks.int)
  if self.cfg.metrics == "-" then
    self.metrics_out:write(self.metrics:prometheus { worker = self.cfg.consumer })
    self.metrics_out:flush()
  end
  self.redis:close()
  self.db:close()
  return 0
end

return _M
