-- moongraph.worker.job — what a job is, on the stream and in Lua.
--
-- A job is an entry of the jobs stream whose field `job` holds a JSON object
-- of at most MAX_BYTES (256 KiB):
--
--   { "job_id": "j-1", "thread_id": "t-1", "user_id": "u-1", "script": "app",
--     "input": { "question": "...", "lang": "ko" } }
--
--   job_id     required; an id (moongraph.ids: 1..200 letters, digits, - _ . : @)
--   thread_id  required; an id: the conversation or session the job belongs to
--   user_id    optional; an id, or an integer (kept as its decimal text)
--   script     optional; the name or path of one of the worker's scripts
--              (default: its first)
--   input      required; a JSON object, the run's input (the script's input
--              hook may build the run's input from it)
--   multitask_strategy
--              optional; what to do when another job of the same thread
--              runs: enqueue (default: wait for it), reject, interrupt or
--              rollback (moongraph.multitask)
--   run        optional; a JSON object: the job is a run of the LangGraph
--              Agent API (`serve --redis --pg`, moongraph.worker.langgraph):
--              its checkpoints stay under thread_id, and input may be
--              absent (null: continue the thread, or run.command resumes it)
--
-- Every string of the input (keys included) must be text PostgreSQL can
-- store: valid UTF-8 without NUL characters (\u0000). A job that breaks
-- this is refused at the door (by `submit` and by the worker, which
-- dead-letters it at its first delivery with that reason) rather than
-- failing to checkpoint on every attempt.
--
-- Other fields are ignored. The worker checks only these generic things;
-- what the input must hold is the script's business (its input hook refuses
-- a job it cannot run).
--
-- The earlier job format, with the message at the top level
-- ({ ..., "message": "...", "user_location": "..." } and no `input`), is
-- still accepted: those two fields become the input, so jobs queued by an
-- older producer still run. A job that has both gives them to the input
-- unless the input already holds a different value (then it is refused).
--
--   local job = require "moongraph.worker.job"
--   local j, reason, job_id = job.decode(fields)   -- fields: the entry's flat list
--   local j, reason, job_id = job.normalize(t)     -- the same checks on a Lua table
--   job.encode(j) -> JSON text

local json = require "moongraph.json"
local ids = require "moongraph.ids"
local multitask = require "moongraph.multitask"

local type, tostring, ipairs, pairs = type, tostring, ipairs, pairs
local format, string_find = string.format, string.find
local math_tointeger, utf8_len = math.tointeger, utf8.len
local sort = table.sort

local _M = {}

_M.MAX_BYTES = 256 * 1024

-- The fields of the earlier format that become the input.
_M.LEGACY_INPUT = { "message", "user_location" }

local function absent(v)
  return v == nil or v == json.null
end

local function kind(v)
  if v == json.null then return "null" end
  return type(v)
end

-- A JSON object decoded by moongraph.json (or a Lua table meant as one): a
-- table that is neither a marked empty array nor a list.
local function is_object(v)
  return type(v) == "table" and not json.is_array(v) and v[1] == nil
end

local function check_id(t, name, optional)
  local v = t[name]
  if absent(v) then
    if optional then return true end
    return nil, format("field '%s' is missing", name)
  end
  if name == "user_id" and type(v) == "number" and math_tointeger(v) then
    return tostring(math_tointeger(v))
  end
  if type(v) ~= "string" then
    return nil, format("field '%s' must be a string, got %s", name, kind(v))
  end
  local ok, err = ids.check(v, "field '" .. name .. "'")
  if not ok then return nil, err end
  return v
end

local function path_of(path, k)
  if type(k) == "number" then return path .. "[" .. k .. "]" end
  if string_find(k, "^[%a_][%w_]*$") then return path .. "." .. k end
  return path .. "[" .. format("%q", k) .. "]"
end

local function bad_text(s)
  local nul = string_find(s, "\0", 1, true)
  if nul then return format("contains a NUL character (\\u0000) at byte %d", nul) end
  local n, at = utf8_len(s)
  if not n then return format("is not valid UTF-8 (at byte %d)", at) end
  return nil
end

