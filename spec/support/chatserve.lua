-- chatserve.lua — a real `moongraph serve` process for the Chat API specs,
-- driven with curl and with raw sockets (to cut an SSE stream mid-way).
--
--   local chatserve = require "chatserve"
--   local s = chatserve.start{ args = {"--script", "gate=spec/fixtures/chat_gate.lua"},
--                              env = { MOONGRAPH_API_KEYS = "..." }, data = dir,
--                              prefix = { "nsenter", ... } }   -- a command serve runs under
--   s.url  s.pid  s.data  s.gate (CHAT_GATE_DIR of the fixture script)
--   s:open_gate()  s:close_gate()
--   s:curl{ "-X", "POST", "/chat/messages", "-d", body } -> {status, headers, body, json}
--   s:post(message_table [, headers]) -> curl result
--   local st = s:stream(job_id, { last_id =, headers =, until_tokens = N })
--     -> { events = { {id=, event=, data=, json=}, ... }, comments = {...}, ended = bool }
--     reads until the server ends the response (after done), or, with
--     until_tokens, until that many token events came, then closes the socket
--   s:stop()   -- raises if the process had died on the way (or ASan spoke)
--   chatserve.wait_until(fn, timeout, what)
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

function _M.wait_until(fn, timeout, what)
  local deadline = socket.gettime() + (timeout or 10)
  while true do
    local v = fn()
    if v then return v end
    if socket.gettime() > deadline then error("timed out waiting for " .. (what or "a condition"), 2) end
    socket.sleep(0.01)
  end
end

