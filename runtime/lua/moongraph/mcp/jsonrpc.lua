-- moongraph.mcp.jsonrpc: JSON-RPC 2.0 messages as MCP exchanges them.
--
--   local jsonrpc = require "moongraph.mcp.jsonrpc"
--   local msg, kind = jsonrpc.decode(line)   -- kind: "request" | "notification" | "response"
--   if not msg then print(kind) end           -- why the text is not a message
--   local text = jsonrpc.encode(msg)          -- one line, no newline
--
-- decode() accepts exactly one JSON object per call (no batches: MCP
-- 2025-06-18 and later dropped them) and checks its shape: "jsonrpc" is
-- "2.0"; a request has a string or integer id and a string method; a
-- notification a method and no id; a response an id and exactly one of
-- result and error (an error with an integer code and a string message);
-- params, when present, is an object or an array. Anything else is
-- refused with a message saying what is wrong, never raised.
--
-- lua-cjson reads every number as a float; decode() turns integral ones
-- back into integers (ids, counts and arguments compare and print as
-- users expect). JSON null is cjson.null. Messages are encoded with
-- lua-cjson (the wire needs speed, not moongraph.json's exact floats and
-- sorted keys); an empty table is an object ({}), an empty list marked with
-- json.array() (also jsonrpc.array) is [].

local json = require "moongraph.json"
local cjson = json.wire()

local type, pairs, next, tostring = type, pairs, next, tostring
local math_type, math_tointeger = math.type, math.tointeger
local string_format, string_sub, string_gsub, string_find =
      string.format, string.sub, string.gsub, string.find

local _M = {}

_M.VERSION = "2.0"
_M.null = cjson.null

-- Error codes (JSON-RPC 2.0 and MCP).
_M.PARSE_ERROR = -32700
_M.INVALID_REQUEST = -32600
_M.METHOD_NOT_FOUND = -32601
_M.INVALID_PARAMS = -32602
_M.INTERNAL_ERROR = -32603
_M.REQUEST_TIMEOUT = -32001
_M.RESOURCE_NOT_FOUND = -32002

local MAX_SHOWN = 120

local function show(s)
  s = tostring(s)
  if #s > MAX_SHOWN then s = string_sub(s, 1, MAX_SHOWN) .. "..." end
  return (string_gsub(s, "[%c]", "?"))
end
_M.show = show

-- Integral floats back to integers, in place (2^53 and beyond stay floats).
local LIMIT = 2 ^ 53
local function integers(v, depth)
  if depth > 200 then return v end
  local t = type(v)
  if t == "number" then
    if math_type(v) == "float" and v > -LIMIT and v < LIMIT then
      return math_tointeger(v) or v
    end
    return v
  end
  if t == "table" then
    for k, x in pairs(v) do
      local tx = type(x)
      if tx == "table" or tx == "number" then v[k] = integers(x, depth + 1) end
    end
  end
  return v
end
_M.integers = function(v) return integers(v, 0) end

local function is_object(v)
  if type(v) ~= "table" then return false end
  local k = next(v)
  return k == nil or type(k) == "string"
end

local function valid_id(id)
  return type(id) == "string" or math_type(id) == "integer"
end

