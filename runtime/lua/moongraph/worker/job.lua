-- moongraph.worker.job — what a job is, on the stream and in Lua.
--
-- A job is an entry of the jobs stream whose field `job` holds a JSON object:
--
--   { "job_id": "j-1", "thread_id": "t-1", "user_id": "u-1",
--     "message": "종이 어떻게 버려?", "user_location": "서울특별시 강남구",
--     "script": "chat" }
--
-- job_id, thread_id, user_id and message are required; user_location and
-- script (the name of one of the worker's scripts; default its first) are
-- optional. Ids are 1..200 characters of letters, digits and - _ . : @;
-- user_id may also be an integer.
--
--   local job = require "moongraph.worker.job"
--   local j, reason, job_id = job.decode(fields)   -- fields: the entry's flat list
--   job.encode(j) -> JSON text

local cjson = require("cjson.safe").new()

local type, tostring, pairs = type, tostring, pairs
local format = string.format

local _M = {}

_M.MAX_MESSAGE = 64 * 1024

local ID = "^[%w%-_%.:@]+$"

local function check_id(j, name)
  local v = j[name]
  if v == nil or v == cjson.null then return nil, format("field '%s' is missing", name) end
  if name == "user_id" and type(v) == "number" and math.tointeger(v) then
    j[name] = tostring(math.tointeger(v))
    return true
  end
  if type(v) ~= "string" then
    return nil, format("field '%s' must be a string, got %s", name, type(v) == "userdata" and "null" or type(v))
  end
  if v == "" or #v > 200 or not v:match(ID) then
    return nil, format("field '%s' must be 1..200 letters, digits or - _ . : @", name)
  end
  return true
end

-- The value of `name` in a stream entry's flat field list.
function _M.field(fields, name)
  if type(fields) ~= "table" then return nil end
  for i = 1, #fields - 1, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

-- decode(fields) -> job | nil, reason, job_id_or_nil
-- job_id is returned with a failure when the JSON had a usable one, so the
-- caller can still tell that job's listeners why it was refused.
function _M.decode(fields)
  local raw = _M.field(fields, "job")
  if raw == nil then return nil, "the entry has no 'job' field" end
  if type(raw) ~= "string" then return nil, "the 'job' field is not text" end
  local j, derr = cjson.decode(raw)
  if j == nil then return nil, "invalid JSON in 'job': " .. tostring(derr) end
  if type(j) ~= "table" or j[1] ~= nil then return nil, "'job' must be a JSON object" end
  local job_id = nil
  if type(j.job_id) == "string" and j.job_id ~= "" and #j.job_id <= 200 and j.job_id:match(ID) then
    job_id = j.job_id
  end
  for _, name in pairs { "job_id", "thread_id", "user_id" } do
    local ok, err = check_id(j, name)
    if not ok then return nil, err, job_id end
  end
  local m = j.message
  if m == nil or m == cjson.null then return nil, "field 'message' is missing", job_id end
  if type(m) ~= "string" then return nil, "field 'message' must be a string", job_id end
  if not m:find("%S") then return nil, "field 'message' is empty", job_id end
  if #m > _M.MAX_MESSAGE then
    return nil, format("field 'message' is longer than %d bytes", _M.MAX_MESSAGE), job_id
  end
  local loc = j.user_location
  if loc == cjson.null then loc = nil end
  if loc ~= nil and type(loc) ~= "string" then
    return nil, "field 'user_location' must be a string", job_id
  end
  local script = j.script
  if script == cjson.null then script = nil end
  if script ~= nil and (type(script) ~= "string" or script == "") then
    return nil, "field 'script' must be a non-empty string", job_id
  end
  return {
    job_id = j.job_id, thread_id = j.thread_id, user_id = j.user_id,
    message = m, user_location = loc ~= "" and loc or nil, script = script,
  }
end

-- encode(job) -> JSON text (the fields decode accepts).
function _M.encode(j)
  return (cjson.encode {
    job_id = j.job_id, thread_id = j.thread_id, user_id = j.user_id,
    message = j.message, user_location = j.user_location, script = j.script,
  })
end

-- A fresh id: 16 random hex digits from /dev/urandom with a time prefix.
function _M.new_id(prefix)
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(8)
  if f then f:close() end
  local hex
  if bytes and #bytes == 8 then
    hex = bytes:gsub(".", function(c) return format("%02x", c:byte()) end)
  else
    hex = format("%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
  end
  return (prefix or "j") .. "-" .. os.date("!%Y%m%d%H%M%S") .. "-" .. hex
end

return _M
