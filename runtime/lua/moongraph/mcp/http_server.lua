--[[
moongraph.mcp.http_server — the MCP Streamable HTTP transport, server side,
on moongraph.server.

  local srv = assert(http_server.serve(mcp_server, { host = "127.0.0.1", port = 0 }))
  srv.url   -- "http://127.0.0.1:PORT/mcp"
  srv:close()

One endpoint (default /mcp) takes every message as a POST. An `initialize`
request opens a session: its answer carries an Mcp-Session-Id header that
the client sends back with every later message (a missing one is 400, an
unknown or closed one 404, as the specification asks). A POST that carries
a request is answered with an SSE stream holding the progress notifications
of that request and then its response (or with one JSON body when the
client does not accept text/event-stream); a client that drops the stream
cancels the request. Notifications and responses get 202 Accepted. GET opens
a stream for what the server sends outside any request (list-changed
notifications); DELETE ends the session. Requests with an Origin header that
is not a loopback address are refused (403): a browser page elsewhere must
not reach a local server (DNS rebinding).
]]

local mg = require "moongraph"
local server_mod = require "moongraph.server"
local session_mod = require "moongraph.mcp.session"
local jsonrpc = require "moongraph.mcp.jsonrpc"

local type, pairs, tostring, setmetatable = type, pairs, tostring, setmetatable
local string_format, string_find = string.format, string.find

local _M = {}

local function random_id()
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(16)
  if f then f:close() end
  if not bytes or #bytes < 16 then
    bytes = tostring(mg.now()) .. tostring({}) .. tostring(math.random())
  end
  return (bytes:sub(1, 16):gsub(".", function(c) return string_format("%02x", c:byte()) end))
end

local function error_body(code, message)
  return jsonrpc.encode(jsonrpc.error(jsonrpc.null, code, message))
end

local function answer_error(status, code, message)
  return { status = status, headers = { ["Content-Type"] = "application/json" },
           body = error_body(code, message) }
end

-- The transport of one session: it routes what the session sends to the
-- HTTP exchange waiting for it.
local Transport = {}
Transport.__index = Transport

local function new_transport()
  return setmetatable({
    waiting = {},     -- request id -> queue of the POST that carried it
    tokens = {},      -- progress token -> that queue
    listener = nil,   -- queue of the open GET stream, if any
  }, Transport)
end

function Transport:start(session) self.session = session end

function Transport:send(msg)
  local q, final = nil, false
  if msg.method == nil then
    q, final = self.waiting[msg.id], true           -- a response
  elseif msg.id == nil then
    local p = msg.params
    local token = type(p) == "table" and p.progressToken
    q = token ~= nil and self.tokens[token] or self.listener
  else
    q = self.listener                               -- a request of ours
  end
  if not q then return true end                     -- nobody to hear it: dropped
  local text, err = jsonrpc.encode(msg)
  if not text then return nil, err end
  q:put { text = text, final = final }
  return true
end

function Transport:close()
  for _, q in pairs(self.waiting) do q:close() end
  if self.listener then self.listener:close() end
end

local function accepts(req, mime)
  local a = req.headers["accept"]
  return a ~= nil and string_find(a, mime, 1, true) ~= nil
end

local LOOPBACK = { ["127.0.0.1"] = true, ["localhost"] = true, ["[::1]"] = true }

local function origin_allowed(req)
  local origin = req.headers["origin"]
  if origin == nil then return true end
  local host = origin:match("^https?://([^/:]+)") or origin:match("^https?://(%[[^%]]+%])")
  return host ~= nil and LOOPBACK[host] == true
end

