--[[
moongraph.mcp.http — the MCP Streamable HTTP transport (client side), over
moongraph.http (libcurl) and the runtime's SSE parser.

Every message is POSTed to the one endpoint with
Accept: application/json, text/event-stream. A request's POST runs in a
task of its own, so the caller waits under the session's timeout and can be
cancelled (the POST is then aborted and notifications/cancelled sent). The
server answers with one JSON body, or with an SSE stream that carries
progress notifications and requests of its own before the response; either
way the messages go to the session as they arrive. Notifications and our
responses get 202 Accepted. The server's Mcp-Session-Id is sent back on
every later POST, with MCP-Protocol-Version once negotiated; close() ends
the session with DELETE. With listen = true a GET stream is also kept open
for messages the server sends outside any request.
]]

local errors = require "moongraph.errors"
local core = require "moongraph.core"
local http = require "moongraph.http"
local jsonrpc = require "moongraph.mcp.jsonrpc"

local loop = core.loop
local type, pairs, ipairs, tostring, setmetatable, pcall =
      type, pairs, ipairs, tostring, setmetatable, pcall
local string_format, string_lower, string_sub, table_concat =
      string.format, string.lower, string.sub, table.concat
local json = require "moongraph.json"
local cjson = json.wire()

local _M = {}

-- curl's limit on one exchange: the session times requests out itself
local TRANSFER_TIMEOUT = 7 * 24 * 3600

local Client = {}
Client.__index = Client

function _M.client(opts)
  return setmetatable({
    url = opts.url, extra_headers = opts.headers or {}, ca_file = opts.ca_file,
    listen = opts.listen, posts = {},
  }, Client)
end

function Client:start(session)
  self.session = session
end

function Client:set_protocol_version(v)
  self.protocol_version = v
  if self.listen and not self.listener then
    self.listener = loop.spawn(function() self:_listen() end)
  end
end

function Client:_headers(accept)
  local h = {}
  for k, v in pairs(self.extra_headers) do h[k] = v end
  h["Accept"] = accept
  if self.session_id then h["Mcp-Session-Id"] = self.session_id end
  if self.protocol_version then h["MCP-Protocol-Version"] = self.protocol_version end
  return h
end

local function media_type(res)
  local ct = res.headers and res.headers["content-type"] or ""
  return string_lower(ct:match("^%s*([^;%s]+)") or "")
end

local function deliver_text(self, text)
  local session = self.session
  local v, err = cjson.decode(text)
  if v == nil then
    session:report(string_format("mcp http: unusable message: malformed JSON (%s): %s", tostring(err), jsonrpc.show(text)))
    return
  end
  jsonrpc.integers(v)
  local list = (type(v) == "table" and v[1] ~= nil) and v or { v }
  for _, m in ipairs(list) do
    local kind, cerr = jsonrpc.check(m)
    if kind then session:receive(m, kind)
    else session:report("mcp http: unusable message: " .. cerr) end
  end
end

-- One exchange: POST (or GET) and hand every message in the answer to the
-- session. Returns true | nil, err.
function Client:_exchange(method, body)
  local sse = core.sse.new()
  local raw, mtype, status = {}, nil, nil
  local failure = nil
  local req = {
    method = method, url = self.url, timeout = TRANSFER_TIMEOUT, ca_file = self.ca_file,
    headers = self:_headers(method == "GET" and "text/event-stream" or "application/json, text/event-stream"),
    on_data = function(chunk, res)
      status = res.status
      if not mtype then
        mtype = media_type(res)
        local sid = res.headers["mcp-session-id"]
        if sid and sid ~= "" then self.session_id = sid end
      end
      if status ~= 200 or mtype ~= "text/event-stream" then
        raw[#raw + 1] = chunk
        return
      end
      local events, perr = sse:feed(chunk)
      if not events then failure = "malformed event stream: " .. tostring(perr) return false end
      for _, ev in ipairs(events) do
        if (ev.event == nil or ev.event == "message") and ev.data ~= "" then deliver_text(self, ev.data) end
      end
    end,
  }
  if body then
    req.body = body
    req.headers["Content-Type"] = "application/json"
  end
  local res, err = http.request(req)
  if not res then return nil, err end
  status = res.status
  local sid = res.headers["mcp-session-id"]
  if sid and sid ~= "" then self.session_id = sid end
  if failure then return nil, failure end
  if status == 202 or (status == 200 and method ~= "POST") then return true end
  if status == 404 and self.session_id then
    return nil, errors.new("not_found", "the server does not know this session any more (HTTP 404); reconnect",
      { details = { status = 404 } })
  end
  if status < 200 or status >= 300 then
    local text = table_concat(raw)
    local v = cjson.decode(text)
    local msg = type(v) == "table" and type(v.error) == "table" and v.error.message or text
    if #tostring(msg) > 300 then msg = string_sub(tostring(msg), 1, 300) .. "..." end
    return nil, errors.new(status == 405 and "unsupported" or status >= 500 and "unavailable" or "failed",
      string_format("HTTP %d from the server: %s", status, tostring(msg)),
      { retryable = status >= 500 or status == 429, details = { status = status } })
  end
  local mt = media_type(res)
  if mt == "application/json" then
    local text = table_concat(raw)
    if text:find("%S") then deliver_text(self, text) end
  elseif mt ~= "text/event-stream" and table_concat(raw):find("%S") then
    return nil, "unexpected content type '" .. mt .. "' from the server"
  end
  return true
end

function Client:send(msg)
  if self.closing then return nil, "connection closed" end
  local body, err = jsonrpc.encode(msg)
  if not body then return nil, err end
  if msg.method and msg.id ~= nil then
    -- a request: its answer may take long; the caller waits in the session
    local id = msg.id
    local session = self.session
    self.posts[id] = loop.spawn(function()
      local ok, xerr = self:_exchange("POST", body)
      self.posts[id] = nil
      if not ok then session:fail(id, xerr) end
    end)
    return true
  end
  return self:_exchange("POST", body)
end

-- The session gave up on request id (timeout, cancelled caller).
function Client:abandon(id)
  local t = self.posts[id]
  self.posts[id] = nil
  if t and not t:done() and t ~= loop.current() then t:cancel() end
end

function Client:_listen()
  local ok, err = self:_exchange("GET", nil)
  -- (a server that offers no GET stream answers 405: nothing to report)
  if not ok and not errors.has(err, "unsupported") and self.session then
    self.session:report("mcp http: the GET stream failed: " .. tostring(err))
  end
  self.listener = nil
end

function Client:close()
  if self.closing then return end
  self.closing = true
  for id, t in pairs(self.posts) do
    if not t:done() and t ~= loop.current() then t:cancel() end
    self.posts[id] = nil
  end
  if self.listener and not self.listener:done() and self.listener ~= loop.current() then
    self.listener:cancel()
  end
  if self.session_id and loop.current() then
    pcall(http.request, { method = "DELETE", url = self.url, timeout = 5, ca_file = self.ca_file,
      headers = self:_headers("application/json") })
  end
end

return _M
