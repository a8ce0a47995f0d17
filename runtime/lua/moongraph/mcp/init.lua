--[[
moongraph.mcp — Model Context Protocol client.

  local mcp = require "moongraph.mcp"
  local c = assert(mcp.connect{ command = { "npx", "-y", "some-mcp-server" } })   -- stdio
  local c = assert(mcp.connect{ url = "http://127.0.0.1:3001/mcp", headers = {...} })  -- Streamable HTTP
  for _, t in ipairs(assert(c:list_tools())) do print(t.name, t.description) end
  local r = assert(c:call_tool("echo", { message = "hi" }))
  -- r.content = { {type = "text", text = "..."}, ... }, r.structuredContent, r.isError
  c:close()

Follows the MCP specification (protocol 2025-11-25, and the versions
before it down to 2024-11-05 when a server asks for them) as the official
TypeScript SDK implements it: the initialize handshake and capability
negotiation, paged lists, progress and list-changed notifications,
cancellation, request timeouts. Every call yields the calling task; many
tasks may call through one connection at once. Runtime failures return nil,
err (a tool that fails is a result with isError = true, not an error);
misuse raises. A server that crashed gives a clear error naming how it
ended, and c:reconnect() starts it again.

See docs/mcp.md.
]]

local core = require "moongraph.core"
local jsonrpc = require "moongraph.mcp.jsonrpc"
local session_mod = require "moongraph.mcp.session"

local loop = core.loop
local type, pairs, ipairs, tostring, error, setmetatable, next =
      type, pairs, ipairs, tostring, error, setmetatable, next
local string_format = string.format

local _M = { _VERSION = core.version }

_M.LATEST_PROTOCOL_VERSION = "2025-11-25"
_M.SUPPORTED_PROTOCOL_VERSIONS = { "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05" }
_M.jsonrpc = jsonrpc

local function supported(v)
  for _, s in ipairs(_M.SUPPORTED_PROTOCOL_VERSIONS) do
    if s == v then return true end
  end
  return false
end

local CONNECT_OPTIONS = {
  command = "table", env = "table", inherit_env = "boolean", cwd = "string",
  stderr = "string", on_stderr = "function", kill_grace = "number",
  url = "string", headers = "table", ca_file = "string", listen = "boolean",
  timeout = "any", name = "string", client_info = "table", capabilities = "table",
  on_notification = "function", on_list_changed = "function", on_log = "function",
  on_error = "function", handlers = "table", roots = "table",
}

local Client = {}
Client.__index = Client
_M.Client = Client