-- unstorable(v, path) -> nil | reason: the first string in v (a value
-- decoded from JSON; keys included) that PostgreSQL cannot store as text
-- or jsonb, named by its path, e.g. "input.message contains a NUL
-- character (\u0000) at byte 4". Keys are visited in sorted order, so the
-- reason is the same every time.
function _M.unstorable(v, path, depth)
  depth = depth or 0
  if type(v) == "string" then
    local why = bad_text(v)
    return why and (path .. " " .. why) or nil
  end
  if type(v) ~= "table" or depth > 200 then return nil end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  if #keys > 1 then
    sort(keys, function(a, b)
      local ta, tb = type(a), type(b)
      if ta ~= tb then return ta < tb end
      return a < b
    end)
  end
  for _, k in ipairs(keys) do
    if type(k) == "string" then
      local why = bad_text(k)
      if why then return format("%s has a key that %s", path, why) end
    end
    local r = _M.unstorable(v[k], path_of(path, k), depth + 1)
    if r then return r end
  end
  return nil
end

-- storable_json(text) -> true when JSON text made by moongraph.json holds
-- nothing unstorable would name: valid UTF-8 and no \u0000 escape (how it
-- writes a NUL). False may be a false alarm (a string holding a backslash
-- and "u0000"): unstorable then tells.
function _M.storable_json(text)
  return utf8_len(text) ~= nil and not string_find(text, "\\u0000", 1, true)
end

-- The value of `name` in a stream entry's flat field list.
function _M.field(fields, name)
  if type(fields) ~= "table" then return nil end
  for i = 1, #fields - 1, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end

-- normalize(t) -> job | nil, reason, job_id_or_nil
-- job = { job_id, thread_id, user_id (or nil), script (or nil), input, run (or nil) }
function _M.normalize(t)
  if not is_object(t) then return nil, "a job must be a JSON object" end
  local job_id = ids.valid(t.job_id) and t.job_id or nil
  local j = {}
  for _, name in ipairs { "job_id", "thread_id", "user_id" } do
    local v, err = check_id(t, name, name == "user_id")
    if not v then return nil, err, job_id end
    if v ~= true then j[name] = v end
  end
  local script = t.script
  if not absent(script) then
    if type(script) ~= "string" or script == "" or #script > 1024 then
      return nil, "field 'script' must be a non-empty string (a script's name or path)", job_id
    end
    j.script = script
  end
  local mts = t.multitask_strategy
  if not absent(mts) then
    if not multitask.known(mts) then
      return nil, "field 'multitask_strategy' must be enqueue, reject, interrupt or rollback", job_id
    end
    j.multitask_strategy = mts
  end
  local run = t.run
  if not absent(run) then
    if not is_object(run) then return nil, "field 'run' must be a JSON object", job_id end
    local why = _M.unstorable(run, "run")
    if why then return nil, "field " .. why .. "; text must be UTF-8 without NUL", job_id end
    j.run = run
  end
  local input = t.input
  if absent(input) then
    input = nil
  elseif not is_object(input) then
    return nil, "field 'input' must be a JSON object, got " ..
      (type(input) == "table" and "an array" or kind(input)), job_id
  end
  -- the earlier format: top-level fields that belong to the input
  local copied = false
  for _, name in ipairs(_M.LEGACY_INPUT) do
    local v = t[name]
    if not absent(v) then
      if not copied then
        local c = {}
        for k, x in pairs(input or {}) do c[k] = x end
        input, copied = c, true
      end
      if input[name] == nil then
        input[name] = v
      elseif input[name] ~= v then
        return nil, format("field '%s' is given both at the top level and in 'input', with different values",
          name), job_id
      end
    end
  end
  if input == nil then
    if j.run then return j end
    return nil, "field 'input' is missing (a JSON object)", job_id
  end
  local why = _M.unstorable(input, "input")
  if why then return nil, "field " .. why .. "; text must be UTF-8 without NUL", job_id end
  j.input = input
  return j
end

-- decode(fields) -> job | nil, reason, job_id_or_nil
-- job_id is returned with a failure when the JSON had a usable one, so the
-- caller can still tell that job's listeners why it was refused.
function _M.decode(fields)
  local raw = _M.field(fields, "job")
  if raw == nil then return nil, "the entry has no 'job' field" end
  if type(raw) ~= "string" then return nil, "the 'job' field is not text" end
  if #raw > _M.MAX_BYTES then
    return nil, format("the job is %d bytes, more than the limit of %d", #raw, _M.MAX_BYTES)
  end
  local t, derr = json.decode(raw)
  if t == nil then return nil, "'job' is not JSON: " .. tostring(derr) end
  if not is_object(t) then return nil, "'job' must be a JSON object" end
  return _M.normalize(t)
end

-- encode(job) -> JSON text | nil, err (the fields decode accepts).
function _M.encode(j)
  return json.encode({
    job_id = j.job_id, thread_id = j.thread_id, user_id = j.user_id,
    script = j.script, input = j.input, multitask_strategy = j.multitask_strategy, run = j.run,
  }, { name = "job" })
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
