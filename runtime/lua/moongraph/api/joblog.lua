--[[
moongraph.api.joblog — durable event logs of jobs, numbered, followable.

Each job has one log: a file <dir>/<job_id>.log with one event a line,
"<id>\t<type>\t<json>\n", ids 1, 2, 3, ... in the order the events were
appended. A reader asks for the events after the last id it has and waits
for more; a log is finished once its `done` event is in.

  local joblog = require "moongraph.api.joblog"
  local logs = assert(joblog.open(dir))
  local log = assert(logs:create(job_id))     -- or logs:get(job_id): an existing log
  local id = log:append("token", { node = "answer", text = "안" })   -- -> id | nil, err
  log:after(n)           -- -> { {id=, type=, data=<JSON text>}, ... } with id > n
  log:wait(n, timeout)   -- -> true once there is an event after n (or the log is
                         --    finished), false after timeout seconds
  log.finished  log.last
  logs:remove(job_id)

Appends go to the file at once (a write and a flush), so a process that
stops loses no event it had appended; a line cut short by a crash is
dropped when the log is read again. An append that fails (a full disk)
returns nil, err and publishes nothing; the log's next append first
rewrites the whole file from what it holds (atomically: a temp file
renamed into place), so a line the failed write cut short never stays in
the middle of a log. Logs of finished jobs stay on disk and are read back
on demand; only the last `cache` of them (256) stay in memory.
]]

local mg = require "moongraph"
local json = require "moongraph.json"
local cjson = json.wire()
local ids = require "moongraph.ids"
local store = require("moongraph.core").store

local type, tostring, tonumber, setmetatable, ipairs, pairs =
  type, tostring, tonumber, setmetatable, ipairs, pairs
local io_open = io.open
local string_format = string.format

local _M = {}
local Logs = {}
Logs.__index = Logs
local Log = {}
Log.__index = Log

_M.CACHE = 256

-- open(dir, [{cache = N}]) -> logs | nil, err
function _M.open(dir, opts)
  if type(dir) ~= "string" or dir == "" then
    error("bad argument #1 to 'open': directory path expected", 2)
  end
  local ok, err = store.mkdir(dir)
  if not ok then return nil, "cannot create " .. dir .. ": " .. tostring(err) end
  return setmetatable({
    dir = dir, live = {}, done = {}, done_order = {},
    cache = opts and opts.cache or _M.CACHE,
  }, Logs)
end

local function path_of(self, job_id)
  return self.dir .. "/" .. job_id .. ".log"
end

-- Events of a log file, and the byte length of its whole lines.
local function read_file(path)
  local f = io_open(path, "rb")
  if not f then return nil end
  local text = f:read("a") or ""
  f:close()
  local events, good = {}, 0
  local pos = 1
  while true do
    local nl = text:find("\n", pos, true)
    if not nl then break end
    local line = text:sub(pos, nl - 1)
    local id, etype, data = line:match("^(%d+)\t([%w_]+)\t(.*)$")
    id = tonumber(id)
    if not id or id ~= #events + 1 then break end
    events[id] = { id = id, type = etype, data = data }
    good = nl
    pos = nl + 1
  end
  return events, good, text
end

local function new_log(self, job_id, events)
  local last = #events
  return setmetatable({
    logs = self, job_id = job_id, path = path_of(self, job_id),
    events = events, last = last,
    finished = last > 0 and events[last].type == "done",
    waiters = {},
  }, Log)
end

