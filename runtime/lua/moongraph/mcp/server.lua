--[[
moongraph.mcp.server — an MCP server for tools (and resources and prompts)
written in Lua.

  local server = require "moongraph.mcp.server"
  local s = server.new{
    name = "demo", version = "1.0",
    tools = { {
      name = "add", description = "Add two numbers",
      inputSchema = { type = "object", required = { "a", "b" },
                      properties = { a = { type = "number" }, b = { type = "number" } } },
      handler = function(args, ctx) return { sum = args.a + args.b } end,
    } },
  }
  s:serve_stdio()        -- until the client closes our stdin

Each call runs in its own task, so a slow tool never holds up the others,
and notifications/cancelled from the client cancels its task. Arguments are
validated against the tool's inputSchema (moongraph.jsonschema) before the
handler runs; a bad input, a handler that raises or returns nil, err
becomes a result with isError = true the model can read: the server itself
never goes down. An unknown tool is a JSON-RPC error (-32602), as the
specification says.

What a handler returns:
  a table with `content` (a list)  the CallToolResult as is
  a string                        one text content item
  any other table or value        structuredContent, with its JSON as text
  nil, err | error(err)           isError = true with err as text

ctx: ctx.progress(progress, [total], [message]) sends a progress
notification when the client asked for them; ctx.id, ctx.method.

Resources: { uri, name, description, mimeType, read = fn(uri) -> text |
{text = ...} | {blob = base64} | {contents = {...}} }. Prompts: { name,
description, arguments = { {name, description, required}, ... }, get =
fn(args) -> text | {messages = {...}, description} }.
]]

local core = require "moongraph.core"
local jsonrpc = require "moongraph.mcp.jsonrpc"
local jsonschema = require "moongraph.jsonschema"
local session_mod = require "moongraph.mcp.session"
local mcp = require "moongraph.mcp"

local type, pairs, ipairs, tostring, error, setmetatable, pcall, next =
      type, pairs, ipairs, tostring, error, setmetatable, pcall, next
local string_format = string.format
local json = require "moongraph.json"
local cjson = json.wire()

local _M = {}

local Server = {}
Server.__index = Server
_M.Server = Server

local NAME_PATTERN = "^[%w_%-%.]+$"

local function check_tool(t, i)
  local where = "tools[" .. tostring(i) .. "]"
  if type(t) ~= "table" then error("mcp server: " .. where .. " must be a table", 4) end
  if type(t.name) ~= "string" or not t.name:match(NAME_PATTERN) or #t.name > 128 then
    error("mcp server: " .. where .. " needs a name of letters, digits, '_', '-' or '.' (at most 128)", 4)
  end
  where = "tool '" .. t.name .. "'"
  if type(t.handler) ~= "function" then error("mcp server: " .. where .. " needs a handler function", 4) end
  if t.description ~= nil and type(t.description) ~= "string" then
    error("mcp server: " .. where .. ": description must be a string", 4)
  end
  local schema = t.inputSchema or { type = "object" }
  local ok, err = jsonschema.check_schema(schema)
  if not ok then error("mcp server: " .. where .. ": inputSchema: " .. err, 4) end
  if schema.type ~= "object" then error("mcp server: " .. where .. ": inputSchema must have type \"object\"", 4) end
  if t.outputSchema ~= nil then
    ok, err = jsonschema.check_schema(t.outputSchema)
    if not ok then error("mcp server: " .. where .. ": outputSchema: " .. err, 4) end
  end
  return schema
end

-- Schemas as the wire needs them: lists that must stay JSON arrays.
local ARRAY_KEYS = { required = true, enum = true, anyOf = true, oneOf = true, allOf = true, type = true }
local function wire_schema(s)
  if type(s) ~= "table" then return s end
  local out = {}
  for k, v in pairs(s) do
    if ARRAY_KEYS[k] and type(v) == "table" then
      if next(v) == nil then
        if k ~= "required" then out[k] = jsonrpc.array() end
      else
        local list = {}
        for i, x in ipairs(v) do list[i] = wire_schema(x) end
        out[k] = jsonrpc.array(list)
      end
    elseif type(v) == "table" then
      out[k] = wire_schema(v)
    else
      out[k] = v
    end
  end
  return out
end

--[[ server.new(decl) -> server
decl: name, version, title, instructions, tools, resources, prompts. ]]
function _M.new(decl)
  if type(decl) ~= "table" then
    error("bad argument #1 to 'new': server declaration table expected, got " .. type(decl), 2)
  end
  local self = setmetatable({
    name = decl.name or "moongraph", version = decl.version or core.version,
    title = decl.title, instructions = decl.instructions,
    tools = {}, tool_list = {}, resources = {}, resource_list = {}, prompts = {}, prompt_list = {},
  }, Server)
  for i, t in ipairs(decl.tools or {}) do self:add_tool(t, i) end
  for _, r in ipairs(decl.resources or {}) do self:add_resource(r) end
  for _, p in ipairs(decl.prompts or {}) do self:add_prompt(p) end
  return self
