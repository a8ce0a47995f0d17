-- moongraph.server: an HTTP/1.1 server whose handlers run in tasks.
--
--   local server = require "moongraph.server"
--   local srv = assert(server.listen{
--     host = "127.0.0.1", port = 8080,
--     routes = {
--       ["GET /health"] = function(req, res) return { json = { ok = true } } end,
--       ["GET /items/:id"] = function(req, res)
--         return { status = 200, json = { id = req.params.id, q = req.query.q } }
--       end,
--       ["GET /events"] = function(req, res)
--         for i = 1, 3 do
--           if not res:sse{ event = "tick", data = { i = i } } then return end
--           mg.sleep(1)
--         end
--       end,
--     },
--     static = "web/",
--   })
--   srv.port  srv.url  srv:wait()  srv:drain([grace])  srv:close()  srv:stats()
--
-- Every request has an id (req.id): the client's X-Request-Id when it is a
-- plain token of at most 64 bytes, else one made by the server; every
-- response carries it in X-Request-Id, the access log and the error
-- reports on stderr name it.
--
-- C (core.server) accepts, parses and writes on the runtime's loop and
-- answers what needs no Lua (404, 405, OPTIONS, CORS preflight, static
-- files, limit errors). A request that matches a route is handed to this
-- server's accept loop, which runs the handler in a task of its own, so a
-- handler may wait on HTTP, LLM, Redis or Postgres calls while others run.
--
-- A handler answers by returning {status=, headers=, body=} or
-- {status=, headers=, json=} (or a string: a 200 text/plain body), or
-- streams through `res`: res:start(status, headers), res:write(chunk),
-- res:sse{event=, id=, data=, retry=, comment=}, res:finish(). write and
-- sse wait while the client is slow (at most `stream_buffer` bytes wait in
-- the server) and return nil, "closed" once the client has gone; the
-- response ends when the handler returns. A handler error answers 500 (or
-- cuts a started stream) and is reported on stderr with the request id.
-- A handler that runs `watchdog` seconds (default 5) without yielding gets
-- a "watchdog: ..." error, so the loop and every other request go on
-- (docs/runtime.md#the-watchdog).

local core = require "moongraph.core"
local mg = require "moongraph"
local http = require "moongraph.http"
local json = require "moongraph.json"
local cjson = json.wire()

local cserver, loop, signal = core.server, core.loop, core.signal
local spawn, current = loop.spawn, loop.current
local type, pairs, ipairs, error, tostring, setmetatable, rawget, rawset,
      xpcall, pcall, select =
      type, pairs, ipairs, error, tostring, setmetatable, rawget, rawset,
      xpcall, pcall, select
local string_format, table_concat, math_type = string.format, table.concat, math.type
local traceback = debug.traceback
local decode_pct = cserver.decode
local json_encode, json_decode = cjson.encode, cjson.decode
local io_stderr = io.stderr

local _M = { _VERSION = core.version }

local Server = {}
Server.__index = Server

-- option -> checker(value) returning an error message, or nil when fine
local function positive(v) return type(v) == "number" and v > 0 and v == v end
local function integer(v) return type(v) == "number" and math.tointeger(v) ~= nil end
local function count(v) return integer(v) and v > 0 end

local CHECKS = {
  host = function(v) if type(v) ~= "string" then return "host must be a string" end end,
  port = function(v)
    if not integer(v) or v < 0 or v > 65535 then
      return "port must be an integer from 0 to 65535"
    end
  end,
  backlog = function(v) if not count(v) then return "backlog must be a positive integer" end end,
  routes = function(v) if type(v) ~= "table" then return "routes must be a table" end end,
  static = function(v) if type(v) ~= "string" then return "static must be a directory path" end end,
  max_header = function(v) if not count(v) then return "max_header must be a positive integer (bytes)" end end,
  max_body = function(v)
    if not integer(v) or v < 0 then return "max_body must be an integer >= 0 (bytes)" end
  end,
  max_connections = function(v)
    if not count(v) then return "max_connections must be a positive integer" end
  end,
  stream_buffer = function(v)
    if not count(v) then return "stream_buffer must be a positive integer (bytes)" end
  end,
  header_timeout = function(v) if not positive(v) then return "header_timeout must be > 0 seconds" end end,
  body_timeout = function(v) if not positive(v) then return "body_timeout must be > 0 seconds" end end,
  idle_timeout = function(v) if not positive(v) then return "idle_timeout must be > 0 seconds" end end,
  send_timeout = function(v) if not positive(v) then return "send_timeout must be > 0 seconds" end end,
  grace = function(v)
    if type(v) ~= "number" or v < 0 or v ~= v then return "grace must be >= 0 seconds" end
  end,
  watchdog = function(v)
    if v ~= false and (type(v) ~= "number" or not (v >= 0 and v < 1e9)) then
      return "watchdog must be 0 to 1e9 seconds (0 or false: none)"
    end
  end,
  signals = function(v)
    if v == false then return end
    if type(v) ~= "table" then return "signals must be a list of signal names or false" end
    for _, s in ipairs(v) do
      if type(s) ~= "string" then return "signals must be a list of signal names" end
    end
  end,
  log = function(v)
    if type(v) ~= "boolean" and type(v) ~= "string" then
      return "log must be true (stderr), false or a file path"
    end
  end,
  cors = function(v)
    if v == true or v == false then return end
    if type(v) ~= "table" then return "cors must be true or a table" end
    for k in pairs(v) do
      if k ~= "origins" and k ~= "headers" and k ~= "expose" and k ~= "credentials" and k ~= "max_age" then
        return "cors: unknown field '" .. tostring(k) .. "'"
      end
    end
    if v.origins ~= nil and type(v.origins) ~= "table" then return "cors.origins must be a list" end
    if v.max_age ~= nil and not integer(v.max_age) then
      return "cors.max_age must be an integer (seconds)"
    end
  end,
  tls = function(v)
    if type(v) ~= "table" or type(v.cert) ~= "string" or type(v.key) ~= "string" then
      return "tls must be {cert = path, key = path}"
    end
  end,
}

local DEFAULT_GRACE = 10
local DEFAULT_WATCHDOG = 5

local function argerror(msg)
  error("bad argument #1 to 'listen': " .. msg, 4)
end

-- "GET /x/:id" -> { key, method, pattern, fn, names }
local function parse_route(key, fn)
  if type(key) ~= "string" then argerror("route keys must be strings like \"GET /path\"") end
  local method, pattern = key:match("^(%S+)%s+(/%S*)$")
  if not method then argerror("route '" .. key .. "' must look like \"GET /path\"") end
  if method ~= "*" and not method:match("^[A-Z%-]+$") then
    argerror("route '" .. key .. "': method must be upper case (or *)")
  end
  if type(fn) ~= "function" then argerror("route '" .. key .. "' must map to a function") end
  local names = {}
  for seg in pattern:gmatch("/([^/]*)") do
    local name = seg:match("^[:*](.+)$")
    if name then names[#names + 1] = name end
  end
  return { key = key, method = method, pattern = pattern, fn = fn,
           names = #names > 0 and names or nil }
end

local function list_string(v, what)
  if v == nil then return nil end
  if type(v) == "string" then return v end
  if type(v) ~= "table" then argerror("cors." .. what .. " must be a string or a list") end
  for _, s in ipairs(v) do
    if type(s) ~= "string" then argerror("cors." .. what .. " must list strings") end
  end
  return table_concat(v, ", ")
end

-- ------------------------------------------------------------- requests

local headers_mt = http.headers_mt

local function parse_query(qs)
  local t = {}
  if not qs or qs == "" then return t end
  for pair in qs:gmatch("[^&]+") do
    local k, v = pair:match("^([^=]*)=(.*)$")
    if not k then k, v = pair, "" end
    k = decode_pct(k, true) or k
    v = decode_pct(v, true) or v
    local old = t[k]
    if old == nil then t[k] = v
    elseif type(old) == "table" then old[#old + 1] = v
    else t[k] = { old, v } end
  end
  return t
end
_M.parse_query = parse_query

local Request = {}

-- req:json() -> value | nil, err
function Request:json()
  local v, err = json_decode(self.body)
  if v == nil then
    return nil, "request body is not JSON: " .. tostring(err or "null")
  end
  return v
end

-- Fields computed on first use (most handlers never read all of them).
local lazy = {
  headers = function(r) return setmetatable(r:headers(), headers_mt) end,
  body = function(r) return r:body() end,
  query = function(r) return parse_query(r:query()) end,
  target = function(r) return r:target() end,
  remote_addr = function(r) return r:remote() end,
  id = function(r) return r:id() end,
  http_version = function(r) return r:version() end,
}

local request_mt = {
  __index = function(req, k)
    local m = Request[k]
    if m ~= nil then return m end
    local get = lazy[k]
    if get then
      local v = get(rawget(req, "_r"))
      rawset(req, k, v)
      return v
    end
  end,
}

local EMPTY = setmetatable({}, { __newindex = function()
  error("req.params has no parameters for this route", 2)
end })

-- ------------------------------------------------------------- responses

local methods = cserver.request_methods

local SSE_HEADERS = {
  ["Content-Type"] = "text/event-stream",
  ["Cache-Control"] = "no-cache",
  ["X-Accel-Buffering"] = "no",
}

local function sse_field(parts, name, v)
  v = tostring(v)
  if v:find("[\r\n%z]") then
    error("bad argument #1 to 'sse': " .. name .. " must be one line", 3)
  end
  parts[#parts + 1] = name .. ": " .. v .. "\n"
end

-- res:sse{event=, id=, data=, retry=, comment=} -> true | nil, "closed"
-- data: a string (one "data:" line per line) or a table (sent as JSON).
function methods.sse(r, ev)
  if type(ev) ~= "table" then
    error("bad argument #1 to 'sse': table expected, got " .. type(ev), 2)
  end
  if not r:started() then
    local ok, err = r:start(200, SSE_HEADERS)
    if not ok then return nil, err end
  end
  local parts = {}
  if ev.comment ~= nil then
    for line in (tostring(ev.comment) .. "\n"):gmatch("([^\r\n]*)\r?\n") do
      parts[#parts + 1] = ": " .. line .. "\n"
    end
  end
  if ev.event ~= nil then sse_field(parts, "event", ev.event) end
  if ev.id ~= nil then sse_field(parts, "id", ev.id) end
  if ev.retry ~= nil then
    if math_type(ev.retry) ~= "integer" or ev.retry < 0 then
      error("bad argument #1 to 'sse': retry must be an integer (milliseconds)", 2)
    end
    parts[#parts + 1] = "retry: " .. ev.retry .. "\n"
  end
  local data = ev.data
  if type(data) == "table" then
    local s, err = json_encode(data)
    if not s then error("bad argument #1 to 'sse': data cannot be encoded as JSON: " .. tostring(err), 2) end
    data = s
  end
  if data ~= nil then
    data = tostring(data)
    if not data:find("[\r\n]") then
      parts[#parts + 1] = "data: " .. data .. "\n"
    else
      data = data:gsub("\r\n", "\n"):gsub("\r", "\n")
      for line in (data .. "\n"):gmatch("([^\n]*)\n") do
        parts[#parts + 1] = "data: " .. line .. "\n"
      end
    end
  end
  if #parts == 0 then
    error("bad argument #1 to 'sse': an event needs data, event, id, retry or comment", 2)
  end
  parts[#parts + 1] = "\n"
  return r:write(table_concat(parts))
end

local function report(route, r, msg)
  io_stderr:write("moongraph.server: [", r:id(), "] ", route.key, ": ", tostring(msg), "\n")
  io_stderr:flush()
end

local function failed(route, r, msg)
  report(route, r, msg)
  if r:started() then r:abort()
  else
    r:respond(500, nil, '{"error":"internal server error","request_id":"' .. r:id() .. '"}',
      "application/json")
  end
end

-- Send what a handler returned. Misuse (a bad status or header) raises.
local function reply(route, r, out)
  local t = type(out)
  if t == "table" then
    if r:started() then
      return failed(route, r, "handler returned a response after it started streaming one")
    end
    local body, ctype = out.body, nil
    if out.json ~= nil then
      if body ~= nil then return failed(route, r, "handler returned both body and json") end
      local s, err = json_encode(out.json)
      if not s then return failed(route, r, "json cannot be encoded: " .. tostring(err)) end
      body, ctype = s, "application/json"
    elseif body ~= nil then
      if type(body) ~= "string" then
        return failed(route, r, "body must be a string, got " .. type(body))
      end
      ctype = "text/plain; charset=utf-8"
    end
    return r:respond(out.status, out.headers, body, ctype)
  end
  if t == "nil" then
    if r:started() then return r:finish() end
    return failed(route, r, "handler returned no response")
  end
  if t == "string" then
    return r:respond(200, nil, out, "text/plain; charset=utf-8")
  end
  return failed(route, r, "handler returned a " .. t .. " (a response table or nothing expected)")
end

local function handle(route, req, r)
  return reply(route, r, route.fn(req, r))
end

-- One request, in its own task.
local function run(routes, r, id, method, path, ...)
  local guard <close> = r     -- a cancelled task cuts its response
  local route = routes[id]
  local params = EMPTY
  local names = route.names
  if names then
    params = {}
    local n = select("#", ...)
    if n == 1 then
      params[names[1]] = ...
    else
      local vals = { ... }
      for i = 1, n do params[names[i]] = vals[i] end
    end
  end
  local req = setmetatable({ method = method, path = path, params = params, _r = r }, request_mt)
  local ok, err = xpcall(handle, traceback, route, req, r)
  if not ok then failed(route, r, err) end
end

-- ---------------------------------------------------------------- server

local function dispatch(self, r, ...)
  if not r then return false end
  self._tasks[spawn(run, self._routes, r, ...)] = true
  return true
end

local function accept_loop(self)
  local guard <close> = setmetatable({}, { __close = function() self:close() end })
  local c = self._c
  while dispatch(self, c:accept()) do end
end

local function watch_signal(self, name)
  signal.wait(name)
  if self.closed then return end
  -- a second signal while draining stops at once
  self._signal_tasks[#self._signal_tasks + 1] = spawn(function()
    signal.wait(name)
    self:close()
  end)
  self:drain()
end

-- server.listen(opts) -> server | nil, err
function _M.listen(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'listen': table expected, got " .. type(opts), 2)
  end
  for k, v in pairs(opts) do
    local check = CHECKS[k]
    if not check then
      error("bad argument #1 to 'listen': unknown option '" .. tostring(k) .. "'", 2)
    end
    local msg = check(v)
    if msg then error("bad argument #1 to 'listen': " .. msg, 2) end
  end
  local routes, croutes = {}, {}
  local keys = {}
  for key in pairs(opts.routes or {}) do keys[#keys + 1] = key end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for i, key in ipairs(keys) do
    local route = parse_route(key, opts.routes[key])
    routes[i] = route
    croutes[i] = { route.method, route.pattern }
  end
  local host = opts.host or "127.0.0.1"
  if host == "localhost" then host = "127.0.0.1" end
  local cors = opts.cors
  if cors == true then cors = {} elseif cors == false then cors = nil end
  if cors then
    cors = { origins = cors.origins, headers = list_string(cors.headers, "headers"),
             expose = list_string(cors.expose, "expose"), credentials = cors.credentials,
             max_age = cors.max_age }
  end
  local c, err = cserver.listen{
    host = host, port = opts.port or 0, backlog = opts.backlog, routes = croutes,
    static = opts.static, max_header = opts.max_header, max_body = opts.max_body,
    header_timeout = opts.header_timeout, body_timeout = opts.body_timeout,
    idle_timeout = opts.idle_timeout, send_timeout = opts.send_timeout,
    max_connections = opts.max_connections, stream_buffer = opts.stream_buffer,
    log = opts.log, cors = cors, tls = opts.tls,
  }
  if not c then return nil, err end
  local port = c:port()
  local scheme = opts.tls and "https" or "http"
  local self = setmetatable({
    host = host, port = port,
    url = string_format("%s://%s:%d", scheme, host:find(":", 1, true) and "[" .. host .. "]" or host, port),
    grace = opts.grace or DEFAULT_GRACE,
    draining = false, closed = false,
    _c = c, _routes = routes,
    _tasks = setmetatable({}, { __mode = "k" }),
    _signal_tasks = {},
    _closed_q = mg.queue(),
  }, Server)
  self._acceptor = spawn(accept_loop, self)
  -- request tasks are spawned by the acceptor: they inherit its watchdog
  local wd = opts.watchdog
  if wd == nil then wd = DEFAULT_WATCHDOG end
  loop.watchdog(wd, self._acceptor)
  local sigs = opts.signals
  if sigs == nil then sigs = { "TERM" } end
  if sigs then
    for _, name in ipairs(sigs) do
      self._signal_tasks[#self._signal_tasks + 1] = spawn(watch_signal, self, name)
    end
  end
  return self
end

local function cancel(t, me)
  if t and t ~= me and not t:done() then pcall(t.cancel, t) end
end

-- srv:close(): stop now. Connections close (a streaming handler's next
-- write returns nil, "closed") and handler tasks still running are
-- cancelled.
function Server:close()
  if self.closed then return end
  self.closed = true
  self.draining = true
  self._c:close()
  local me = current()
  for t in pairs(self._tasks) do cancel(t, me) end
  for _, t in ipairs(self._signal_tasks) do cancel(t, me) end
  self._closed_q:close()
end

-- srv:drain([grace]) -> true | false: stop accepting, close idle
-- connections, let requests in flight and streams finish for up to
-- `grace` seconds (the server's grace by default), then close. True when
-- everything finished in time. SIGTERM does this (see `signals`).
function Server:drain(grace)
  if grace ~= nil and (type(grace) ~= "number" or grace < 0) then
    error("bad argument #1 to 'drain': grace must be >= 0 seconds", 2)
  end
  if self.closed then return true end
  if not self.draining then
    self.draining = true
    self._c:drain()
  end
  local c = self._c
  local ok = mg.timeout(grace or self.grace, function() return c:wait_idle() end)
  self:close()
  return ok == true
end

-- srv:wait() waits until the server is closed (by close, drain or a signal).
function Server:wait()
  if not self.closed then self._closed_q:get() end
  return true
end

-- srv:stats() -> {connections, idle, active, queued, streaming, buffered,
-- writers_waiting, requests_total, connections_total, accept_paused}
function Server:stats()
  if self.closed then
    return { connections = 0, idle = 0, active = 0, queued = 0, streaming = 0, buffered = 0,
             writers_waiting = 0, closed = true }
  end
  return self._c:stats()
end

function Server:__tostring()
  return "moongraph server " .. self.url .. (self.closed and " (closed)" or "")
end

return _M
