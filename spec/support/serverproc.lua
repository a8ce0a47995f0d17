-- serverproc.lua — run spec/support/server_app.lua (a moongraph.server) in
-- a child process and talk to it with real clients: curl and raw sockets
-- (LuaSocket, blocking with timeouts: the server is another process).
--
--   local sp = require "serverproc"
--   local s = sp.start({ header_timeout = 0.5 }, env)  -- listen options (JSON-able),
--                      -- env: "NAME=value ..." for the server process, or nil
--   s.url  s.port  s.pid
--   local r = s:curl{ "/hello", "-H", "X: 1" }  -- {status, headers, body, out}
--   local c = s:connect()                        -- LuaSocket TCP client
--   s:stats()  s:events()  s:stderr()
--   s:signal("TERM")  s:wait_exit() -> exit code
--   s:status("VmRSS") -> kB, from /proc/PID/status (raises when it cannot read)
--   s:stop()       -- SIGTERM (KILL after 30 s); raises if it had crashed (ASan)
--                     on the way or did not exit
--
-- Nothing here sleeps to let something happen: sp.wait_until polls a
-- condition with a bound and fails loudly when the bound passes.
local cjson = require "cjson"
local socket = require "socket"
local cli = require "cli"
local tmp = require "tmp"

local _M = {}
local S = {}
S.__index = S

local quote = cli.quote

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

-- wait_until(fn, [timeout=10], what) -> fn's first truthy result
function _M.wait_until(fn, timeout, what)
  local deadline = socket.gettime() + (timeout or 10)
  while true do
    local v = fn()
    if v then return v end
    if socket.gettime() > deadline then
      error("timed out waiting for " .. (what or "a condition"), 2)
    end
    socket.sleep(0.01)
  end
end

function _M.start(opts, env)
  -- its files outlive the test that starts it when a teardown stops it
  local dir = tmp.dir("server", "file")
  local errfile = dir .. "/stderr"
  local cmd = string.format("exec %s%s run spec/support/server_app.lua %s 2>%s",
    env and ("env " .. env .. " ") or "", cli.bin, quote(cjson.encode(opts or {})), quote(errfile))
  local fh = assert(io.popen(cmd, "r"))
  local line = fh:read("l")
  local url, pid = (line or ""):match("listening on (%S+) pid (%d+)")
  if not url then
    fh:close()
    local err = slurp(errfile)
    os.remove(errfile)
    error("server_app did not start: " .. tostring(line) .. "\n" .. err, 2)
  end
  return setmetatable({
    url = url, port = tonumber(url:match(":(%d+)$")), pid = tonumber(pid),
    fh = fh, errfile = errfile, dir = dir, ncurl = 0, host = "127.0.0.1",
  }, S)
end

function S:alive()
  local f = io.open("/proc/" .. self.pid .. "/stat")
  if not f then return false end
  local st = f:read("a"):match("^%d+ %b() (%a)")
  f:close()
  return st ~= nil and st ~= "Z"
end

function S:stderr()
  return slurp(self.errfile)
end

function S:signal(name)
  assert(os.execute("kill -" .. name .. " " .. self.pid), "kill -" .. name .. " failed")
end

-- Read the rest of stdout (the process ends) -> exit code, stdout lines.
function S:wait_exit()
  local rest = self.fh:read("a")
  local _, how, code = self.fh:close()
  self.fh = nil
  return how == "exit" and code or -code, rest
end

-- A field of /proc/PID/status in kB (VmRSS, VmHWM); raises when it cannot.
function S:status(name)
  local f = assert(io.open("/proc/" .. self.pid .. "/status"), "no /proc/" .. self.pid .. "/status")
  local text = f:read("a")
  f:close()
  local v = tonumber(text:match("\n" .. name .. ":%s+(%d+) kB"))
  if not v then error("no " .. name .. " in /proc/" .. self.pid .. "/status", 2) end
  return v
end

