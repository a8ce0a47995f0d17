--[[
moongraph.json — the runtime's JSON codec: checkpoints, pending writes,
traces, cache keys and the JSON that commands print.

Checkpointed state must come back exactly as it went in, so this codec keeps
what a general JSON library loses: integers stay integers and floats stay
floats (2 and 2.0 are written differently), floats round-trip exactly, empty
arrays stay arrays (json.array marks them; decode marks the ones it reads),
and object keys are sorted, so equal tables encode to equal strings (the
node cache uses that as its default key). Values that JSON cannot hold
(functions, coroutines, userdata, NaN, tables mixing list and map keys,
cycles) are refused with the path to the offending value.

The encoder and the decoder run in C (moongraph.core.json, runtime/json.c)
when the core module is there. The decoder gives what the Lua decoder below
gives (lua_decode); the encoder writes the same bytes, and hands every value it does
not take (one that cannot be saved, or encode_output's) to the Lua encoder
below, which writes it or names the path that failed.

Strings are written byte for byte (a checkpoint gives back what it got);
encode(v, {valid_utf8 = true}) writes invalid UTF-8 sequences as U+FFFD, for
output that another program parses.

JSON null decodes to cjson.null when lua-cjson is installed (the value HTTP
clients use), else to json.null; both encode back to null. Wire protocols
(HTTP APIs, LLM replies, JSON-RPC, logs) need nothing this codec keeps:
json.wire() gives them lua-cjson, faster. This module is the runtime's one
way to JSON; no other file requires lua-cjson.
]]

local type, pairs, tostring, tonumber, error = type, pairs, tostring, tonumber, error
local math_type, math_tointeger, huge = math.type, math.tointeger, math.huge
local math_floor, math_abs = math.floor, math.abs
local string_format, string_byte, string_sub, string_find, string_gsub =
  string.format, string.byte, string.sub, string.find, string.gsub
local table_concat, table_sort, utf8_char = table.concat, table.sort, utf8.char
local pcall, rawequal, setmetatable, getmetatable = pcall, rawequal, setmetatable, getmetatable
local utf8_len = utf8.len
local to_utf8 = require("moongraph.text").to_utf8

local _M = {}

local ok_cjson, cjson = pcall(require, "cjson")
_M.null = ok_cjson and cjson.null or setmetatable({}, { __name = "json.null",
  __tostring = function() return "null" end })
local null = _M.null

--[[ wire([opts]) -> a codec for wire protocols: lua-cjson's encode and
decode (nil, err on failure; null is cjson.null), an instance of its own
when opts are given: opts.raise = true raises instead, opts.invalid_numbers
= true writes NaN and infinities rather than refusing them (logs). ]]
local wire_default
function _M.wire(opts)
  if opts == nil then
    wire_default = wire_default or require("cjson.safe").new()
    return wire_default
  end
  local c = opts.raise and require("cjson").new() or require("cjson.safe").new()
  if opts.invalid_numbers then c.encode_invalid_numbers(true) end
  return c
end

-- An array, even when empty ([] rather than {}).
local array_mt = { __name = "json.array" }
function _M.array(t)
  return setmetatable(t or {}, array_mt)
end
function _M.is_array(t)
  return getmetatable(t) == array_mt
end

local escapes = {
  ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
}
local function escape_char(c)
  return escapes[c] or string_format("\\u%04x", string_byte(c))
end

local function encode_string(s)
  if not string_find(s, '[%c"\\]') then return '"' .. s .. '"' end
  return '"' .. string_gsub(s, '[%c"\\]', escape_char) .. '"'
end

-- object keys repeat from one checkpoint to the next: keep their encoding
-- (a bounded cache: maps keyed by ids would otherwise grow it forever)
local key_cache, key_count = {}, 0
local function encode_key(k, st)
  if st.valid_utf8 and not utf8_len(k) then return encode_string(to_utf8(k)) end
  local e = key_cache[k]
  if not e then
    e = encode_string(k)
    if key_count >= 2048 then key_cache, key_count = {}, 0 end
    key_cache[k] = e
    key_count = key_count + 1
  end
  return e
end

-- (a whole number up to 2^63 is written in digits, not with an exponent:
-- PostgreSQL's jsonb reads 1e+15 as an integer and gives it back so)
local function encode_float(v)
  if v ~= v or v == huge or v == -huge then return nil end
  local s = string_format("%.14g", v)
  if tonumber(s) ~= v then
    s = string_format("%.17g", v)
  end
  if string_find(s, "e", 1, true) and v == math_floor(v) and math_abs(v) <= 0x1p63 then
    s = string_format("%.0f", v)
  end
  if not string_find(s, "[%.eEn]") then s = s .. ".0" end
  return s
end

-- The keys from the root to the value being encoded live on a stack, so
-- that the path is only spelled out when something cannot be encoded.
local function fail(st, msg)
  local path = st.name
  for i = 1, st.depth do
    local k = st.keys[i]
    if type(k) == "number" then
      path = path .. "[" .. k .. "]"
    elseif string_find(k, "^[%a_][%w_]*$") then
      path = path .. "." .. k
    else
      path = path .. "[" .. string_format("%q", k) .. "]"
    end
  end
  error({ path = path, msg = msg })
end

local encode_value

local function encode_table(t, buf, n, st)
  local seen = st.seen
  if seen[t] then fail(st, "is a table that contains itself") end
  local len = #t
  local count = 0
  local strkeys = nil
  for k in pairs(t) do
    count = count + 1
    local kt = type(k)
    if kt == "string" then
      if strkeys then strkeys[#strkeys + 1] = k else strkeys = { k } end
    elseif kt == "number" and math_type(k) == "integer" and k >= 1 and k <= len then
      -- list key
    else
      fail(st, "has a key of type " .. kt ..
        (kt == "number" and (" (" .. tostring(k) .. ")") or "") ..
        "; only string keys or a list 1..n can be saved")
    end
  end
  seen[t] = true
  local depth = st.depth + 1
  st.depth = depth
  local keys = st.keys
  local indent = st.indent
  local nl, pad, pad_in
  if indent then
    pad = string.rep("  ", depth - 1)
    nl = "\n"
    pad_in = pad .. "  "
  end
  if strkeys then
    if count ~= #strkeys then
      st.depth = depth - 1
      fail(st, "mixes list items and string keys")
    end
    if strkeys[2] then table_sort(strkeys) end
    n = n + 1; buf[n] = "{"
    for i = 1, #strkeys do
      local k = strkeys[i]
      if i > 1 then n = n + 1; buf[n] = "," end
      if indent then n = n + 1; buf[n] = nl .. pad_in end
      n = n + 1; buf[n] = encode_key(k, st)
      n = n + 1; buf[n] = indent and ": " or ":"
      keys[depth] = k
      n = encode_value(t[k], buf, n, st)
    end
    if indent then n = n + 1; buf[n] = nl .. pad end
    n = n + 1; buf[n] = "}"
  elseif count == 0 then
    n = n + 1; buf[n] = getmetatable(t) == array_mt and "[]" or "{}"
  else
    if count ~= len then
      st.depth = depth - 1
      fail(st, "is a list with holes")
    end
    n = n + 1; buf[n] = "["
    for i = 1, len do
      if i > 1 then n = n + 1; buf[n] = "," end
      if indent then n = n + 1; buf[n] = nl .. pad_in end
      keys[depth] = i
      n = encode_value(t[i], buf, n, st)
    end
    if indent then n = n + 1; buf[n] = nl .. pad end
    n = n + 1; buf[n] = "]"
  end
  st.depth = depth - 1
  seen[t] = nil
  return n
end

encode_value = function(v, buf, n, st)
  local tv = type(v)
  if tv == "string" then
    if st.valid_utf8 and not utf8_len(v) then v = to_utf8(v) end
    n = n + 1; buf[n] = encode_string(v)
  elseif tv == "number" then
    local s
    if math_type(v) == "integer" then s = tostring(v) else s = encode_float(v) end
    if not s then fail(st, "is " .. tostring(v) .. ", which JSON cannot hold") end
    n = n + 1; buf[n] = s
  elseif tv == "boolean" then
    n = n + 1; buf[n] = v and "true" or "false"
  elseif tv == "table" then
    if rawequal(v, null) then
      n = n + 1; buf[n] = "null"
    else
      n = encode_table(v, buf, n, st)
    end
  elseif rawequal(v, null) then
    n = n + 1; buf[n] = "null"
  else
    fail(st, "is a " .. tv .. ", which cannot be saved")
  end
  return n
end

local ok_core, core = pcall(require, "moongraph.core")
local c_encode = ok_core and type(core) == "table" and core.json and core.json.encode or nil

--[[ lua_encode(value [, opts]): the encoder in Lua (the reference the C
one is checked against); encode uses it for what C leaves. ]]
function _M.lua_encode(v, opts)
  local buf = {}
  local st = { name = opts and opts.name or "value", indent = opts and opts.indent,
    valid_utf8 = opts and opts.valid_utf8, depth = 0, keys = {}, seen = {} }
  local ok, err = pcall(encode_value, v, buf, 0, st)
  if not ok then
    if type(err) == "table" and err.path then
      return nil, err.path .. " " .. err.msg
    end
    error(err, 0)
  end
  return table_concat(buf)
end

-- Decoder: recursive descent over the string.

local decode_value

local function decode_error(s, pos, msg)
  error({ msg = msg .. " at byte " .. pos }, 0)
end

local function skip_ws(s, pos)
  local _, e = string_find(s, "^[ \t\r\n]*", pos)
  return e + 1
end

local function decode_string(s, pos)
  -- pos is at the opening quote
  local buf, n = {}, 0
  local i = pos + 1
  while true do
    local a, b = string_find(s, '^[^"\\\0-\31]+', i)
    if a then
      n = n + 1; buf[n] = string_sub(s, a, b)
      i = b + 1
    end
    local c = string_byte(s, i)
    if c == 34 then -- "
      return table_concat(buf), i + 1
    elseif c == 92 then -- \
      local e = string_sub(s, i + 1, i + 1)
      local simple = ({ ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b",
        f = "\f", n = "\n", r = "\r", t = "\t" })[e]
      if simple then
        n = n + 1; buf[n] = simple
        i = i + 2
      elseif e == "u" then
        local hex = string_sub(s, i + 2, i + 5)
        local cp = tonumber(hex, 16)
        if not cp or #hex ~= 4 then decode_error(s, i, "bad \\u escape") end
        i = i + 6
        if cp >= 0xD800 and cp <= 0xDBFF and string_sub(s, i, i + 1) == "\\u" then
          local lo = tonumber(string_sub(s, i + 2, i + 5), 16)
          if lo and lo >= 0xDC00 and lo <= 0xDFFF then
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
            i = i + 6
          end
        end
        n = n + 1; buf[n] = utf8_char(cp)
      else
        decode_error(s, i, "bad escape")
      end
    elseif c == nil then
      decode_error(s, pos, "unterminated string")
    else
      decode_error(s, i, "control character in string")
    end
  end
end

local function decode_number(s, pos)
  local a, b = string_find(s, "^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
  if not a then decode_error(s, pos, "unexpected character") end
  local text = string_sub(s, a, b)
  local v
  if string_find(text, "[%.eE]") then
    v = tonumber(text)
    if v then v = v + 0.0 end
  else
    v = math_tointeger(tonumber(text)) or tonumber(text)
  end
  if v == nil then decode_error(s, pos, "bad number") end
  return v, b + 1
end

decode_value = function(s, pos, depth)
  pos = skip_ws(s, pos)
  local c = string_byte(s, pos)
  if c == 123 then -- {
    if depth > 200 then decode_error(s, pos, "nesting too deep") end
    local t = {}
    pos = skip_ws(s, pos + 1)
    if string_byte(s, pos) == 125 then return t, pos + 1 end
    while true do
      if string_byte(s, pos) ~= 34 then decode_error(s, pos, "object key expected") end
      local k
      k, pos = decode_string(s, pos)
      pos = skip_ws(s, pos)
      if string_byte(s, pos) ~= 58 then decode_error(s, pos, "':' expected") end
      local v
      v, pos = decode_value(s, pos + 1, depth + 1)
      t[k] = v
      pos = skip_ws(s, pos)
      c = string_byte(s, pos)
      if c == 44 then
        pos = skip_ws(s, pos + 1)
      elseif c == 125 then
        return t, pos + 1
      else
        decode_error(s, pos, "',' or '}' expected")
      end
    end
  elseif c == 91 then -- [
    if depth > 200 then decode_error(s, pos, "nesting too deep") end
    local t, n = {}, 0
    pos = skip_ws(s, pos + 1)
    if string_byte(s, pos) == 93 then return setmetatable(t, array_mt), pos + 1 end
    while true do
      local v
      v, pos = decode_value(s, pos, depth + 1)
      n = n + 1; t[n] = v
      pos = skip_ws(s, pos)
      c = string_byte(s, pos)
      if c == 44 then
        pos = pos + 1
      elseif c == 93 then
        return t, pos + 1
      else
        decode_error(s, pos, "',' or ']' expected")
      end
    end
  elseif c == 34 then
    return decode_string(s, pos)
  elseif c == 116 and string_sub(s, pos, pos + 3) == "true" then
    return true, pos + 4
  elseif c == 102 and string_sub(s, pos, pos + 4) == "false" then
    return false, pos + 5
  elseif c == 110 and string_sub(s, pos, pos + 3) == "null" then
    return null, pos + 4
  elseif c == nil then
    decode_error(s, pos, "unexpected end of input")
  else
    return decode_number(s, pos)
  end
end

--[[ encode(value [, opts]) -> string | nil, err
opts.indent = true writes two-space indented JSON; opts.name names the root
in error messages (default "value"); opts.valid_utf8 = true replaces invalid
UTF-8 in strings and keys with U+FFFD. ]]
local lua_encode = _M.lua_encode
function _M.encode(v, opts)
  if c_encode and not (opts and opts.valid_utf8) then
    local s = c_encode(v, null, array_mt, opts and opts.indent or false)
    if s then return s end
  end
  return lua_encode(v, opts)
end

--[[ encode_output(value) -> string: JSON a person or another program reads
(valid UTF-8); raises when the value cannot be written as JSON. ]]
local OUTPUT = { valid_utf8 = true }
function _M.encode_output(v)
  local s, err = _M.encode(v, OUTPUT)
  if not s then error("json: " .. err, 2) end
  return s
end

--[[ decode(string) -> value | nil, err ]]
local c_decode = ok_core and type(core) == "table" and core.json and core.json.decode or nil
function _M.decode(s)
  if type(s) ~= "string" then
    error("bad argument #1 to 'decode': string expected, got " .. type(s), 2)
  end
  if c_decode then return c_decode(s, null, array_mt) end
  return _M.lua_decode(s)
end

--[[ lua_decode(string): decode in Lua, what the C decoder is held to ]]
function _M.lua_decode(s)
  local ok, v, pos = pcall(decode_value, s, 1, 0)
  if not ok then
    if type(v) == "table" then return nil, "invalid JSON: " .. v.msg end
    error(v, 0)
  end
  pos = skip_ws(s, pos)
  if pos <= #s then return nil, "invalid JSON: trailing data at byte " .. pos end
  return v
end

--[[ copy(value [, prev]) -> a deep copy made through the codec (what a saver
hands back), or nil, err when the value cannot be saved: the value
decode(encode(value)) gives, made in C without the text when the C encoder
takes the value. prev, an earlier copy of a value at the same place: in C,
every part of the copy equal to prev's part there is that part of prev
itself, so unchanged parts keep their identity (they are shared: nobody
may change them). ]]
local c_copy = ok_core and type(core) == "table" and core.json and core.json.copy or nil
function _M.copy(v, prev)
  if c_copy then
    local ok, c = c_copy(v, null, array_mt, prev)
    if ok then return c end
  end
  local s, err = _M.encode(v)
  if not s then return nil, err end
  return _M.decode(s)
end

--[[ copy_state(values, prev, src [, written]) -> copy | nil
The copy of a run's state table (string keys) that copy(values, prev)
would make, without walking a key whose value is the very one src (the
state's values when prev was made) holds for it, that `written` (the keys a
write reached since) does not hold and that prev has: that key takes
prev's part as it is. src gets the value of every key copied; written is
emptied. The copy is always a new table. nil: a value that the C copy does
not take (src may then be part updated; copy(values) says whether it can
be saved). For callers that know their values change only by writes they
mark. ]]
local c_copy_state = ok_core and type(core) == "table" and core.json and core.json.copy_state or nil
function _M.copy_state(values, prev, src, written)
  if c_copy_state then
    local ok, c = c_copy_state(values, null, array_mt, prev, src, written)
    if ok then return c end
    return nil
  end
  local out = {}
  for k, v in pairs(values) do
    if type(k) ~= "string" then return nil end
    local p = prev and prev[k]
    if p == nil or not rawequal(src[k], v) or (written and written[k]) then
      p = _M.copy(v, p)
      if p == nil then return nil end
      src[k] = v
    end
    out[k] = p
  end
  if written then
    for k in pairs(written) do written[k] = nil end
  end
  return out
end

--[[ pack(value [, value...]) -> packed | nil, err, and unpack(packed) ->
the values: values kept aside in a form of their own. unpack gives, each
time, new tables equal to what copy(value) gives; nothing done to a value
after pack shows. The form is one string (moongraph.core.pack) when the
core module is there: a store of many values then holds strings, which the
collector does not walk. ]]
local core_pack = ok_core and type(core) == "table" and core.pack or nil
if core_pack then
  local c_pack, c_unpack = core_pack.pack, core_pack.unpack
  -- what C does not take: through the codec (or its error)
  local function pack_copies(...)
    local n = select("#", ...)
    local copies = { ... }
    for i = 1, n do
      local c, err = _M.copy(copies[i])
      if c == nil then return nil, err end
      copies[i] = c
    end
    return c_pack(null, array_mt, table.unpack(copies, 1, n)) or
      error("json.pack: the codec's copy cannot be packed", 2)
  end
  _M.pack = core_pack.packer(null, array_mt, pack_copies)
  function _M.unpack(s)
    return c_unpack(s, null, array_mt)
  end
else
  -- without the core module: a list of copies
  function _M.pack(...)
    local n = select("#", ...)
    local copies = { n = n, ... }
    for i = 1, n do
      local c, err = _M.copy(copies[i])
      if c == nil then return nil, err end
      copies[i] = c
    end
    return copies
  end
  function _M.unpack(p)
    local out = {}
    for i = 1, p.n do out[i] = _M.copy(p[i]) end
    return table.unpack(out, 1, p.n)
  end
end

return _M
