-- moongraph.worker.log — structured logs: one JSON object per line.
--
--   local log = require("moongraph.worker.log").new{ level = "info", out = io.stderr,
--                                                   fields = { worker = "w1" } }
--   log:info("job done", { job_id = id, duration_ms = 12.5 })
--   --> {"ts":"2026-01-02T03:04:05.678Z","level":"info","msg":"job done","worker":"w1",...}
--
-- Every line carries ts (UTC, milliseconds), level and msg, then the
-- logger's own fields, then the call's fields. Lines below the level are
-- dropped before anything is encoded.

local cjson = require("cjson").new()
cjson.encode_invalid_numbers(true)

local type, pairs, ipairs, tostring, setmetatable, floor, pcall =
  type, pairs, ipairs, tostring, setmetatable, math.floor, pcall
local os_time, os_date, format = os.time, os.date, string.format

local _M = {}
local Log = {}
Log.__index = Log

local RANK = { debug = 1, info = 2, warn = 3, error = 4 }

-- Wall clock with milliseconds: os.time() anchored to the monotonic clock,
-- so successive lines keep their order and spacing.
local now_mono = require("moongraph.core").loop.now
local base_wall = os_time()
local base_mono = now_mono()

function _M.wall()
  return base_wall + (now_mono() - base_mono)
end

function _M.iso(t)
  t = t or _M.wall()
  local s = floor(t)
  return os_date("!%Y-%m-%dT%H:%M:%S", s) .. format(".%03dZ", floor((t - s) * 1000))
end

function _M.new(opts)
  opts = opts or {}
  return setmetatable({
    rank = RANK[opts.level or "info"] or 2,
    out = opts.out or io.stderr,
    fields = opts.fields or {},
  }, Log)
end

function Log:enabled(level)
  return (RANK[level] or 2) >= self.rank
end

local HEAD = { ts = true, level = true, msg = true }

-- One line: ts, level, msg first, then the other fields by name.
local function encode(rec)
  local parts = {}
  for _, k in ipairs { "ts", "level", "msg" } do
    parts[#parts + 1] = cjson.encode(k) .. ":" .. cjson.encode(rec[k])
  end
  local keys = {}
  for k in pairs(rec) do
    if not HEAD[k] then keys[#keys + 1] = tostring(k) end
  end
  table.sort(keys)
  for _, k in ipairs(keys) do
    parts[#parts + 1] = cjson.encode(k) .. ":" .. cjson.encode(rec[k])
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

function Log:log(level, msg, fields)
  if (RANK[level] or 2) < self.rank then return end
  local rec = { ts = _M.iso(), level = level, msg = msg }
  for k, v in pairs(self.fields) do rec[k] = v end
  if fields then
    for k, v in pairs(fields) do
      local tv = type(v)
      if tv == "function" or tv == "userdata" or tv == "thread" then v = tostring(v) end
      rec[k] = v
    end
  end
  local ok, line = pcall(encode, rec)
  if not ok then line = encode { ts = rec.ts, level = level, msg = msg, log_error = tostring(line) } end
  local out = self.out
  out:write(line, "\n")
  if out.flush then out:flush() end
end

function Log:debug(msg, f) self:log("debug", msg, f) end
function Log:info(msg, f) self:log("info", msg, f) end
function Log:warn(msg, f) self:log("warn", msg, f) end
function Log:error(msg, f) self:log("error", msg, f) end

-- A logger with more fixed fields.
function Log:with(fields)
  local f = {}
  for k, v in pairs(self.fields) do f[k] = v end
  for k, v in pairs(fields) do f[k] = v end
  return setmetatable({ rank = self.rank, out = self.out, fields = f }, Log)
end

return _M
