--[[
moongraph.api.fields — the checks every field a client sends goes through,
for every route of the HTTP APIs: numbers in range and whole where the
field needs it, strings of the kind asked, text that every store takes.
Each check gives the value ready to use, or nil and a message that names
the field (the API picks the status: 400 or 422).

  local fields = require "moongraph.api.fields"
  fields.integer(v, "limit", { default = 10, min = 1, max = 1000 }) -> n | nil, msg
  fields.page(src, { limit = 10, max_limit = 1000 })   -> {limit, offset} | nil, msg
  fields.number(v, "after_seconds", { default = 0, min = 0, max = 86400 }) -> x | nil, msg
  fields.string(v, "sort_by", { default = "created_at", one_of = {...}, max = 200 })
  fields.boolean(v, "wait", { default = false })
  fields.object(v, "metadata")       -> table (nil or null: {}) | nil, msg
  fields.strings(v, "ids", { max = 1000 }) -> list of strings (nil or null: nil) | nil, msg
  fields.text(v [, "what"])           -> true | nil, msg
  fields.body(raw)                    -> value | nil, msg (any JSON text)

Absent means nil or JSON null: the default applies. Integers come from
JSON numbers (2 and 2.0 alike) or, for query parameters, from decimal
digits; infinities, NaN, fractions and values out of range are refused.

text(v) walks a decoded value: every string, key included, must be valid
UTF-8 without U+0000 (what PostgreSQL's text and jsonb refuse, so that
every backend takes the same requests), and every number finite. body(raw)
decodes a request body as JSON (RFC 8259: UTF-8, no raw control characters
inside strings) and applies text to it.

MAX_OFFSET bounds offsets (2^31 - 1): a page further than that is no page
a client can mean, and every store takes the number.
]]

local json = require "moongraph.json"

local type, tostring, tonumber, pairs, ipairs, next = type, tostring, tonumber, pairs, ipairs, next
local math_type, math_tointeger, huge = math.type, math.tointeger, math.huge
local string_format, string_find, string_sub = string.format, string.find, string.sub
local utf8_len = utf8.len
local null = json.null

local _M = {}

_M.MAX_OFFSET = 2147483647

local function absent(v) return v == nil or v == null end

-- a short rendering of what the client sent, for the message
local function shown(v)
  local t = type(v)
  if t == "number" then
    if v ~= v then return "NaN" end
    if math_type(v) == "integer" then return tostring(v) end
    return string_format("%.6g", v)
  end
  if t == "string" then
    if #v > 24 then v = string_sub(v, 1, 24) .. "..." end
    if not utf8_len(v) then return "a string that is not UTF-8" end
    return string_format("%q", v)
  end
  if t == "table" then return (json.is_array(v) or v[1] ~= nil) and "a list" or "an object" end
  return t == "boolean" and tostring(v) or t
end

local function range(opts)
  local min, max = opts.min, opts.max
  if min and max then return " from " .. min .. " to " .. max end
  if min then return " >= " .. min end
  if max then return " <= " .. max end
  return ""
end

-- integer(v, name [, {default, min, max}]) -> n | nil, msg
function _M.integer(v, name, opts)
  opts = opts or {}
  if absent(v) then return opts.default end
  local n
  if type(v) == "number" then
    n = math_tointeger(v)
  elseif type(v) == "string" and string_find(v, "^%-?%d+$") and #v <= 20 then
    n = math_tointeger(tonumber(v))
  end
  local min, max = opts.min, opts.max
  if not n or (min and n < min) or (max and n > max) then
    return nil, name .. " must be a whole number" .. range(opts) .. ", got " .. shown(v)
  end
  return n
end

-- number(v, name [, {default, min, max}]) -> x | nil, msg (finite)
function _M.number(v, name, opts)
  opts = opts or {}
  if absent(v) then return opts.default end
  local x = v
  if type(v) == "string" and string_find(v, "^%-?%d+%.?%d*$") then x = tonumber(v) end
  local min, max = opts.min, opts.max
  if type(x) ~= "number" or x ~= x or x == huge or x == -huge
     or (min and x < min) or (max and x > max) then
    return nil, name .. " must be a number" .. range(opts) .. ", got " .. shown(v)
  end
  return x
end

-- page(src, {limit = default, max_limit}) -> {limit, offset} | nil, msg
function _M.page(src, opts)
  opts = opts or {}
  local limit, err = _M.integer(src.limit, "limit",
    { default = opts.limit or 10, min = opts.min_limit or 1, max = opts.max_limit or 1000 })
  if not limit then return nil, err end
  local offset
  offset, err = _M.integer(src.offset, "offset", { default = 0, min = 0, max = _M.MAX_OFFSET })
  if not offset then return nil, err end
  return { limit = limit, offset = offset }
