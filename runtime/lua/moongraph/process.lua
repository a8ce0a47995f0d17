-- moongraph.process: child processes for tasks (mg.process).
--
--   local process = require "moongraph.process"
--   local p = assert(process.spawn({ "grep", "-n", "x" }, { cwd = "/tmp", timeout = 10 }))
--   p:write("a\nx\n")            -- yields while the pipe is full
--   p.stdin:close()              -- the child reads end of file
--   for line in p.stdout:lines() do print(line) end
--   local code, signal = p:wait()
--
--   local r = process.run({ "sh", "-c", "echo hi; exit 3" })  -- r.code, r.stdout, r.stderr
--
-- No shell is involved: args[1] is the program (looked up in PATH), the
-- rest are its arguments, passed as they are. Reads and writes yield the
-- calling task; many processes run at once on the one loop. Runtime
-- failures return nil, err; misuse raises.
--
-- A process never outlives the runtime: p:close() (also `local p <close>`),
-- the collection of p, and the end of the program send SIGTERM, then
-- SIGKILL after `kill_grace` seconds, and the child is reaped.

local core = require "moongraph.core"

local cproc = core.process
local loop = core.loop

local type, error, tostring, pairs, ipairs, setmetatable, select =
      type, error, tostring, pairs, ipairs, setmetatable, select
local math_type = math.type
local table_concat = table.concat

local _M = { _VERSION = core.version }

local SPAWN_OPTIONS = {
  env = "table", cwd = "string", stdin = "string", stdout = "string", stderr = "string",
  timeout = "number", kill_grace = "number", max_line = "number",
}

local mg   -- moongraph, for timeouts (it requires us lazily)
local function with_timeout(timeout, fn, ...)
  if timeout == nil then return fn(...) end
  if type(timeout) ~= "number" or timeout < 0 then
    error("bad argument: timeout must be a number of seconds >= 0", 3)
  end
  mg = mg or require "moongraph"
  local res = table.pack(mg.timeout(timeout, fn, ...))
  if res[1] then return table.unpack(res, 2, res.n) end
  if res[2] == "timeout" then return nil, "timeout" end
  error(res[2], 0)
end

---------------------------------------------------------------- streams

local Reader = {}
Reader.__index = Reader

-- reader:read_line([timeout]) -> line (without "\n") | nil (end) | nil, err
function Reader:read_line(timeout)
  return with_timeout(timeout, self.c.read, self.c, self.fd, "l")
end

-- reader:read(n, [timeout]) -> 1..n bytes as they come | nil (end) | nil, err
function Reader:read(n, timeout)
  if math_type(n) ~= "integer" or n < 1 then
    error("bad argument #1 to 'read': byte count (integer > 0) expected", 2)
  end
  return with_timeout(timeout, self.c.read, self.c, self.fd, n)
end

-- reader:read_all([timeout]) -> everything up to the end of the stream
-- ("" when it was empty) | nil, err
function Reader:read_all(timeout)
  local s, err = with_timeout(timeout, self.c.read, self.c, self.fd, "a")
  if s == nil and err == nil then return "" end
  return s, err
end

-- for line in reader:lines() do ... end (raises on a read error)
function Reader:lines()
  return function()
    local line, err = self.c:read(self.fd, "l")
    if line == nil and err then error(self.name .. ": " .. err, 2) end
    return line
  end
end

local Writer = {}
Writer.__index = Writer

-- writer:write(data, ...) -> true | nil, err
function Writer:write(...)
  local n = select("#", ...)
  local data = ...
  if n > 1 then
    local parts = { ... }
    for i = 1, n do parts[i] = tostring(parts[i]) end
    data = table_concat(parts)
  end
  if type(data) ~= "string" then
    if type(data) == "number" then data = tostring(data)
    else error("bad argument #1 to 'write': string expected, got " .. type(data), 2) end
  end
  return self.c:write(data)
end

function Writer:close()
  self.c:close_stdin()
end

---------------------------------------------------------------- process

local Process = {}
Process.__index = Process

local function check_args(args)
  if type(args) ~= "table" then
    error("bad argument #1 to 'spawn': list {program, arg, ...} expected, got " .. type(args), 3)
  end
  if #args == 0 then error("bad argument #1 to 'spawn': empty list (name the program)", 3) end
  for i = 1, #args do
    local a = args[i]
    if type(a) == "number" then args[i] = tostring(a)
    elseif type(a) ~= "string" then
      error("bad argument #1 to 'spawn': args[" .. i .. "] must be a string, got " .. type(a), 3)
    end
  end
end

--[[ process.spawn(args, opts) -> process | nil, err
args: {program, arg, ...}. opts (all optional):
  env         the child's whole environment {NAME = value} (default: ours;
              see process.environ() to extend it)
  cwd         working directory
  stdin, stdout, stderr   "pipe" (default), "inherit" or "null"
  timeout     seconds the child may run; then SIGTERM, then SIGKILL
  kill_grace  seconds between SIGTERM and SIGKILL (default 2)
  max_line    longest line read_line accepts (bytes, default 16 MiB) ]]