-- start{args, env, data, expect_fail} -> server (or, with expect_fail,
-- {code, out, err} of a serve that exited)
function _M.start(opts)
  opts = opts or {}
  local dir = opts.dir or tmp.dir("chatserve", "file")
  local data = opts.data or (dir .. "/state")
  local gate = dir .. "/gate"
  os.execute("mkdir -p " .. quote(gate))
  local errfile = dir .. "/stderr-" .. tostring(math.random(1, 1e9))
  local env = { "CHAT_GATE_DIR=" .. gate }
  for k, v in pairs(opts.env or {}) do env[#env + 1] = k .. "=" .. quote(v) end
  local args = {}
  for _, a in ipairs(opts.args or {}) do args[#args + 1] = quote(a) end
  local prefix = ""
  for _, a in ipairs(opts.prefix or {}) do prefix = prefix .. quote(a) .. " " end
  if not opts.no_port then args[#args + 1] = "--port 0" end
  local cmd = string.format("sh -c %s 2>%s",
    quote(string.format("echo $$; exec %senv -u MOONGRAPH_API_KEYS -u MOONGRAPH_API_KEYS_FILE %s %s serve --data %s %s",
      prefix, table.concat(env, " "), cli.bin, quote(data), table.concat(args, " "))), quote(errfile))
  local fh = assert(io.popen(cmd, "r"))
  local pid = tonumber(fh:read("l"))
  local line = fh:read("l")
  local url = (line or ""):match("^listening on (%S+)$")
  if not url then
    local rest = fh:read("a")
    local _, _, code = fh:close()
    local err = slurp(errfile)
    if opts.expect_fail then return { code = code, out = (line or "") .. (rest or ""), err = err } end
    error("moongraph serve did not start: " .. tostring(line) .. "\n" .. err, 2)
  end
  if opts.expect_fail then
    os.execute("kill " .. pid)
    fh:close()
    error("moongraph serve started where it should have refused: " .. url, 2)
  end
  return setmetatable({ url = url, port = tonumber(url:match(":(%d+)$")), pid = pid, fh = fh,
                        data = data, dir = dir, gate = gate, errfile = errfile }, S)
end

function S:open_gate()
  local f = assert(io.open(self.gate .. "/open", "w"))
  f:close()
end

function S:close_gate()
  os.remove(self.gate .. "/open")
end

function S:alive()
  local f = io.open("/proc/" .. self.pid .. "/stat")
  if not f then return false end
  local st = f:read("a"):match("^%d+ %b() (%a)")
  f:close()
  return st ~= nil and st ~= "Z"
end

function S:stderr() return slurp(self.errfile) end

function S:stop(signal)
  if not self.fh then return end
  local was_alive = self:alive()
  os.execute("kill -" .. (signal or "TERM") .. " " .. self.pid .. " 2>/dev/null")
  self.fh:close()
  self.fh = nil
  local err = self:stderr()
  if not was_alive then error("moongraph serve had died before stop():\n" .. err, 2) end
  if err:match("ERROR: AddressSanitizer") or err:match("runtime error:") then
    error("moongraph serve reported a sanitizer error:\n" .. err, 2)
  end
end

-- curl against the server: the first argument that starts with / is a path on it
function S:curl(args, opts)
  opts = opts or {}
  local hfile, bfile = tmp.path("h", "chatcurl"), tmp.path("b", "chatcurl")
  local parts = { "env -u LD_PRELOAD curl -s -S --max-time", tostring(opts.timeout or 30),
    "-D", quote(hfile), "-o", quote(bfile) }
  local done = false
  for _, a in ipairs(args) do
    if not done and a:sub(1, 1) == "/" then a, done = self.url .. a, true end
    parts[#parts + 1] = quote(a)
  end
  local p = assert(io.popen(table.concat(parts, " ") .. " 2>&1"))
  local out = p:read("a")
  p:close()
  local head, body = slurp(hfile), slurp(bfile)
  tmp.remove(hfile)
  tmp.remove(bfile)
  local res = { out = out, body = body, headers = {} }
  local last
  for block in (head .. "\r\n"):gmatch("(HTTP/.-\r\n)\r\n") do last = block end
  assert(last, "curl got no response: " .. out)
  res.status = tonumber(last:match("^HTTP/%S+ (%d+)"))
  for name, value in last:gmatch("\n([^:\r\n]+):%s*([^\r\n]*)") do res.headers[name:lower()] = value end
  if (res.headers["content-type"] or ""):find("json") and body ~= "" then res.json = cjson.decode(body) end
  return res
end

-- POST /chat/messages with a body (a table: encoded; a string: as it is)
function S:post(body, headers)
  local args = { "-X", "POST", "/chat/messages", "-H", "Content-Type: application/json",
                 "--data-binary", type(body) == "table" and cjson.encode(body) or body }
  for _, h in ipairs(headers or {}) do
    args[#args + 1] = "-H"
    args[#args + 1] = h
  end
  return self:curl(args)
end

-- One SSE read over a raw socket.
function S:stream(job_id, opts)
  opts = opts or {}
  local c = assert(socket.tcp())
  c:settimeout(opts.timeout or 20)
  assert(c:connect("127.0.0.1", self.port))
  local req = { "GET /chat/messages/" .. job_id .. "/stream" .. (opts.query or "") .. " HTTP/1.1",
                "Host: 127.0.0.1", "Accept: text/event-stream" }
  if opts.last_id then req[#req + 1] = "Last-Event-ID: " .. opts.last_id end
  for _, h in ipairs(opts.headers or {}) do req[#req + 1] = h end
  assert(c:send(table.concat(req, "\r\n") .. "\r\n\r\n"))
  local status = assert(c:receive("*l"))
  local code = tonumber(status:match("^HTTP/1%.1 (%d+)"))
  local headers, chunked = {}, false
  while true do
    local l = assert(c:receive("*l"))
    if l == "" then break end
    local k, v = l:match("^([^:]+):%s*(.*)$")
    if k then headers[k:lower()] = v end
  end
  chunked = (headers["transfer-encoding"] or ""):lower():find("chunked") ~= nil
  local res = { status = code, headers = headers, events = {}, comments = {}, ended = false }
  if code ~= 200 then
    local n = tonumber(headers["content-length"] or "0")
    res.body = n > 0 and c:receive(n) or ""
    c:close()
    return res
  end
  -- the body, de-chunked, parsed into events as it comes
  local buf, cur, tokens = "", {}, 0
  local function feed(line)
    if line == "" then
      if cur.data or cur.event or cur.id then
        cur.json = cur.data and cjson.decode(cur.data) or nil
        res.events[#res.events + 1] = cur
        if cur.event == "token" then tokens = tokens + 1 end
      end
      cur = {}
      return
    end
    if line:sub(1, 1) == ":" then res.comments[#res.comments + 1] = line:sub(3) return end
    local k, v = line:match("^([^:]+): ?(.*)$")
    if k == "data" then cur.data = cur.data and (cur.data .. "\n" .. v) or v
    elseif k == "event" then cur.event = v
    elseif k == "id" then cur.id = v
    elseif k == "retry" then res.retry = tonumber(v) end
  end
  local function read_more()
    if chunked then
      local size = c:receive("*l")
      if not size then return false end
      local n = tonumber(size:match("^(%x+)"), 16)
      if not n then return false end
      if n == 0 then c:receive("*l") return false end
      local data = c:receive(n)
      c:receive("*l")
      if not data then return false end
      buf = buf .. data
    else
      local data, _, partial = c:receive(1)
      data = data or partial
      if not data or data == "" then return false end
      buf = buf .. data
    end
    return true
  end
  while true do
    while true do
      local nl = buf:find("\n", 1, true)
      if not nl then break end
      feed(buf:sub(1, nl - 1))
      buf = buf:sub(nl + 1)
      if opts.until_tokens and tokens >= opts.until_tokens then
        c:close()
        return res
      end
      if opts.until_comments and #res.comments >= opts.until_comments then
        c:close()
        return res
      end
    end
    if not read_more() then break end
  end
  res.ended = true
  c:close()
  return res
end

return _M