local function remember_done(self, log)
  self.live[log.job_id] = nil
  if self.done[log.job_id] then return end
  self.done[log.job_id] = log
  local order = self.done_order
  order[#order + 1] = log.job_id
  while #order > self.cache do
    local old = table.remove(order, 1)
    self.done[old] = nil
  end
end

-- create(job_id) -> log | nil, err: a new empty log (an existing one is
-- opened for appending instead, as after a restart).
function Logs:create(job_id)
  local ok, err = ids.check(job_id, "job_id")
  if not ok then error("bad argument #1 to 'create': " .. err, 2) end
  local log = self.live[job_id]
  if log then return log end
  log, err = self:get(job_id)
  if log then
    if not log.finished then self.live[job_id] = log end
    return log
  end
  if err then return nil, err end
  log = new_log(self, job_id, {})
  self.live[job_id] = log
  return log
end

-- get(job_id) -> log | nil (no such log) | nil, err
function Logs:get(job_id)
  if not ids.valid(job_id) then return nil end
  local log = self.live[job_id] or self.done[job_id]
  if log then return log end
  local path = path_of(self, job_id)
  local events, good, text = read_file(path)
  if not events then return nil end
  if good < #text then
    -- a line cut short by a crash: drop it so appends start on a fresh line
    local w, err = io_open(path, "wb")
    if not w then return nil, "cannot repair " .. path .. ": " .. tostring(err) end
    w:write(text:sub(1, good))
    w:close()
  end
  log = new_log(self, job_id, events)
  if log.finished then remember_done(self, log) else self.live[job_id] = log end
  return log
end

function Logs:remove(job_id)
  local log = self.live[job_id] or self.done[job_id]
  if log then
    log:_close()
    log.removed = true
    log.finished = true
    log:_wake()
  end
  self.live[job_id], self.done[job_id] = nil, nil
  os.remove(path_of(self, job_id))
end

function Log:_wake()
  local w = self.waiters
  if #w == 0 then return end
  self.waiters = {}
  for i = 1, #w do w[i]:put(true) end
end

function Log:_close()
  if self.fh then
    self.fh:close()
    self.fh = nil
  end
end

local function line_of(id, etype, text)
  return string_format("%d\t%s\t%s\n", id, etype, text)
end

-- after a failed write: the file again as the events held say (a task may
-- wait here: the rewrite runs on the thread pool)
function Log:_repair()
  local parts = {}
  for i = 1, self.last do
    local e = self.events[i]
    parts[i] = line_of(e.id, e.type, e.data)
  end
  local ok, err = store.write(self.path, table.concat(parts))
  if not ok then return nil, "cannot rewrite " .. self.path .. ": " .. tostring(err) end
  self.torn = nil
  return true
end

-- append(type, data) -> id | nil, err. data: a table (written as JSON) or
-- a JSON text. Nothing is appended after `done`.
function Log:append(etype, data)
  if type(etype) ~= "string" or not etype:find("^[%w_]+$") then
    error("bad argument #1 to 'append': event type (a word) expected", 2)
  end
  if self.finished then return nil, "the job's log is finished" end
  local text = data
  if type(data) ~= "string" then
    local err
    text, err = cjson.encode(data == nil and {} or data)
    if not text then text = cjson.encode { unencodable = tostring(err) } end
  end
  if self.torn then
    local ok, err = self:_repair()
    if not ok then return nil, err end
  end
  if not self.fh then
    local f, err = io_open(self.path, "ab")
    if not f then return nil, "cannot open " .. self.path .. ": " .. tostring(err) end
    f:setvbuf("no")
    self.fh = f
  end
  local id = self.last + 1
  local ok, err = self.fh:write(line_of(id, etype, text))
  if not ok then
    self:_close()
    self.torn = true
    return nil, "cannot write " .. self.path .. ": " .. tostring(err)
  end
  self.last = id
  self.events[id] = { id = id, type = etype, data = text }
  if etype == "done" then
    self.finished = true
    self:_close()
    remember_done(self.logs, self)
  end
  self:_wake()
  return id
end

function Log:after(n)
  n = tonumber(n) or 0
  if n < 0 then n = 0 end
  local out = {}
  for i = n + 1, self.last do out[#out + 1] = self.events[i] end
  return out
end

function Log:wait(n, timeout)
  if self.last > (tonumber(n) or 0) or self.finished then return true end
  local q = mg.queue()
  self.waiters[#self.waiters + 1] = q
  local got = q:get(timeout)
  if not got then
    for i = #self.waiters, 1, -1 do
      if self.waiters[i] == q then table.remove(self.waiters, i) end
    end
    return self.last > (tonumber(n) or 0) or self.finished
  end
  return true
end

-- Job ids of the logs on disk (for start-up).
function Logs:list()
  local names = store.list(self.dir) or {}
  local out = {}
  for _, name in ipairs(names) do
    local id = name:match("^(.+)%.log$")
    if id then out[#out + 1] = id end
  end
  return out
end

return _M
