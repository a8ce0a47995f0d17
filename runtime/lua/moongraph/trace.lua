--[[
moongraph.trace — Chrome trace-event output for graph runs (cfg.trace).

Each task becomes one complete event ("ph":"X") on a lane of its own while
it runs, so branches that run in parallel show as parallel bars when the file
is opened in Perfetto (ui.perfetto.dev) or chrome://tracing. Lane 0 carries
one bar per superstep. Times are microseconds from the start of the run.
The file is opened when the run starts (a path that cannot be written fails
the run before any node runs) and written once, when the run ends (a plain
blocking write: tracing is a debugging aid); a failed write or close is an
error of the run.
]]

local setmetatable, io_open, math_floor, tostring = setmetatable, io.open, math.floor, tostring

local json = require "moongraph.json"

local _M = {}
local T = {}
local mt = { __index = T }

-- new(path, now) -> trace | nil, err
function _M.new(path, now)
  local f, err = io_open(path, "w")
  if not f then return nil, "trace: " .. tostring(err) end
  return setmetatable({ path = path, file = f, now = now, t0 = now(), events = {}, busy = {} }, mt)
end

local function us(self, t)
  return math_floor((t - self.t0) * 1e6 + 0.5)
end

local function lane(self)
  local busy = self.busy
  local i = 1
  while busy[i] do i = i + 1 end
  busy[i] = true
  return i
end

-- a task starts -> span
function T:begin(name, args)
  return { name = name, args = args, t = self.now(), tid = lane(self) }
end

function T:begin_step(step, ntasks)
  return { name = "step " .. step, args = { step = step, tasks = ntasks }, t = self.now(), tid = 0 }
end

function T:finish(span, status)
  local t1 = self.now()
  if span.tid ~= 0 then self.busy[span.tid] = nil end
  local args = span.args
  if status then args.status = status end
  local ev = self.events
  ev[#ev + 1] = {
    name = span.name, cat = span.tid == 0 and "step" or "task", ph = "X",
    ts = us(self, span.t), dur = us(self, t1) - us(self, span.t),
    pid = 1, tid = span.tid, args = args,
  }
end

-- write the file -> true | nil, err
function T:write()
  local ev = { { name = "process_name", ph = "M", pid = 1, tid = 0, args = { name = "moongraph" } },
    { name = "thread_name", ph = "M", pid = 1, tid = 0, args = { name = "supersteps" } } }
  local maxlane = 0
  for _, e in ipairs(self.events) do
    ev[#ev + 1] = e
    if e.tid > maxlane then maxlane = e.tid end
  end
  for i = 1, maxlane do
    ev[#ev + 1] = { name = "thread_name", ph = "M", pid = 1, tid = i, args = { name = "lane " .. i } }
  end
  local f = self.file
  self.file = nil
  local data, err = json.encode({ traceEvents = ev, displayTimeUnit = "ms" })
  if not data then
    f:close()
    return nil, "trace: " .. err
  end
  local ok, werr = f:write(data)
  local cok, cerr = f:close()
  if not ok or not cok then
    return nil, "trace: cannot write " .. self.path .. ": " .. tostring(werr or cerr)
  end
  return true
end

return _M
