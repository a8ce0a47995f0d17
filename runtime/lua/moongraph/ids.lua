--[[
moongraph.ids — the rule for ids a caller chooses: thread ids, job ids,
user ids. They become file names (the file saver), Redis keys and stream
names, so they are short and plain: 1 to 200 characters, each a letter, a
digit or one of - _ . : @ (ASCII only).

  ids.check(v [, what]) -> true | nil, "what must be ..."

And ids the runtime makes itself:

  ids.unique() -> "<16 hex digits>-<hex counter>": a random prefix drawn
                  once per process and a counter, so no two processes (and
                  no two calls) give the same
  ids.uuid4() -> a random UUID (version 4), as LangGraph's ids are
]]

local type, format, random, time = type, string.format, math.random, os.time

local _M = {}

_M.MAX = 200
_M.PATTERN = "^[%w%-_%.:@]+$"

function _M.valid(v)
  return type(v) == "string" and v ~= "" and #v <= _M.MAX and v:find(_M.PATTERN) ~= nil
end

function _M.check(v, what)
  if _M.valid(v) then return true end
  return nil, (what or "id") .. " must be 1.." .. _M.MAX .. " letters, digits or - _ . : @"
end

-- (math.random's own seed is only the time in seconds and an address)
local prefix, count = nil, 0
function _M.unique()
  if not prefix then
    local f = io.open("/dev/urandom", "rb")
    local bytes = f and f:read(8)
    if f then f:close() end
    if bytes and #bytes == 8 then
      prefix = bytes:gsub(".", function(c) return format("%02x", c:byte()) end)
    else
      prefix = format("%x%012x", time(), random(0) & 0xffffffffffff)
    end
  end
  count = count + 1
  return format("%s-%x", prefix, count)
end

local urandom
function _M.uuid4()
  if not urandom then urandom = io.open("/dev/urandom", "rb") end
  local b = urandom and urandom:read(16)
  local x = {}
  for i = 1, 16 do x[i] = b and #b == 16 and b:byte(i) or random(0, 255) end
  x[7] = (x[7] & 0x0f) | 0x40
  x[9] = (x[9] & 0x3f) | 0x80
  return format("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", table.unpack(x))
end

return _M
