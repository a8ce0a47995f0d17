-- JSON output for the routing tools: objects with sorted keys (stable,
-- diff-friendly lines) and explicit arrays, so an empty list prints as []
-- and not {}. Output is always valid UTF-8: an invalid byte sequence in a
-- string is written as U+FFFD. Decoding is lua-cjson's.

local cjson = require "cjson"
local to_utf8 = require("moongraph.text").to_utf8

local type, pairs, ipairs, tostring, getmetatable, setmetatable, error =
  type, pairs, ipairs, tostring, getmetatable, setmetatable, error
local concat, sort = table.concat, table.sort
local format, huge = string.format, math.huge

local _M = {}

local array_mt = { __name = "json array" }

-- Mark a table as a JSON array (needed for empty ones) and return it.
function _M.array(t)
  return setmetatable(t or {}, array_mt)
end

local function is_array(t)
  if getmetatable(t) == array_mt then return true end
  local n = #t
  if n == 0 then return false end
  local count = 0
  for _ in pairs(t) do count = count + 1 end
  return count == n
end

local encode
function encode(v, out)
  local tv = type(v)
  if v == nil or v == cjson.null then
    out[#out + 1] = "null"
  elseif tv == "boolean" then
    out[#out + 1] = tostring(v)
  elseif tv == "number" then
    if v ~= v or v == huge or v == -huge then
      error("cannot encode " .. tostring(v) .. " as JSON", 0)
    end
    if math.type(v) == "integer" or (v == math.floor(v) and v > -1e15 and v < 1e15) then
      out[#out + 1] = format("%d", v)
    else
      out[#out + 1] = format("%.14g", v)
    end
  elseif tv == "string" then
    out[#out + 1] = cjson.encode(to_utf8(v))
  elseif tv == "table" then
    if is_array(v) then
      out[#out + 1] = "["
      for i, x in ipairs(v) do
        if i > 1 then out[#out + 1] = "," end
        encode(x, out)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= "string" then
          error("cannot encode a table with a " .. type(k) .. " key as a JSON object", 0)
        end
        keys[#keys + 1] = k
      end
      sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = cjson.encode(to_utf8(k))
        out[#out + 1] = ":"
        encode(v[k], out)
      end
      out[#out + 1] = "}"
    end
  else
    error("cannot encode a " .. tv .. " as JSON", 0)
  end
end

-- One line of JSON for a Lua value.
function _M.encode(v)
  local out = {}
  encode(v, out)
  return (concat(out):gsub("\\/", "/"))
end

_M.decode = cjson.decode

return _M