--[[ check(msg) -> kind | nil, err
The kind of an already decoded message, or why it is not one. ]]
function _M.check(msg)
  if type(msg) ~= "table" then
    return nil, "a JSON-RPC message must be an object, got " .. (msg == cjson.null and "null" or type(msg))
  end
  if msg[1] ~= nil then
    return nil, "batches (JSON arrays) are not part of MCP"
  end
  if msg.jsonrpc ~= "2.0" then
    return nil, "\"jsonrpc\" must be \"2.0\", got " .. show(cjson.encode(msg.jsonrpc) or msg.jsonrpc)
  end
  local id, method = msg.id, msg.method
  if method ~= nil then
    if type(method) ~= "string" or method == "" then
      return nil, "\"method\" must be a non-empty string"
    end
    local params = msg.params
    if params ~= nil and type(params) ~= "table" then
      return nil, "\"params\" of " .. method .. " must be an object or an array"
    end
    if id == nil then return "notification" end
    if not valid_id(id) then
      return nil, "the id of request " .. method .. " must be a string or an integer"
    end
    return "request"
  end
  if id == nil then
    return nil, "a message needs a \"method\" (request, notification) or an \"id\" (response)"
  end
  if not valid_id(id) and id ~= cjson.null then
    return nil, "a response id must be a string or an integer"
  end
  local has_result, has_error = msg.result ~= nil, msg.error ~= nil
  if has_result == has_error then
    return nil, "a response needs exactly one of \"result\" and \"error\" (id " .. show(id) .. ")"
  end
  if has_error then
    local e = msg.error
    if type(e) ~= "table" or math_type(e.code) ~= "integer" or type(e.message) ~= "string" then
      return nil, "the error of response " .. show(id) .. " needs an integer code and a string message"
    end
  elseif not is_object(msg.result) then
    return nil, "the result of response " .. show(id) .. " must be an object"
  end
  return "response"
end

--[[ decode(text) -> msg, kind | nil, err ]]
function _M.decode(text)
  if type(text) ~= "string" then return nil, "not a string" end
  if not string_find(text, "^%s*{") then
    if string_find(text, "^%s*%[") then return nil, "batches (JSON arrays) are not part of MCP" end
    return nil, "not a JSON object: " .. show(text)
  end
  local v, err = cjson.decode(text)
  if v == nil then
    return nil, "malformed JSON (" .. tostring(err) .. "): " .. show(text)
  end
  integers(v, 0)
  local kind, cerr = _M.check(v)
  if not kind then return nil, cerr end
  return v, kind
end

---------------------------------------------------------------- encoding

-- jsonrpc.array([t]) -> t, encoded as a JSON array even when empty (the
-- runtime's one array mark, moongraph.json's)
_M.array = json.array
local is_marked_array = json.is_array

local EMPTY = "@@moongraph-empty-array-2f1c@@"
local EMPTY_JSON = ('"' .. EMPTY .. '"'):gsub("%p", "%%%0")   -- as a pattern

-- Replace empty marked lists by the sentinel, copying only what changes.
local function prep(v, depth, seen)
  if type(v) ~= "table" then return v, false end
  if next(v) == nil then
    if is_marked_array(v) then return EMPTY, true end
    return v, false
  end
  if depth > 200 or seen[v] then return v, false end
  seen[v] = true
  local copy = nil
  for k, x in pairs(v) do
    if type(x) == "table" then
      local nx, changed = prep(x, depth + 1, seen)
      if changed then
        if not copy then
          copy = {}
          for k2, x2 in pairs(v) do copy[k2] = x2 end
        end
        copy[k] = nx
      end
    end
  end
  seen[v] = nil
  if copy then return copy, true end
  return v, false
end

--[[ encode(value) -> text | nil, err ]]
function _M.encode(v)
  local p, changed = prep(v, 0, {})
  local text, err = cjson.encode(p)
  if not text then return nil, "cannot encode as JSON: " .. tostring(err) end
  if changed then text = string_gsub(text, EMPTY_JSON, "[]") end
  return text
end

---------------------------------------------------------------- builders

function _M.request(id, method, params)
  return { jsonrpc = "2.0", id = id, method = method, params = params }
end

function _M.notification(method, params)
  return { jsonrpc = "2.0", method = method, params = params }
end

function _M.result(id, result)
  return { jsonrpc = "2.0", id = id, result = result or {} }
end

function _M.error(id, code, message, data)
  return { jsonrpc = "2.0", id = id == nil and cjson.null or id,
           error = { code = code, message = message, data = data } }
end

-- "message (code N)" for an error object of a response
function _M.describe_error(e)
  if type(e) ~= "table" then return tostring(e) end
  return string_format("%s (code %s)", tostring(e.message), tostring(e.code))
end

return _M