end

function Server:add_tool(t, i)
  local schema = check_tool(t, i or (#self.tool_list + 1))
  if self.tools[t.name] then error("mcp server: two tools are named '" .. t.name .. "'", 3) end
  local entry = { decl = t, schema = schema }
  self.tools[t.name] = entry
  self.tool_list[#self.tool_list + 1] = entry
  entry.wire = {
    name = t.name, title = t.title, description = t.description,
    inputSchema = wire_schema(schema), outputSchema = wire_schema(t.outputSchema),
    annotations = t.annotations,
  }
  return self
end

function Server:add_resource(r)
  if type(r) ~= "table" or type(r.uri) ~= "string" or type(r.read) ~= "function" then
    error("mcp server: a resource needs a uri string and a read function", 3)
  end
  self.resources[r.uri] = r
  self.resource_list[#self.resource_list + 1] = r
  return self
end

function Server:add_prompt(p)
  if type(p) ~= "table" or type(p.name) ~= "string" or type(p.get) ~= "function" then
    error("mcp server: a prompt needs a name and a get function", 3)
  end
  self.prompts[p.name] = p
  self.prompt_list[#self.prompt_list + 1] = p
  return self
end

local function text_item(s)
  return { type = "text", text = s }
end

local function tool_error(msg)
  return { content = jsonrpc.array { text_item(tostring(msg)) }, isError = true }
end

-- What a handler returned, as a CallToolResult.
local function to_result(v)
  if type(v) == "string" then return { content = jsonrpc.array { text_item(v) } } end
  if type(v) == "table" and type(v.content) == "table" then
    local r = {}
    for k, x in pairs(v) do r[k] = x end
    r.content = jsonrpc.array(v.content)
    return r
  end
  local text, err = jsonrpc.encode(v)
  if not text then return tool_error("the tool's result cannot be sent as JSON: " .. tostring(err)) end
  local r = { content = jsonrpc.array { text_item(text) } }
  if type(v) == "table" and jsonschema.is_object(v) then r.structuredContent = v end
  return r
end

local short = require("moongraph.text").error_message

function Server:call_tool(name, args, ctx)
  local entry = self.tools[name]
  if not entry then
    return nil, "Unknown tool: " .. tostring(name), jsonrpc.INVALID_PARAMS
  end
  if args == nil or args == jsonrpc.null then args = {} end
  local verr = jsonschema.validate(entry.schema, args)
  if verr then
    return tool_error(string_format("Input validation error: invalid arguments for tool %s: %s", name, verr))
  end
  local ok, v, herr = pcall(entry.decl.handler, args, ctx or {})
  if not ok then return tool_error(short(v)) end
  if v == nil then
    return tool_error(herr ~= nil and tostring(herr) or ("tool " .. name .. " returned nothing"))
  end
  local r = to_result(v)
  if entry.decl.outputSchema and not r.isError then
    if r.structuredContent == nil then
      return tool_error("tool " .. name .. " has an outputSchema but returned no structured content")
    end
    local oerr = jsonschema.validate(entry.decl.outputSchema, r.structuredContent)
    if oerr then return tool_error("tool " .. name .. " returned a result its outputSchema refuses: " .. oerr) end
  end
  return r
end

local function list_of(items, field)
  local out = {}
  for i, x in ipairs(items) do out[i] = field and x[field] or x end
  return jsonrpc.array(out)
end

local function supported(v)
  for _, s in ipairs(mcp.SUPPORTED_PROTOCOL_VERSIONS) do if s == v then return true end end
  return false
end

-- The request handlers of a session.
function Server:handlers()
  local h = {}
  h.initialize = function(params)
    local asked = params.protocolVersion
    local caps = { tools = { listChanged = false } }
    if #self.resource_list > 0 then caps.resources = { subscribe = false, listChanged = false } end
    if #self.prompt_list > 0 then caps.prompts = { listChanged = false } end
    self.client_info = params.clientInfo
    return {
      protocolVersion = supported(asked) and asked or mcp.LATEST_PROTOCOL_VERSION,
      capabilities = caps,
      serverInfo = { name = self.name, version = self.version, title = self.title },
      instructions = self.instructions,
    }
  end
  h.ping = function() return {} end
  h["tools/list"] = function() return { tools = list_of(self.tool_list, "wire") } end
  h["tools/call"] = function(params, ctx)
    if type(params.name) ~= "string" then
      return nil, "tools/call needs a tool name", jsonrpc.INVALID_PARAMS
    end
    local args = params.arguments
    if args ~= nil and args ~= jsonrpc.null and not jsonschema.is_object(args) then
      return tool_error("Input validation error: arguments must be an object")
    end
    return self:call_tool(params.name, args, ctx)
  end
  h["resources/list"] = function()
    local out = {}
    for i, r in ipairs(self.resource_list) do
      out[i] = { uri = r.uri, name = r.name or r.uri, title = r.title, description = r.description,
        mimeType = r.mimeType }
    end
    return { resources = jsonrpc.array(out) }
  end
  h["resources/templates/list"] = function() return { resourceTemplates = jsonrpc.array() } end
  h["resources/read"] = function(params)
    local r = self.resources[params.uri]
    if not r then return nil, "Resource not found: " .. tostring(params.uri), jsonrpc.RESOURCE_NOT_FOUND end
    local ok, v, err = pcall(r.read, params.uri)
    if not ok then return nil, short(v), jsonrpc.INTERNAL_ERROR end
    if v == nil then return nil, tostring(err or "no content"), jsonrpc.INTERNAL_ERROR end
    if type(v) == "table" and v.contents then return { contents = jsonrpc.array(v.contents) } end
    local item = { uri = params.uri, mimeType = r.mimeType }
    if type(v) == "table" then
      item.text, item.blob = v.text, v.blob
      item.mimeType = v.mimeType or item.mimeType
    else
      item.text = tostring(v)
    end
    return { contents = jsonrpc.array { item } }
  end
  h["prompts/list"] = function()
    local out = {}
    for i, p in ipairs(self.prompt_list) do
      out[i] = { name = p.name, title = p.title, description = p.description,
        arguments = p.arguments and jsonrpc.array(p.arguments) or nil }
    end
    return { prompts = jsonrpc.array(out) }
  end
  h["prompts/get"] = function(params)
    local p = self.prompts[params.name]
    if not p then return nil, "Unknown prompt: " .. tostring(params.name), jsonrpc.INVALID_PARAMS end
    local args = type(params.arguments) == "table" and params.arguments or {}
    for _, a in ipairs(p.arguments or {}) do
      if a.required and args[a.name] == nil then
        return nil, "prompt " .. p.name .. " needs the argument " .. a.name, jsonrpc.INVALID_PARAMS
      end
    end
    local ok, v, err = pcall(p.get, args)
    if not ok then return nil, short(v), jsonrpc.INTERNAL_ERROR end
    if v == nil then return nil, tostring(err or "no prompt"), jsonrpc.INTERNAL_ERROR end
    if type(v) == "string" then
      return { description = p.description,
        messages = jsonrpc.array { { role = "user", content = text_item(v) } } }
    end
    return { description = v.description or p.description, messages = jsonrpc.array(v.messages or {}) }
  end
  h["logging/setLevel"] = function() return {} end
  return h
end

--[[ server:serve(transport) -> reason
Runs one session over transport (moongraph.mcp.stdio.server() or any
transport with a run() loop) until the client leaves. ]]
function Server:serve(transport, opts)
  opts = opts or {}
  local s = session_mod.new(transport, {
    name = "mcp client", handlers = self:handlers(), timeout = false, on_error = opts.on_error,
  })
  transport:start(s)
  transport:run()
  return s.closed_err
end

-- server:serve_stdio([opts]): serve over our stdin/stdout until the client
-- closes stdin. Nothing else may write to stdout meanwhile.
function Server:serve_stdio(opts)
  local stdio = require "moongraph.mcp.stdio"
  return self:serve(stdio.server(), opts)
end

--[[ server.load(path) -> server | nil, err
Loads a Lua file that declares a server: it returns the declaration (see
new), or a module whose `mcp` field is the declaration or a function
returning it. ]]
function _M.load(path)
  local chunk, err = loadfile(path)
  if not chunk then return nil, err end
  local ok, mod = pcall(chunk)
  if not ok then return nil, "cannot load " .. path .. ": " .. tostring(mod) end
  if type(mod) ~= "table" then return nil, path .. " must return a table declaring tools" end
  local decl = mod
  if mod.mcp ~= nil then
    decl = mod.mcp
    if type(decl) == "function" then
      local dok, d = pcall(decl)
      if not dok then return nil, "cannot build the server of " .. path .. ": " .. tostring(d) end
      decl = d
    end
  end
  if type(decl) ~= "table" or type(decl.tools) ~= "table" then
    return nil, path .. " declares no tools (return {tools = {...}} or a module with an `mcp` field)"
  end
  local sok, s = pcall(_M.new, decl)
  if not sok then return nil, tostring(s) end
  return s
end

_M.to_result = to_result
_M.tool_error = tool_error

return _M
