--[[
moongraph.multitask — one run at a time per thread: LangGraph's
`multitask_strategy`, for tasks of one process, processes sharing a Redis,
or processes sharing a directory.

Two turns of one conversation must not run at once: both would read the
same state and one turn would be lost. A coordinator hands out leases, one
per thread at a time; what happens to a run that finds its thread busy is
its strategy:

  enqueue    wait for the runs before it, then run (the default)
  reject     refuse at once: nil, "busy"
  interrupt  ask the running one to stop (its work so far is kept), then run
  rollback   ask the running one to stop and undo it, then run

Interrupting and rolling back are cooperative: the holder learns of it from
lease:check(), or at once through on_preempt (Redis: the run that asks
publishes it, and the coordinator's subscription passes it on) and stops;
what "undo" means belongs to whoever owns the state (run() below forks the
thread from the checkpoint the rolled-back run started from).

  local multitask = require "moongraph.multitask"
  local c = multitask.memory()                              -- tasks of this process
  local c = multitask.redis(conn, { prefix = "app", ttl = 30 })  -- processes sharing Redis
  local c = multitask.file(dir)                             -- processes sharing dir (enqueue, reject)

  local lease, err, info = c:acquire(thread_id, {
    run_id = "r1",          -- default: a fresh id
    strategy = "enqueue",   -- enqueue | reject | interrupt | rollback
    timeout = 60,           -- seconds to wait for the thread (enqueue etc.); nil: forever
    on_preempt = fn,        -- fn(info) when another run interrupts this one (memory, redis)
    on_wait = fn,           -- fn(holder) once, when the run has to wait
    from = "checkpoint id", -- where this run starts (given back to a rollback)
  })
  -- err: "busy" (reject; info.holder), "timeout", or what failed
  lease.token              -- fencing token: larger for each later holder of the thread
  lease:check()            -- true | nil, "preempted", {by =, strategy =, from =} | nil, "lost"
  lease:release()

  multitask.invoke(c, app, input, cfg)   -- app:invoke under a lease: cfg.thread_id,
                                         -- cfg.multitask_strategy, cfg.multitask_timeout

With Redis, a lease lives `ttl` seconds unless renewed by lease:check()
(call it at least every ttl/3): a holder that died or stalled loses the
thread after ttl, and its token is then smaller than the next holder's, so
a store that remembers the largest token it saw for the thread (a fence)
can refuse the stalled holder's late writes. Waiters poll, and a waiter
that stops polling for ttl seconds leaves the queue. While it holds leases
given on_preempt, a Redis coordinator keeps a subscription (a connection of
its own); a notice it misses (the connection dropped) shows at the
holder's next check().
]]

local errors = require "moongraph.errors"
local mg = require "moongraph"
local core = require "moongraph.core"

local type, tostring, tonumber, setmetatable, error, ipairs, pairs, next, pcall =
  type, tostring, tonumber, setmetatable, error, ipairs, pairs, next, pcall
local min, floor, random = math.min, math.floor, math.random
local format = string.format

local _M = {}

_M.STRATEGIES = { "enqueue", "reject", "interrupt", "rollback" }
local KNOWN = { enqueue = true, reject = true, interrupt = true, rollback = true }
_M.DEFAULT = "enqueue"

-- known(v) -> true when v names a strategy
function _M.known(v)
  return KNOWN[v] == true
end

-- check(strategy [, argn, fname]) -> strategy (nil gives the default) |
-- raises a bad-argument error naming the strategies.
function _M.check(strategy, argn, fname)
  if strategy == nil then return _M.DEFAULT end
  if not KNOWN[strategy] then
    error(format("bad argument #%d to '%s' (multitask_strategy must be enqueue, reject, interrupt or rollback, got %s)",
      argn or 1, fname or "acquire", type(strategy) == "string" and ("'" .. strategy .. "'") or type(strategy)), 3)
  end
  return strategy
end

local seq = 0
local function new_run_id()
  seq = seq + 1
  return format("run-%x-%x-%d", floor(mg.now() * 1000), random(0, 0x7fffffff), seq)
end

local function check_args(thread_id, opts)
  if type(thread_id) ~= "string" or thread_id == "" then
    error("bad argument #1 to 'acquire' (thread id string expected)", 3)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #2 to 'acquire' (options table expected)", 3)
  end
  opts = opts or {}
  local o = {
    run_id = opts.run_id or new_run_id(),
    strategy = _M.check(opts.strategy, 2, "acquire"),
    timeout = opts.timeout, on_preempt = opts.on_preempt, on_wait = opts.on_wait,
    from = opts.from,
  }
  if type(o.run_id) ~= "string" or o.run_id == "" then
    error("bad argument #2 to 'acquire' (run_id must be a non-empty string)", 3)
  end
  if o.timeout ~= nil and (type(o.timeout) ~= "number" or o.timeout < 0) then
    error("bad argument #2 to 'acquire' (timeout must be a non-negative number of seconds)", 3)
  end
  return o
end

---------------------------------------------------------------- in process

local Mem = {}
Mem.__index = Mem
local MemLease = {}
MemLease.__index = MemLease

function _M.memory()
  return setmetatable({ threads = {}, token = 0 }, Mem)
end

local function mem_grant(self, th, w)
  self.token = self.token + 1
  local lease = setmetatable({ coord = self, thread_id = w.thread_id, run_id = w.run_id,
                               token = self.token, on_preempt = w.on_preempt, from = w.from }, MemLease)
  th.holder = lease
  return lease
end

-- Hand the thread to the first waiter, if any.
local function mem_next(self, th, thread_id)
  local w = table.remove(th.queue, 1)
  if not w then
    if not th.holder then self.threads[thread_id] = nil end
    return
  end
  w.lease = mem_grant(self, th, w)
  w.q:put(true)
end

function Mem:acquire(thread_id, opts)
  local o = check_args(thread_id, opts)
  local th = self.threads[thread_id]
  if not th then
    th = { queue = {} }
    self.threads[thread_id] = th
  end
  if not th.holder and #th.queue == 0 then
    o.thread_id = thread_id
    return mem_grant(self, th, o)
  end
  local holder = th.holder and th.holder.run_id or (th.queue[1] and th.queue[1].run_id)
  if o.strategy == "reject" then return nil, "busy", { holder = holder } end
  local w = { thread_id = thread_id, run_id = o.run_id, on_preempt = o.on_preempt, from = o.from,
              q = mg.queue() }
  if o.strategy == "enqueue" then
    th.queue[#th.queue + 1] = w
  else
    table.insert(th.queue, 1, w)
    local h = th.holder
    if h and not h.preempted then
      h.preempted = { by = o.run_id, strategy = o.strategy, from = h.from }
      if h.on_preempt then mg.spawn(h.on_preempt, h.preempted) end
    end
  end
  -- a waiter cancelled while it waits leaves the queue (and gives back a
  -- lease granted in the same instant), or the thread would stay held
  local settled = false
  local guard <close> = setmetatable({}, { __close = function()
    if settled then return end
    for i, x in ipairs(th.queue) do
      if x == w then table.remove(th.queue, i) break end
    end
    if w.lease then w.lease:release() end
  end })
  if o.on_wait then o.on_wait(holder) end
  local got = w.q:get(o.timeout)
  settled = true
  if got then return w.lease end
  -- gave up waiting: leave the queue
  for i, x in ipairs(th.queue) do
    if x == w then table.remove(th.queue, i) break end
  end
  if w.lease then return w.lease end
  return nil, "timeout", { holder = th.holder and th.holder.run_id }
end

-- The checkpoint a rolled-back run started from, for the run after it
-- ("" for a thread that had none).
function Mem:set_rollback(thread_id, from)
  self.rollbacks = self.rollbacks or {}
  self.rollbacks[thread_id] = from
  return true
end

function Mem:take_rollback(thread_id)
  local r = self.rollbacks and self.rollbacks[thread_id]
  if r ~= nil then self.rollbacks[thread_id] = nil end
  return r
end

function MemLease:check()
  local th = self.coord.threads[self.thread_id]
  if not th or th.holder ~= self then return nil, "lost" end
  if self.preempted then return nil, "preempted", self.preempted end
  return true
end

function MemLease:release()
  local th = self.coord.threads[self.thread_id]
  if not th or th.holder ~= self then return false end
  th.holder = nil
  mem_next(self.coord, th, self.thread_id)
  return true
end

---------------------------------------------------------------- Redis

-- KEYS: lease (hash), queue (zset run -> order), alive (zset run -> expiry
-- ms), fence (string: the last token given, for every thread)
-- ARGV: run, strategy, ttl ms, from, channel (told the holder's run id
-- when this run asks it to stop)
-- -> {"ok", token} | {"busy", holder} | {"wait", holder}
--    | {"preempted", by, strategy, from} (this run held the thread and was
--      asked to stop before it came back)
local ACQUIRE = [[
local run, strategy, ttl, from, channel = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- waiters whose worker stopped renewing them leave the queue
local function purge()
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
    redis.call('ZREM', KEYS[2], r)
    redis.call('ZREM', KEYS[3], r)
  end
end
local function join(front)
  if not redis.call('ZSCORE', KEYS[2], run) then
    local score
    if front then
      local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      score = (first[2] and tonumber(first[2]) or 0) - 1
    else
      local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
      score = (last[2] and tonumber(last[2]) or 0) + 1
    end
    redis.call('ZADD', KEYS[2], score, run)
  end
  redis.call('ZADD', KEYS[3], now + ttl, run)
  redis.call('PEXPIRE', KEYS[2], 2 * ttl)
  redis.call('PEXPIRE', KEYS[3], 2 * ttl)
end
-- the common case, a free thread nobody waits for, makes no queue calls
local queued = true
local holder = redis.call('HGET', KEYS[1], 'run')
if holder == run then
  purge()
  local by = redis.call('HGET', KEYS[1], 'preempt_by')
  if by then
    return { 'preempted', by, redis.call('HGET', KEYS[1], 'preempt_mode'),
             redis.call('HGET', KEYS[1], 'from') or '' }
  end
elseif holder then
  purge()
  if strategy == 'reject' then return { 'busy', holder } end
  local front = strategy ~= 'enqueue'
  join(front)
  if front and not redis.call('HGET', KEYS[1], 'preempt_by') then
    redis.call('HSET', KEYS[1], 'preempt_by', run, 'preempt_mode', strategy)
    redis.call('PUBLISH', channel, holder)
  end
  return { 'wait', holder }
else
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    purge()
    head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  else
    queued = false
  end
  if head and head ~= run then
    if strategy == 'reject' then return { 'busy', head } end
    join(strategy ~= 'enqueue')
    head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if head ~= run then return { 'wait', head } end
  end
end
if queued then
  redis.call('ZREM', KEYS[2], run)
  redis.call('ZREM', KEYS[3], run)
end
local last = tonumber(redis.call('GET', KEYS[4]) or '0')
local token = math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
local text = string.format('%.0f', token)
redis.call('SET', KEYS[4], text)
-- a lease hash holds run, token and from (and preempt_* only while held):
-- no holder means no hash, and this run's own is overwritten whole
redis.call('HSET', KEYS[1], 'run', run, 'token', text, 'from', from)
redis.call('PEXPIRE', KEYS[1], ttl)
return { 'ok', text }
]]

-- KEYS: lease; ARGV: token, ttl ms -> {"ok"} | {"lost"} | {"preempted", by, strategy, from}
local CHECK = [[
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return { 'lost' } end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local by = redis.call('HGET', KEYS[1], 'preempt_by')
if by then
  return { 'preempted', by, redis.call('HGET', KEYS[1], 'preempt_mode'), redis.call('HGET', KEYS[1], 'from') or '' }
end
return { 'ok' }
]]

-- KEYS: lease; ARGV: token -> 1 released | 0 not ours
local RELEASE = [[
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
]]

local Red = {}
Red.__index = Red
local RedLease = {}
RedLease.__index = RedLease

-- redis(conn, {prefix = "moongraph", ttl = 30, poll = 0.5}): leases under
-- PREFIX:thread:<thread_id>:*; poll is the longest pause between a
-- waiter's attempts.
function _M.redis(conn, opts)
  if type(conn) ~= "table" and type(conn) ~= "userdata" then
    error("bad argument #1 to 'redis' (a moongraph.redis connection expected)", 2)
  end
  opts = opts or {}
  local ttl = opts.ttl or 30
  if type(ttl) ~= "number" or ttl <= 0 then error("bad argument #2 to 'redis' (ttl must be positive)", 2) end
  local prefix = opts.prefix or "moongraph"
  return setmetatable({ conn = conn, prefix = prefix, ttl = ttl, poll = opts.poll or 0.5,
                        channel = prefix .. ":thread-preempt", listening = false,
                        -- run id -> lease given on_preempt (weak: a lease its
                        -- holder dropped without releasing goes too)
                        watched = setmetatable({}, { __mode = "v" }) }, Red)
end

function Red:keys(thread_id)
  local base = self.prefix .. ":thread:" .. thread_id
  return base .. ":lease", base .. ":queue", base .. ":alive", self.prefix .. ":thread-fence"
end

local function preempt_info(r)
  return { by = r[2], strategy = r[3], from = (r[4] ~= "" and r[4] or nil) }
end

-- A notice for run_id: its lease, if watched here and asked to stop,
-- hears of it once.
local function notice(self, run_id)
  local lease = self.watched[run_id]
  if not lease then return end
  local ok, why, info = lease:check()
  if not ok and why == "preempted" and self.watched[run_id] == lease then
    self.watched[run_id] = nil
    mg.spawn(lease.on_preempt, info)
  end
end

-- The coordinator's listener: subscribed while leases with on_preempt are
-- held (it ends a second after the last one is given back, or when the
-- connection is closed). Each (re)subscription checks the watched leases
-- once, for notices sent before it was in place.
local function listen(self)
  local sub = nil
  local guard <close> = setmetatable({}, { __close = function()
    self.listening = false
    if sub then sub:close() end
  end })
  local fresh = false
  while next(self.watched) do
    if not sub then
      local err
      sub, err = self.conn:subscribe(self.channel)
      if not sub then
        if errors.has(err, "cancelled") then return end   -- closed here
        mg.sleep(1)   -- Redis away: the holders' own checks will tell them
      else
        fresh = true
      end
    end
    if fresh then
      fresh = false
      local ids = {}
      for id in pairs(self.watched) do ids[#ids + 1] = id end
      for _, id in ipairs(ids) do notice(self, id) end
    end
    if sub then
      local msg, err = sub:next(1)
      if msg then
        if msg.kind == "message" then notice(self, msg.data) end
      elseif err ~= "timeout" then
        if sub.closed then sub = nil return end   -- its connection was closed
        -- the connection dropped: a new subscription after a pause (Redis
        -- may be away a while)
        sub:close()
        sub = nil
        mg.sleep(0.5)
      end
    end
  end
end

local function watch(self, lease)
  self.watched[lease.run_id] = lease
  if not self.listening then
    self.listening = true
    mg.spawn(listen, self)
  end
end

function Red:acquire(thread_id, opts)
  local o = check_args(thread_id, opts)
  local k1, k2, k3, k4 = self:keys(thread_id)
  local ttl_ms = floor(self.ttl * 1000)
  local deadline = o.timeout and (mg.now() + o.timeout) or nil
  local delay, waited = 0.02, false
  while true do
    local r, err = self.conn:call("EVAL", ACQUIRE, 4, k1, k2, k3, k4, o.run_id, o.strategy, ttl_ms,
      o.from or "", self.channel)
    if not r then return nil, err end
    local what = r[1]
    if what == "ok" then
      local lease = setmetatable({ coord = self, thread_id = thread_id, run_id = o.run_id, token = r[2],
                                   key = k1, from = o.from, on_preempt = o.on_preempt }, RedLease)
      if o.on_preempt then watch(self, lease) end
      return lease
    elseif what == "busy" then
      return nil, "busy", { holder = r[2] }
    elseif what == "preempted" then
      return nil, "preempted", preempt_info(r)
    end
    if not waited then
      waited = true
      if o.on_wait then o.on_wait(r[2]) end
    end
    if deadline and mg.now() + delay > deadline then
      return nil, "timeout", { holder = r[2] }
    end
    mg.sleep(delay)
    delay = min(delay * 2, self.poll)
  end
end

function Red:set_rollback(thread_id, from)
  return self.conn:call("SET", self.prefix .. ":thread:" .. thread_id .. ":rollback", from,
    "PX", floor(self.ttl * 2000))
end

function Red:take_rollback(thread_id)
  local r, err = self.conn:call("GETDEL", self.prefix .. ":thread:" .. thread_id .. ":rollback")
  if r == nil and err then return nil, err end
  if type(r) ~= "string" then return false end
  return r
end

function RedLease:check()
  local r, err = self.coord.conn:call("EVAL", CHECK, 1, self.key, self.token, floor(self.coord.ttl * 1000))
  if not r then return nil, err end
  if r[1] == "ok" then return true end
  if r[1] == "lost" then return nil, "lost" end
  return nil, "preempted", preempt_info(r)
end

function RedLease:release()
  local watched = self.coord.watched
  if watched[self.run_id] == self then watched[self.run_id] = nil end
  local r, err = self.coord.conn:call("EVAL", RELEASE, 1, self.key, self.token)
  if not r then return nil, err end
  return r == 1
end

---------------------------------------------------------------- files

local File = {}
File.__index = File
local FileLease = {}
FileLease.__index = FileLease

-- file(dir, {poll = 0.2}): a lock file DIR/<thread_id>.lock per thread
-- (the directory must exist). enqueue and reject only; the order of
-- waiters is not kept.
function _M.file(dir, opts)
  if type(dir) ~= "string" or dir == "" then error("bad argument #1 to 'file' (directory expected)", 2) end
  opts = opts or {}
  return setmetatable({ dir = dir, poll = opts.poll or 0.2, token = 0 }, File)
end

function File:acquire(thread_id, opts)
  local o = check_args(thread_id, opts)
  if o.strategy ~= "enqueue" and o.strategy ~= "reject" then
    return nil, "multitask_strategy '" .. o.strategy .. "' needs a coordinator that can reach the running run" ..
      " (memory or redis); a file lock supports enqueue and reject"
  end
  local path = self.dir .. "/" .. thread_id .. ".lock"
  local deadline = o.timeout and (mg.now() + o.timeout) or nil
  local delay, waited = 0.02, false
  while true do
    local lock, err, code = core.files.lock(path)
    if lock then
      self.token = self.token + 1
      return setmetatable({ coord = self, thread_id = thread_id, run_id = o.run_id, token = self.token,
                            lock = lock }, FileLease)
    end
    if code ~= "EWOULDBLOCK" then return nil, err end
    if o.strategy == "reject" then return nil, "busy", {} end
    if not waited then
      waited = true
      if o.on_wait then o.on_wait(nil) end
    end
    if deadline and mg.now() + delay > deadline then return nil, "timeout", {} end
    mg.sleep(delay)
    delay = min(delay * 2, self.poll)
  end
end

function File:set_rollback() return nil, "a file lock cannot roll back" end
function File:take_rollback() return false end

function FileLease:check()
  if not self.lock then return nil, "lost" end
  return true
end

function FileLease:release()
  if not self.lock then return false end
  self.lock:unlock()
  self.lock = nil
  return true
end

---------------------------------------------------------------- graphs

-- The id of the thread's latest checkpoint, or "" for a thread without one.
local function latest_id(app, thread_id)
  local saver = app.checkpointer
  if not saver then return "" end
  local ok, tup = pcall(saver.get, saver, { thread_id = thread_id })
  if ok and type(tup) == "table" and tup.config then return tup.config.checkpoint_id or "" end
  return ""
end

-- invoke(coord, app, input, cfg) -> state | nil, err, info
-- app:invoke(input, cfg) once the thread is free, by cfg.multitask_strategy
-- (default enqueue), waiting at most cfg.multitask_timeout seconds. A run
-- interrupted by a later one returns nil, "interrupted by <run>" (its
-- checkpoints so far stay); one rolled back returns nil, "rolled back by
-- <run>", and the run after it starts from the checkpoint the rolled-back
-- run started from (the thread forks there). Errors: "busy" (reject),
-- "timeout", or the run's own.
function _M.invoke(coord, app, input, cfg)
  if type(coord) ~= "table" or not coord.acquire then
    error("bad argument #1 to 'invoke' (a multitask coordinator expected)", 2)
  end
  if type(cfg) ~= "table" or type(cfg.thread_id) ~= "string" then
    error("bad argument #4 to 'invoke' (config with a thread_id expected)", 2)
  end
  local strategy = _M.check(cfg.multitask_strategy, 4, "invoke")
  local thread_id = cfg.thread_id
  local child, preempted
  local lease, err, info = coord:acquire(thread_id, {
    run_id = cfg.run_id, strategy = strategy, timeout = cfg.multitask_timeout,
    on_preempt = function(p)
      preempted = p
      if child and not child:done() then child:cancel() end
    end,
  })
  if not lease then return nil, err, info end
  local guard <close> = setmetatable({}, { __close = function() lease:release() end })
  -- where this run starts; a rollback of the run before it moves that back
  local run_cfg = cfg
  local back, berr = coord:take_rollback(thread_id)
  if back == nil and berr then return nil, berr end
  if back == "" then
    local saver = app.checkpointer
    if saver then
      mg.checkpoint.settle(saver, thread_id)
      saver:delete_thread(thread_id)
    end
  elseif back then
    run_cfg = {}
    for k, v in pairs(cfg) do run_cfg[k] = v end
    run_cfg.checkpoint_id = back
  end
  local from = back or latest_id(app, thread_id)
  child = mg.spawn(function() return app:invoke(input, run_cfg) end)
  -- watch the lease while the run goes on (a coordinator of other
  -- processes tells of a preemption only through check)
  local every = coord.ttl and coord.ttl / 3 or 1
  while true do
    local ok, a, b = child:join(every)
    if child:done() then
      if preempted then break end
      if ok then return a, b end
      return nil, a
    end
    local cok, why, p = lease:check()
    if preempted then break end
    if not cok and why == "preempted" then
      preempted = p
      child:cancel()
      break
    elseif not cok and why == "lost" then
      child:cancel()
      return nil, "lost the thread's lease (another run took it)"
    end
  end
  if preempted.strategy == "rollback" then
    local ok, rerr = coord:set_rollback(thread_id, from)
    if not ok then return nil, "rolled back by " .. tostring(preempted.by) .. ", but " .. tostring(rerr) end
    return nil, "rolled back by " .. tostring(preempted.by), preempted
  end
  return nil, "interrupted by " .. tostring(preempted.by), preempted
end

return _M