--[[ serve(mcp_server, {host =, port =, path = "/mcp", on_error =, log =}) ->
server | nil, err. mcp_server is a moongraph.mcp.server. ]]
function _M.serve(mcp, opts)
  opts = opts or {}
  local path = opts.path or "/mcp"
  local sessions = {}   -- id -> { session =, transport = }

  local function lookup(req)
    local id = req.headers["mcp-session-id"]
    if id == nil then
      return nil, answer_error(400, jsonrpc.INVALID_REQUEST, "Bad Request: Mcp-Session-Id header is required")
    end
    local s = sessions[id]
    if not s then return nil, answer_error(404, jsonrpc.INVALID_REQUEST, "Session not found") end
    return s, id
  end

  local function post(req, res)
    if not origin_allowed(req) then return answer_error(403, jsonrpc.INVALID_REQUEST, "Forbidden origin") end
    local msg, kind = jsonrpc.decode(req.body or "")
    if not msg then return answer_error(400, jsonrpc.PARSE_ERROR, "Parse error: " .. tostring(kind)) end
    local s, sid
    if kind == "request" and msg.method == "initialize" then
      sid = random_id()
      local t = new_transport()
      s = { transport = t }
      s.session = session_mod.new(t, {
        name = "mcp client", handlers = mcp:handlers(), timeout = false, on_error = opts.on_error,
      })
      t:start(s.session)
      sessions[sid] = s
    else
      local err
      s, err = lookup(req)
      if not s then return err end
      sid = err
    end
    if kind ~= "request" then
      s.session:receive(msg, kind)
      return { status = 202 }
    end
    local t = s.transport
    local q = mg.queue()
    t.waiting[msg.id] = q
    local meta = type(msg.params) == "table" and type(msg.params._meta) == "table" and msg.params._meta
    local token = meta and meta.progressToken
    if token ~= nil then t.tokens[token] = q end
    local function done()
      if t.waiting[msg.id] == q then t.waiting[msg.id] = nil end
      if token ~= nil and t.tokens[token] == q then t.tokens[token] = nil end
    end
    s.session:receive(msg, kind)
    local streaming = accepts(req, "text/event-stream")
    if streaming then
      local ok = res:start(200, { ["Content-Type"] = "text/event-stream", ["Cache-Control"] = "no-cache",
                                  ["Mcp-Session-Id"] = sid })
      if not ok then done(); return end
    end
    while true do
      local item = q:get()
      if item == nil then
        done()
        if streaming then return end
        return answer_error(500, jsonrpc.INTERNAL_ERROR, "session closed")
      end
      if streaming then
        if not res:sse { event = "message", data = item.text } then
          -- the client went away: cancel what it asked for
          done()
          s.session:receive({ jsonrpc = "2.0", method = "notifications/cancelled",
                              params = { requestId = msg.id, reason = "client disconnected" } }, "notification")
          return
        end
      end
      if item.final then
        done()
        if streaming then return end
        return { status = 200, headers = { ["Content-Type"] = "application/json", ["Mcp-Session-Id"] = sid },
                 body = item.text }
      end
    end
  end

  local function get(req, res)
    if not origin_allowed(req) then return answer_error(403, jsonrpc.INVALID_REQUEST, "Forbidden origin") end
    if not accepts(req, "text/event-stream") then
      return answer_error(406, jsonrpc.INVALID_REQUEST, "Not Acceptable: the client must accept text/event-stream")
    end
    local s, err = lookup(req)
    if not s then return err end
    if s.transport.listener then
      return answer_error(409, jsonrpc.INVALID_REQUEST, "Conflict: this session already has a stream open")
    end
    local q = mg.queue()
    s.transport.listener = q
    local ok = res:start(200, { ["Content-Type"] = "text/event-stream", ["Cache-Control"] = "no-cache" })
    while ok do
      local item, why = q:get(15)
      if item then
        ok = res:sse { event = "message", data = item.text }
      elseif why == "timeout" then
        ok = res:sse { comment = "keep-alive" }
      else
        break
      end
    end
    if s.transport.listener == q then s.transport.listener = nil end
  end

  local function delete(req)
    if not origin_allowed(req) then return answer_error(403, jsonrpc.INVALID_REQUEST, "Forbidden origin") end
    local s, sid = lookup(req)
    if not s then return sid end
    sessions[sid] = nil
    s.session:closed("the client ended the session")
    s.transport:close()
    return { status = 200 }
  end

  local srv, err = server_mod.listen {
    host = opts.host or "127.0.0.1", port = opts.port or 0, log = opts.log,
    routes = { ["POST " .. path] = post, ["GET " .. path] = get, ["DELETE " .. path] = delete },
  }
  if not srv then return nil, err end
  local wrapper = { url = "http://" .. (opts.host or "127.0.0.1") .. ":" .. srv.port .. path,
                    port = srv.port, server = srv }
  function wrapper:wait() return srv:wait() end
  function wrapper:close()
    for id, s in pairs(sessions) do
      sessions[id] = nil
      s.session:closed("the server is shutting down")
      s.transport:close()
    end
    return srv:close()
  end
  function wrapper:sessions()
    local n = 0
    for _ in pairs(sessions) do n = n + 1 end
    return n
  end
  return wrapper
end

return _M