end

local function list_words(set)
  local out = {}
  for i, w in ipairs(set) do out[i] = w end
  if #out <= 1 then return out[1] or "" end
  return table.concat(out, ", ", 1, #out - 1) .. " or " .. out[#out]
end

-- string(v, name [, {default, one_of = {...}, max = bytes}]) -> s | nil, msg
function _M.string(v, name, opts)
  opts = opts or {}
  if absent(v) then return opts.default end
  if type(v) ~= "string" then
    if opts.one_of then return nil, name .. " must be " .. list_words(opts.one_of) .. ", got " .. shown(v) end
    return nil, name .. " must be a string, got " .. shown(v)
  end
  if opts.one_of then
    for _, w in ipairs(opts.one_of) do
      if w == v then return v end
    end
    return nil, name .. " must be " .. list_words(opts.one_of) .. ", got " .. shown(v)
  end
  local ok, err = _M.text(v, name)
  if not ok then return nil, err end
  if opts.max and #v > opts.max then
    return nil, name .. " must be at most " .. opts.max .. " bytes, got " .. #v
  end
  return v
end

-- boolean(v, name [, {default}]) -> b | nil, msg (query strings: true/false/1/0)
function _M.boolean(v, name, opts)
  opts = opts or {}
  if absent(v) then return opts.default end
  if type(v) == "boolean" then return v end
  if v == "true" or v == "True" or v == "1" then return true end
  if v == "false" or v == "False" or v == "0" then return false end
  return nil, name .. " must be true or false, got " .. shown(v)
end

-- object(v, name) -> table (nil or null: {}) | nil, msg
function _M.object(v, name)
  if absent(v) then return {} end
  if type(v) ~= "table" or json.is_array(v) or (next(v) ~= nil and v[1] ~= nil) then
    return nil, name .. " must be an object, got " .. shown(v)
  end
  return v
end

-- strings(v, name [, {max = count}]) -> list | nil (absent) | nil, msg
function _M.strings(v, name, opts)
  if absent(v) then return nil end
  if type(v) == "string" then v = { v } end
  if type(v) ~= "table" or (next(v) ~= nil and v[1] == nil) then
    return nil, name .. " must be a list of strings, got " .. shown(v)
  end
  local n = #v
  if opts and opts.max and n > opts.max then
    return nil, name .. " must list at most " .. opts.max .. " items, got " .. n
  end
  for i = 1, n do
    local s = v[i]
    if type(s) ~= "string" then
      return nil, name .. "[" .. (i - 1) .. "] must be a string, got " .. shown(s)
    end
    local ok, err = _M.text(s, name .. "[" .. (i - 1) .. "]")
    if not ok then return nil, err end
  end
  return v
end

local function bad_text(s)
  if not utf8_len(s) then return "not valid UTF-8" end
  if string_find(s, "\0", 1, true) then return "U+0000" end
  return nil
end

local function key_path(path, k)
  if type(k) == "number" then return path .. "[" .. (k - 1) .. "]" end
  if path == "" then return k end
  return path .. "." .. k
end

local function walk(v, path)
  local t = type(v)
  if t == "string" then
    local why = bad_text(v)
    if why then
      if why == "U+0000" then return (path ~= "" and path or "the text") .. " must not contain U+0000" end
      return (path ~= "" and path or "the text") .. " must be valid UTF-8"
    end
  elseif t == "number" then
    if v ~= v or v == huge or v == -huge then
      return (path ~= "" and path or "the number") .. " must be a finite number"
    end
  elseif t == "table" then
    for k, x in pairs(v) do
      local kp
      if type(k) == "string" then
        local why = bad_text(k)
        if why then
          return (path ~= "" and path or "the body") .. " has a key that " ..
            (why == "U+0000" and "contains U+0000" or "is not valid UTF-8")
        end
        kp = key_path(path, k)
      else
        kp = key_path(path, k)
      end
      local err = walk(x, kp)
      if err then return err end
    end
  end
  return nil
end

-- text(v [, what]) -> true | nil, msg naming the place inside v
function _M.text(v, what)
  local err = walk(v, what or "")
  if err then return nil, err end
  return true
end

-- body(raw) -> value | nil, msg [, "malformed": not JSON at all, else a value it refuses]
function _M.body(raw)
  local v, err = json.decode(raw)
  if v == nil then
    if not utf8_len(raw) then return nil, "the request body is not valid UTF-8", "malformed" end
    return nil, "the request body is not valid JSON: " .. tostring(err):gsub("^invalid JSON: ", ""), "malformed"
  end
  local ok, terr = _M.text(v)
  if not ok then return nil, terr end
  return v
end

return _M