function S:stop()
  if not self.fh then
    os.remove(self.errfile)
    return
  end
  local was_alive = self:alive()
  os.execute("kill " .. self.pid .. " 2>/dev/null")
  -- SIGTERM drains; a server that does not exit is killed and reported
  -- (closing the pipe waits for the process, which would hang the suite)
  local deadline = socket.gettime() + 30
  while self:alive() and socket.gettime() < deadline do socket.sleep(0.01) end
  local stuck = self:alive()
  if stuck then os.execute("kill -KILL " .. self.pid .. " 2>/dev/null") end
  self.fh:close()
  self.fh = nil
  local err = slurp(self.errfile)
  os.remove(self.errfile)
  if not was_alive then
    error("the server process had died before stop():\n" .. err, 2)
  end
  if stuck then
    error("the server did not exit within 30 s of SIGTERM:\n" .. err, 2)
  end
  if err:match("ERROR: AddressSanitizer") or err:match("runtime error:") then
    error("the server reported a sanitizer error:\n" .. err, 2)
  end
end

-- curl against the server: args is a list, the first a path (or full URL).
-- Returns {status, headers (lower-case names), body}; `raw` = whole stdout
-- when opts.raw.
function S:curl(args, opts)
  opts = opts or {}
  local parts = { "env -u LD_PRELOAD curl -s -S --max-time", tostring(opts.timeout or 10) }
  self.ncurl = self.ncurl + 1
  local hfile = self.dir .. "/head" .. self.ncurl
  local bfile = self.dir .. "/body" .. self.ncurl
  if not opts.raw then
    parts[#parts + 1] = "-D " .. quote(hfile) .. " -o " .. quote(bfile)
  end
  for i, a in ipairs(args) do
    if i == 1 and a:sub(1, 1) == "/" then a = self.url .. a end
    parts[#parts + 1] = quote(a)
  end
  local p = assert(io.popen(table.concat(parts, " ") .. " 2>&1"))
  local out = p:read("a")
  local ok, _, code = p:close()
  local res = { out = out, ok = ok, code = code }
  if not opts.raw then
    local head = slurp(hfile)
    res.body = slurp(bfile)
    -- the last response's head (after any 100 Continue)
    local last
    for block in (head .. "\r\n"):gmatch("(HTTP/.-\r\n)\r\n") do last = block end
    if last then
      res.status = tonumber(last:match("^HTTP/%S+ (%d+)"))
      res.headers = {}
      for name, value in last:gmatch("\n([^:\r\n]+):%s*([^\r\n]*)") do
        res.headers[name:lower()] = value
      end
    end
  end
  os.remove(hfile)
  os.remove(bfile)
  return res
end

function S:stats()
  local r = self:curl{ "/__stats" }
  assert(r.status == 200, "stats: " .. tostring(r.out))
  return cjson.decode(r.body)
end

function S:events()
  local r = self:curl{ "/__events" }
  assert(r.status == 200, "events: " .. tostring(r.out))
  return cjson.decode(r.body)
end

-- A raw TCP connection (LuaSocket), blocking with a timeout.
function S:connect(timeout)
  local c = assert(socket.tcp())
  c:settimeout(timeout or 5)
  assert(c:connect(self.host, self.port))
  return c
end

-- Read one HTTP/1.1 response from a raw connection: {status, headers, body}
-- or nil, err ("closed", "timeout"). Handles Content-Length and chunked.
function _M.read_response(c, head_only)
  local line, err = c:receive("*l")
  if not line then return nil, err end
  local status = tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  if not status then return nil, "bad status line: " .. line end
  local headers = {}
  while true do
    local h, herr = c:receive("*l")
    if not h then return nil, herr end
    if h == "" then break end
    local name, value = h:match("^([^:]+):%s*(.*)$")
    headers[name:lower()] = value
  end
  local body = ""
  if head_only or status == 204 or status == 304 then
    -- no body
  elseif headers["content-length"] then
    local n = tonumber(headers["content-length"])
    if n > 0 then
      local b, berr = c:receive(n)
      if not b then return nil, berr end
      body = b
    end
  elseif headers["transfer-encoding"] == "chunked" then
    local parts = {}
    while true do
      local size, serr = c:receive("*l")
      if not size then return nil, serr end
      local n = tonumber(size:match("^%x+"), 16)
      if n == 0 then
        c:receive("*l")
        break
      end
      parts[#parts + 1] = c:receive(n)
      c:receive("*l")
    end
    body = table.concat(parts)
  else
    body = c:receive("*a")
  end
  return { status = status, headers = headers, body = body }
end

-- Read until the server closes the connection: true, or nil, err.
function _M.read_until_closed(c, timeout)
  c:settimeout(timeout or 10)
  while true do
    local _, err, partial = c:receive(4096)
    if err == "closed" then return true, partial end
    if err then return nil, err end
  end
end

return _M