function _M.spawn(args, opts)
  check_args(args)
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #2 to 'spawn': options table expected, got " .. type(opts), 2)
  end
  local copts = { args = args }
  for k, v in pairs(opts or {}) do
    local want = SPAWN_OPTIONS[k]
    if not want then error("bad argument #2 to 'spawn': unknown option '" .. tostring(k) .. "'", 2) end
    if type(v) ~= want then
      error("bad argument #2 to 'spawn': " .. k .. " must be a " .. want .. ", got " .. type(v), 2)
    end
    copts[k] = v
  end
  local c, err = cproc.spawn(copts)
  if not c then return nil, err end
  local p = setmetatable({ c = c, args = args }, Process)
  p.stdin = setmetatable({ c = c, name = "stdin" }, Writer)
  p.stdout = setmetatable({ c = c, fd = 1, name = "stdout" }, Reader)
  p.stderr = setmetatable({ c = c, fd = 2, name = "stderr" }, Reader)
  return p
end

function Process:pid() return self.c:pid() end
function Process:exited() return self.c:exited() end
-- true when the child was stopped by its time limit
function Process:timed_out() return self.c:timed_out() end

-- p:write(...) and p:read_line() are p.stdin:write(...) and p.stdout:read_line()
function Process:write(...) return Writer.write(self.stdin, ...) end
function Process:read_line(timeout) return self.stdout:read_line(timeout) end

--[[ p:wait([timeout]) -> code, signal | nil, "timeout"
code: the exit status, or 128 + the signal number when a signal ended it;
signal: its name ("TERM", "KILL", ...) or nil. ]]
function Process:wait(timeout)
  return with_timeout(timeout, self.c.wait, self.c)
end

-- p:kill([sig]) -> true | nil, err     one signal: "TERM" (default), "KILL", 9, ...
function Process:kill(sig) return self.c:kill(sig) end

-- p:terminate([grace]) -> true | nil, err     SIGTERM now, SIGKILL after grace
function Process:terminate(grace) return self.c:terminate(grace) end

--[[ p:shutdown([grace]) -> code, signal
The polite stop (as MCP asks for stdio servers): close stdin, wait up to
grace seconds (default 2) for the child to leave, then SIGTERM, then SIGKILL
after the same grace; waits for it and returns how it ended. ]]
function Process:shutdown(grace)
  grace = grace or 2
  if type(grace) ~= "number" or grace < 0 then
    error("bad argument #1 to 'shutdown': grace must be a number of seconds >= 0", 2)
  end
  local c = self.c
  c:close_stdin()
  if not c:exited() then
    local code, sig = self:wait(grace)
    if code then return code, sig end
    c:terminate(grace)
  end
  return c:wait()
end

-- p:close(): stop the child (SIGTERM, SIGKILL after the grace) without
-- waiting, close the pipes. Never yields; safe to call twice.
function Process:close()
  self.c:close()
end
Process.__close = Process.close

function Process:__tostring()
  return tostring(self.c)
end

---------------------------------------------------------------- helpers

--[[ process.run(args, opts) -> {code, signal, stdout, stderr, timed_out} | nil, err
Runs a program to its end: opts.input (string) goes to its stdin, stdout
and stderr are collected in full, concurrently (a child filling one pipe
never blocks on the other). Other opts as for spawn. ]]
function _M.run(args, opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #2 to 'run': options table expected, got " .. type(opts), 2)
  end
  local input = opts.input
  if input ~= nil and type(input) ~= "string" then
    error("bad argument #2 to 'run': input must be a string", 2)
  end
  local sopts = {}
  for k, v in pairs(opts) do if k ~= "input" then sopts[k] = v end end
  if input == nil and sopts.stdin == nil then sopts.stdin = "null" end
  local p, err = _M.spawn(args, sopts)
  if not p then return nil, err end
  local guard <close> = p
  local errbuf
  local err_task = sopts.stderr == nil and loop.spawn(function() return p.stderr:read_all() end)
  local in_task = input and loop.spawn(function()
    local ok, werr = p.stdin:write(input)
    p.stdin:close()
    return ok, werr
  end)
  local out, oerr = "", nil
  if sopts.stdout == nil then out, oerr = p.stdout:read_all() end
  if err_task then
    local ok, v, e = err_task:join()
    if ok then errbuf, oerr = v, oerr or e else oerr = oerr or v end
  end
  if in_task then in_task:join() end
  local code, sig = p:wait()
  if oerr then return nil, oerr end
  return { code = code, signal = sig, stdout = out, stderr = errbuf, timed_out = p:timed_out() }
end

-- process.environ() -> a copy of this process's environment {NAME = value}
function _M.environ()
  return cproc.environ()
end

-- children started and not yet reaped (diagnostics, specs)
function _M.live()
  return cproc.live()
end

_M.Process = Process

return _M
