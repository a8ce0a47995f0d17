-- cdp.lua — the Chrome DevTools Protocol over a WebSocket (RFC 6455), with
-- LuaSocket: blocking with timeouts, one connection to one target.
--
--   local cdp = require "cdp"
--   local c = cdp.connect("ws://127.0.0.1:9222/devtools/page/ID")
--   local r = c:call("Page.navigate", { url = "http://..." })  -- the result; raises on a CDP error
--   c:call("Page.enable")  c:wait_event("Page.loadEventFired", 10)
--   c:close()
--
-- Events that arrive while a call waits are queued for wait_event.
local cjson = require "cjson"
local socket = require "socket"
local mime = require "mime"

local _M = {}
local C = {}
C.__index = C

local char, byte = string.char, string.byte

local function random_bytes(n)
  local t = {}
  for i = 1, n do t[i] = char(math.random(0, 255)) end
  return table.concat(t)
end

local function be(n, width)
  local t = {}
  for i = width, 1, -1 do
    t[i] = char(n % 256)
    n = n // 256
  end
  return table.concat(t)
end

local function mask(payload, key)
  local out = {}
  local k = { byte(key, 1, 4) }
  for i = 1, #payload do out[i] = char(byte(payload, i) ~ k[(i - 1) % 4 + 1]) end
  return table.concat(out)
end

local function frame(opcode, payload)
  local n = #payload
  local head
  if n < 126 then head = char(0x80 | opcode, 0x80 | n)
  elseif n < 65536 then head = char(0x80 | opcode, 0x80 | 126) .. be(n, 2)
  else head = char(0x80 | opcode, 0x80 | 127) .. be(n, 8) end
  local key = random_bytes(4)
  return head .. key .. mask(payload, key)
end

-- connect(ws_url [, timeout]) -> client; raises when the handshake fails
function _M.connect(url, timeout)
  local host, port, path = url:match("^ws://([^:/]+):(%d+)(/.*)$")
  assert(host, "cdp: not a ws:// URL: " .. tostring(url))
  local s = assert(socket.tcp())
  s:settimeout(timeout or 10)
  assert(s:connect(host, tonumber(port)))
  local key = mime.b64(random_bytes(16))
  assert(s:send(table.concat({
    "GET " .. path .. " HTTP/1.1", "Host: " .. host .. ":" .. port, "Upgrade: websocket",
    "Connection: Upgrade", "Sec-WebSocket-Key: " .. key, "Sec-WebSocket-Version: 13", "", "" }, "\r\n")))
  local status = assert(s:receive("*l"))
  if not status:match("^HTTP/1%.1 101") then error("cdp: the WebSocket handshake failed: " .. status) end
  repeat local l = assert(s:receive("*l")) until l == ""
  return setmetatable({ sock = s, next_id = 0, events = {}, timeout = timeout or 10 }, C)
end

function C:send_frame(opcode, payload)
  assert(self.sock:send(frame(opcode, payload)))
end

-- The next whole message (text), answering pings on the way.
function C:receive_message(timeout)
  self.sock:settimeout(timeout or self.timeout)
  local parts = {}
  while true do
    local h, err = self.sock:receive(2)
    if not h then error("cdp: the connection failed: " .. tostring(err), 0) end
    local b1, b2 = byte(h, 1, 2)
    local fin, opcode = b1 & 0x80 ~= 0, b1 & 0x0f
    local n = b2 & 0x7f
    if n == 126 then
      local x = assert(self.sock:receive(2))
      n = byte(x, 1) * 256 + byte(x, 2)
    elseif n == 127 then
      local x = assert(self.sock:receive(8))
      n = 0
      for i = 1, 8 do n = n * 256 + byte(x, i) end
    end
    local key = b2 & 0x80 ~= 0 and assert(self.sock:receive(4)) or nil
    local payload = n > 0 and assert(self.sock:receive(n)) or ""
    if key then payload = mask(payload, key) end
    if opcode == 0x8 then error("cdp: the browser closed the connection", 0)
    elseif opcode == 0x9 then self:send_frame(0xA, payload)
    elseif opcode == 0xA then -- a pong: nothing to do
    else
      parts[#parts + 1] = payload
      if fin then return table.concat(parts) end
    end
  end
end

-- An event no one waits for yet; the oldest go first past MAX_QUEUED.
local MAX_QUEUED = 500
function C:queue(msg)
  if #self.events >= MAX_QUEUED then table.remove(self.events, 1) end
  self.events[#self.events + 1] = msg
end

-- call(method [, params [, timeout]]) -> result; raises on a CDP error
function C:call(method, params, timeout)
  self.next_id = self.next_id + 1
  local id = self.next_id
  self:send_frame(0x1, cjson.encode({ id = id, method = method, params = params or {} }))
  local deadline = socket.gettime() + (timeout or self.timeout)
  while true do
    local left = deadline - socket.gettime()
    if left <= 0 then error("cdp: " .. method .. " got no answer in time", 2) end
    local msg = cjson.decode(self:receive_message(left))
    if msg.id == id then
      if msg.error then error("cdp: " .. method .. ": " .. tostring(msg.error.message), 2) end
      return msg.result
    elseif msg.method then
      self:queue(msg)
    end
  end
end

-- wait_event(method [, timeout]) -> params of the first such event (queued or new)
function C:wait_event(method, timeout)
  for i, e in ipairs(self.events) do
    if e.method == method then
      table.remove(self.events, i)
      return e.params
    end
  end
  local deadline = socket.gettime() + (timeout or self.timeout)
  while true do
    local left = deadline - socket.gettime()
    if left <= 0 then error("cdp: no " .. method .. " event in time", 2) end
    local msg = cjson.decode(self:receive_message(left))
    if msg.method == method then return msg.params end
    if msg.method then self:queue(msg) end
  end
end

function C:close()
  if self.sock then
    pcall(self.send_frame, self, 0x8, "")
    self.sock:close()
    self.sock = nil
  end
end

return _M
