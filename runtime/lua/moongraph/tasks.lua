--[[
moongraph.tasks — tasks, time and queues: what the graph engine and the
clients need from the scheduler, without the public facade (`moongraph`
re-exports all of it).

  tasks.run(fn, ...)  tasks.spawn(fn, ...)  tasks.sleep(sec)  tasks.now()
  tasks.current()     tasks.deadline()      tasks.timeout(sec, fn, ...)
  tasks.gather({fn, ...})                   tasks.queue()
  tasks.watchdog(sec [, task])
]]

local core = require "moongraph.core"
local loop = core.loop

local setmetatable, error, type = setmetatable, error, type
local table_pack, table_unpack = table.pack, table.unpack

local _M = {
  run = loop.run,
  spawn = loop.spawn,
  sleep = loop.sleep,
  now = loop.now,
  current = loop.current,
  deadline = loop.deadline,
  -- watchdog(sec) -> previous: the process default; watchdog(sec, task)
  -- -> task: a task's own (runtime/watchdog.c, docs/runtime.md)
  watchdog = loop.watchdog,
}

-- mg.timeout(sec, fn, ...) -> true, ...results | false, "timeout" | false, err
-- fn runs in a child task, cancelled when the time is up (or when the caller
-- itself is cancelled). The child's deadline (mg.deadline(), inherited by the
-- tasks it spawns) bounds every call it makes: HTTP, LLM retries, Redis and
-- Postgres give up early enough for fn to handle the failure.
function _M.timeout(sec, fn, ...)
  if type(sec) ~= "number" or sec < 0 then
    error("bad argument #1 to 'timeout': non-negative number of seconds expected", 2)
  end
  if type(fn) ~= "function" then
    error("bad argument #2 to 'timeout': function expected", 2)
  end
  local child = loop.limit(loop.spawn(fn, ...), loop.now() + sec)
  local guard <close> = setmetatable({}, { __close = function()
    if not child:done() then child:cancel() end
  end })
  local res = table_pack(child:join(sec))
  if not res[1] and res[2] == "timeout" and not child:done() then
    child:cancel()
  end
  return table_unpack(res, 1, res.n)
end

-- mg.gather({fn, ...}) -> list of {ok, value|err} in input order. Each
-- entry also has named fields: ok, value (on success) or err.
function _M.gather(fns)
  if type(fns) ~= "table" then
    error("bad argument #1 to 'gather': list of functions expected", 2)
  end
  local tasks = {}
  for i = 1, #fns do
    if type(fns[i]) ~= "function" then
      error("bad argument #1 to 'gather': item " .. i .. " is not a function", 2)
    end
  end
  local guard <close> = setmetatable({}, { __close = function()
    for i = 1, #tasks do
      if not tasks[i]:done() then tasks[i]:cancel() end
    end
  end })
  for i = 1, #fns do tasks[i] = loop.spawn(fns[i]) end
  local out = {}
  for i = 1, #tasks do
    local ok, v = tasks[i]:join()
    if ok then
      out[i] = { ok, v, ok = true, value = v }
    else
      out[i] = { ok, v, ok = false, err = v }
    end
  end
  return out
end

-- Queues: q:put(v) never waits; q:get([timeout]) waits for an item.
local Queue = {}
Queue.__index = Queue

function _M.queue()
  return setmetatable({ items = {}, head = 1, tail = 0, waiters = {}, closed = false }, Queue)
end

function Queue:put(v)
  if self.closed then return nil, "closed" end
  local tail = self.tail + 1
  self.tail = tail
  self.items[tail] = v
  local waiters = self.waiters
  while #waiters > 0 do
    local t = table.remove(waiters, 1)
    if loop.wake(t) then break end
  end
  return true
end

function Queue:get(timeout)
  while true do
    local head = self.head
    if head <= self.tail then
      local v = self.items[head]
      self.items[head] = nil
      self.head = head + 1
      return v
    end
    if self.closed then return nil, "closed" end
    local me = loop.current()
    if not me then
      error("queue:get: not inside a moongraph task (use mg.run or mg.spawn)", 2)
    end
    local waiters = self.waiters
    waiters[#waiters + 1] = me
    local ok, err = loop.suspend(timeout)
    if not ok then
      for i = #waiters, 1, -1 do
        if waiters[i] == me then table.remove(waiters, i) end
      end
      return nil, err
    end
  end
end

function Queue:len()
  return self.tail - self.head + 1
end

function Queue:close()
  self.closed = true
  local waiters = self.waiters
  self.waiters = {}
  for i = 1, #waiters do loop.wake(waiters[i]) end
end

return _M