local function check_connect(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'connect': options table expected, got " .. type(opts), 3)
  end
  for k, v in pairs(opts) do
    local want = CONNECT_OPTIONS[k]
    if not want then error("bad argument #1 to 'connect': unknown option '" .. tostring(k) .. "'", 3) end
    if want ~= "any" and type(v) ~= want then
      error(string_format("bad argument #1 to 'connect': %s must be a %s, got %s", k, want, type(v)), 3)
    end
  end
  if (opts.command == nil) == (opts.url == nil) then
    error("bad argument #1 to 'connect': give command = {program, arg, ...} (stdio) or url (HTTP)", 3)
  end
  if opts.command then
    if #opts.command == 0 then error("bad argument #1 to 'connect': command is empty", 3) end
    for i, a in ipairs(opts.command) do
      if type(a) ~= "string" then
        error("bad argument #1 to 'connect': command[" .. i .. "] must be a string", 3)
      end
    end
  elseif not opts.url:match("^https?://") then
    error("bad argument #1 to 'connect': url must start with http:// or https://", 3)
  end
  local t = opts.timeout
  if t ~= nil and t ~= false and (type(t) ~= "number" or t <= 0) then
    error("bad argument #1 to 'connect': timeout must be a number of seconds > 0 or false", 3)
  end
  if opts.stderr and opts.stderr ~= "capture" and opts.stderr ~= "inherit" and opts.stderr ~= "null" then
    error("bad argument #1 to 'connect': stderr must be \"capture\", \"inherit\" or \"null\"", 3)
  end
end

local function list_changed_kind(method)
  return method:match("^notifications/(%a+)/list_changed$")
end

-- Requests the server may send us: ping always; roots/list when roots given.
local function client_handlers(self)
  local h = { ping = function() return {} end }
  if self.opts.roots then
    h["roots/list"] = function() return { roots = jsonrpc.array(self.opts.roots) } end
  end
  for method, fn in pairs(self.opts.handlers or {}) do h[method] = fn end
  return h
end

local function start(self)
  local opts = self.opts
  local transport, err
  if opts.command then
    transport, err = require("moongraph.mcp.stdio").client(opts)
  else
    transport, err = require("moongraph.mcp.http").client(opts)
  end
  if not transport then return nil, string_format("%s: %s", self.name, err) end
  local s = session_mod.new(transport, {
    name = self.name, timeout = self.timeout, handlers = client_handlers(self),
    on_error = opts.on_error,
    on_notification = function(method, params)
      local kind = list_changed_kind(method)
      if kind and opts.on_list_changed then opts.on_list_changed(kind, params) end
      if method == "notifications/message" and opts.on_log then opts.on_log(params) end
      if opts.on_notification then opts.on_notification(method, params) end
    end,
  })
  transport:start(s)
  self.transport, self.session = transport, s

  local caps = opts.capabilities or {}
  if opts.roots and caps.roots == nil then caps.roots = { listChanged = false } end
  local res, rerr = s:request("initialize", {
    protocolVersion = _M.LATEST_PROTOCOL_VERSION,
    capabilities = caps,
    clientInfo = opts.client_info or { name = "moongraph", version = core.version },
  })
  if not res then return nil, rerr end
  if type(res) ~= "table" or type(res.protocolVersion) ~= "string" then
    return nil, self.name .. ": the initialize result has no protocolVersion"
  end
  if not supported(res.protocolVersion) then
    return nil, string_format("%s: the server speaks protocol version %s, which this client does not support (%s)",
      self.name, res.protocolVersion, table.concat(_M.SUPPORTED_PROTOCOL_VERSIONS, ", "))
  end
  self.protocol_version = res.protocolVersion
  self.server_capabilities = type(res.capabilities) == "table" and res.capabilities or {}
  self.server_info = type(res.serverInfo) == "table" and res.serverInfo or {}
  self.instructions = type(res.instructions) == "string" and res.instructions or nil
  if transport.set_protocol_version then transport:set_protocol_version(res.protocolVersion) end
  local ok, nerr = s:notify("notifications/initialized")
  if not ok then return nil, self.name .. ": " .. tostring(nerr) end
  return true
end

--[[ mcp.connect(opts) -> client | nil, err
Stdio: command = {program, arg, ...} (no shell), env (added to HOME, LOGNAME,
PATH, SHELL, TERM, USER of ours; inherit_env = true passes all of ours), cwd,
stderr = "capture" (default: kept for crash messages, each line to
on_stderr) | "inherit" | "null", kill_grace.
HTTP: url, headers, ca_file, listen (also open the server's GET stream for
notifications it sends outside requests).
Both: timeout (default seconds per request, 60; false: none), name,
client_info {name, version}, capabilities, roots ({ {uri, name}, ... }),
handlers ({method = fn(params, ctx) -> result | nil, err}) for requests the
server sends, on_progress per call, on_list_changed(kind) ("tools",
"resources", "prompts"), on_log(params), on_notification(method, params),
on_error(message) for messages that could not be used. ]]
function _M.connect(opts)
  check_connect(opts)
  local name = opts.name or (opts.command and ("mcp server '" .. opts.command[1] .. "'"))
    or ("mcp server at " .. (opts.url:match("^%a+://([^/?#]+)") or "?"))
  local timeout = opts.timeout
  if timeout == nil then timeout = 60 end
  local self = setmetatable({ opts = opts, name = name, timeout = timeout }, Client)
  local ok, err = start(self)
  if not ok then
    self:close()
    return nil, err
  end
  return self
end

--[[ c:reconnect() -> true | nil, err
Closes the connection (stopping a stdio server) and connects again, with the
same options. Calls waiting on the old connection fail. ]]
function Client:reconnect()
  self:close()
  self.closed = nil
  local ok, err = start(self)
  if not ok then
    self:close()
    return nil, err
  end
  return true
end

-- c:close(): ends the session (a stdio server is asked to leave, then
-- stopped). Safe to call twice.
function Client:close()
  if self.closed then return end
  self.closed = true
  if self.session then self.session:closed("the connection was closed") end
  if self.transport then self.transport:close() end
end
Client.__close = Client.close

function Client:__tostring()
  return self.name .. (self.closed and " (closed)" or "")
end

-- c:alive() -> true | false, why
function Client:alive()
  if self.closed then return false, "the connection was closed" end
  local s = self.session
  if not s or s.closed_err then return false, s and s.closed_err or "not connected" end
  return true
end

local REQUEST_OPTIONS = { timeout = "any", on_progress = "function", meta = "table" }

local function check_request_opts(opts, fname)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error("bad argument to '" .. fname .. "': options table expected, got " .. type(opts), 3)
  end
  for k, v in pairs(opts) do
    local want = REQUEST_OPTIONS[k]
    if not want then error("bad argument to '" .. fname .. "': unknown option '" .. tostring(k) .. "'", 3) end
    if want ~= "any" and type(v) ~= want then
      error("bad argument to '" .. fname .. "': " .. k .. " must be a " .. want, 3)
    end
  end
  local t = opts.timeout
  if t ~= nil and t ~= false and (type(t) ~= "number" or t <= 0) then
    error("bad argument to '" .. fname .. "': timeout must be a number of seconds > 0 or false", 3)
  end
  return opts
end

--[[ c:request(method, params, opts) -> result | nil, err, error_object
Any request (opts: timeout, on_progress(progress, total, message), meta =
extra _meta fields). ]]
function Client:request(method, params, opts)
  if type(method) ~= "string" then
    error("bad argument #1 to 'request': method name expected, got " .. type(method), 2)
  end
  if params ~= nil and type(params) ~= "table" then
    error("bad argument #2 to 'request': params table expected, got " .. type(params), 2)
  end
  opts = check_request_opts(opts, "request")
  if self.closed then return nil, self.name .. ": the connection was closed" end
  if opts.meta then
    local p = {}
    for k, v in pairs(params or {}) do p[k] = v end
    p._meta = opts.meta
    params = p
  end
  return self.session:request(method, params, opts)
end

-- c:notify(method, params) -> true | nil, err
function Client:notify(method, params)
  if self.closed then return nil, self.name .. ": the connection was closed" end
  return self.session:notify(method, params)
end

-- c:ping() -> true | nil, err
function Client:ping(opts)
  local r, err = self:request("ping", nil, opts)
  if not r then return nil, err end
  return true
end

-- every page of a list method, items under `key`
local function list_all(self, method, key, opts)
  opts = check_request_opts(opts, method)
  local out, cursor, pages = {}, nil, 0
  repeat
    local r, err, eobj = self:request(method, cursor and { cursor = cursor } or nil, opts)
    if not r then return nil, err, eobj end
    local items = r[key]
    if items ~= nil and type(items) ~= "table" then
      return nil, string_format("%s: %s: %s is not a list", self.name, method, key)
    end
    for _, item in ipairs(items or {}) do out[#out + 1] = item end
    cursor = r.nextCursor
    if cursor == jsonrpc.null then cursor = nil end
    pages = pages + 1
    if pages > 10000 then return nil, self.name .. ": " .. method .. ": the server keeps sending pages" end
  until cursor == nil
  return out
end

--[[ c:list_tools([opts]) -> { {name, title, description, inputSchema, outputSchema, annotations}, ... }
Each tool also has tool:call(args, [opts]) (c:call_tool(tool.name, ...)),
so the list can be handed to mg.prebuilt.react_agent as it is. ]]
function Client:list_tools(opts)
  local tools, err, eobj = list_all(self, "tools/list", "tools", opts)
  if not tools then return nil, err, eobj end
  local client = self
  local mt = { __index = {
    is_mcp_tool = true, client = client,
    call = function(tool, args, copts) return client:call_tool(tool.name, args, copts) end,
  } }
  for _, t in ipairs(tools) do
    if type(t) == "table" then setmetatable(t, mt) end
  end
  return tools
end
-- c:list_resources([opts]) -> { {uri, name, mimeType, ...}, ... }
function Client:list_resources(opts) return list_all(self, "resources/list", "resources", opts) end
function Client:list_resource_templates(opts)
  return list_all(self, "resources/templates/list", "resourceTemplates", opts)
end
-- c:list_prompts([opts]) -> { {name, description, arguments}, ... }
function Client:list_prompts(opts) return list_all(self, "prompts/list", "prompts", opts) end

--[[ c:call_tool(name, args, [opts]) -> {content, structuredContent, isError, _meta} | nil, err
A tool that fails returns its result with isError = true (the tool's own
report, for the model to read); nil, err is for protocol failures: unknown
tool, bad arguments refused by the server, timeout, crash. ]]
function Client:call_tool(name, args, opts)
  if type(name) ~= "string" then
    error("bad argument #1 to 'call_tool': tool name expected, got " .. type(name), 2)
  end
  if args ~= nil and type(args) ~= "table" then
    error("bad argument #2 to 'call_tool': arguments table expected, got " .. type(args), 2)
  end
  opts = check_request_opts(opts, "call_tool")
  local r, err, eobj = self:request("tools/call", { name = name, arguments = args or {} }, opts)
  if not r then return nil, err, eobj end
  if r.content == nil or r.content == jsonrpc.null then r.content = {} end
  if type(r.content) ~= "table" then
    return nil, string_format("%s: tools/call %s: content is not a list", self.name, name)
  end
  if r.structuredContent == jsonrpc.null then r.structuredContent = nil end
  r.isError = r.isError == true
  return r
end

-- c:read_resource(uri) -> {contents = { {uri, mimeType, text | blob}, ... }} | nil, err
function Client:read_resource(uri, opts)
  if type(uri) ~= "string" then
    error("bad argument #1 to 'read_resource': uri string expected, got " .. type(uri), 2)
  end
  return self:request("resources/read", { uri = uri }, check_request_opts(opts, "read_resource"))
end

function Client:subscribe_resource(uri, opts)
  return self:request("resources/subscribe", { uri = uri }, check_request_opts(opts, "subscribe_resource"))
end

function Client:unsubscribe_resource(uri, opts)
  return self:request("resources/unsubscribe", { uri = uri }, check_request_opts(opts, "unsubscribe_resource"))
end

-- c:get_prompt(name, args) -> {description, messages = { {role, content}, ... }} | nil, err
-- (prompt arguments are strings)
function Client:get_prompt(name, args, opts)
  if type(name) ~= "string" then
    error("bad argument #1 to 'get_prompt': prompt name expected, got " .. type(name), 2)
  end
  if args ~= nil and type(args) ~= "table" then
    error("bad argument #2 to 'get_prompt': arguments table expected, got " .. type(args), 2)
  end
  local a = {}
  for k, v in pairs(args or {}) do a[k] = tostring(v) end
  return self:request("prompts/get", { name = name, arguments = next(a) and a or nil },
    check_request_opts(opts, "get_prompt"))
end

-- c:set_log_level(level) -> true | nil, err  ("debug", "info", ... "emergency")
function Client:set_log_level(level, opts)
  local r, err = self:request("logging/setLevel", { level = level }, check_request_opts(opts, "set_log_level"))
  if not r then return nil, err end
  return true
end

-- c:text(result) -> the text parts of a tool result (or prompt message), joined
function _M.text(result)
  local parts = {}
  local content = type(result) == "table" and result.content or {}
  if type(content) == "table" and content.type then content = { content } end
  for _, c in ipairs(type(content) == "table" and content or {}) do
    if type(c) == "table" and c.type == "text" and type(c.text) == "string" then parts[#parts + 1] = c.text end
  end
  return table.concat(parts, "\n")
end

return _M
