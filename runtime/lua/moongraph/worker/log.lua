-- moongraph.worker.log — structured logs: one JSON object per line.
--
--   local log = require("moongraph.worker.log").new{ level = "info", out = io.stderr,
--                                                   fields = { worker = "w1" } }
--   log:info("job done", { job_id = id, duration_ms = 12.5 })
--   --> {"ts":"2026-01-02T03:04:05.678Z","level":"info","msg":"job done","worker":"w1",...}
--
-- Every line carries ts (UTC, milliseconds), level and msg, then the
-- logger's own fields, then the call's fields (each by name; a call's field
-- that names one of the logger's replaces it). Lines below the level are
-- dropped before anything is encoded.

local json = require "moongraph.json"
local cjson = json.wire { raise = true, invalid_numbers = true }
local json_encode = require("moongraph.json").encode

local type, pairs, ipairs, next, tostring, setmetatable, floor, pcall =
  type, pairs, ipairs, next, tostring, setmetatable, math.floor, pcall
local os_time, os_date, format, concat, sort = os.time, os.date, string.format, table.concat, table.sort

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

-- (the date and time to the second, made once per second)
local last_sec, last_text = nil, nil

function _M.iso(t)
  t = t or _M.wall()
  local s = floor(t)
  if s ~= last_sec then last_sec, last_text = s, os_date("!%Y-%m-%dT%H:%M:%S", s) end
  return last_text .. format(".%03dZ", floor((t - s) * 1000))
end

-- (the logger keeps a copy of its fields, encoded on first use: they do
-- not change after it is made; `with` makes a logger with more)
function _M.new(opts)
  opts = opts or {}
  local f = {}
  for k, v in pairs(opts.fields or {}) do f[k] = v end
  return setmetatable({
    rank = RANK[opts.level or "info"] or 2,
    out = opts.out or io.stderr,
    fields = f, own = nil,
  }, Log)
end

function Log:enabled(level)
  return (RANK[level] or 2) >= self.rank
end

local HEAD = { "ts", "level", "msg" }

-- The general line: ts, level, msg first, then the other fields by name.
-- The fields go through the checkpoint encoder (moongraph.json: keys
-- sorted bytewise) in one call; what it refuses (an infinity, a key that
-- is not a string) through cjson, field by field.
local function encode_fields(rec)
  local keys, named = {}, {}
  for k, v in pairs(rec) do
    local name = tostring(k)
    keys[#keys + 1] = name
    named[name] = v
  end
  sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do
    parts[i] = cjson.encode(k) .. ":" .. cjson.encode(named[k])
  end
  return "{" .. concat(parts, ",") .. "}"
end

-- (a head value the encoder refuses is written as its tostring)
local function head_value(v)
  if v == nil then return "null" end
  return json_encode(v) or cjson.encode(tostring(v))
end

local function encode(head, rest)
  local h = { '{"ts":', head_value(head.ts), ',"level":', head_value(head.level), ',"msg":',
              head_value(head.msg), nil }
  local body = "{}"
  if next(rest) ~= nil then body = json_encode(rest) or encode_fields(rest) end
  h[7] = body == "{}" and "}" or "," .. body:sub(2)
  return concat(h)
end

local function general_line(self, level, msg, fields)
  local rest = {}
  for k, v in pairs(self.fields) do rest[k] = v end
  if fields then
    for k, v in pairs(fields) do
      local tv = type(v)
      if tv == "function" or tv == "userdata" or tv == "thread" then v = tostring(v) end
      rest[k] = v
    end
  end
  -- (a field may give ts, level or msg their value, as it always could)
  local head = { ts = _M.iso(), level = level, msg = msg }
  for _, k in ipairs(HEAD) do
    if rest[k] ~= nil then head[k], rest[k] = rest[k], nil end
  end
  local ok, line = pcall(encode, head, rest)
  if not ok then
    line = encode({ ts = _M.iso(), level = tostring(level), msg = tostring(msg) }, { log_error = tostring(line) })
  end
  return line
end

-- An object's members: its JSON without the braces ("" for none) | nil
-- (not an object the encoder takes).
local function members(t)
  if next(t) == nil then return "" end
  local s = json_encode(t)
  if not s or s:byte(1) ~= 123 then return nil end
  return s:sub(2, -2)
end

-- The logger's own fields as members, encoded once; false when they
-- cannot go as they are (a ts, level or msg among them, a value the
-- encoder refuses): then every line is made the general way.
local function own_members(self)
  local f = self.fields
  local m = false
  if f.ts == nil and f.level == nil and f.msg == nil then m = members(f) or false end
  self.own = m
  return m
end

-- The common line, made without merging the fields: ts, level, msg, the
-- logger's fields, then the call's (each set by name) | nil when a call's
-- field would repeat one of these or is not plain JSON.
local function quick_line(self, level, msg, fields)
  local own = self.own
  if own == nil then own = own_members(self) end
  if not own then return nil end
  local call = ""
  if fields then
    local mine = self.fields
    for k in pairs(fields) do
      if mine[k] ~= nil or k == "ts" or k == "level" or k == "msg" then return nil end
    end
    call = members(fields)
    if not call then return nil end
  end
  local m = head_value(msg)
  local sep1 = own ~= "" and "," or ""
  local sep2 = call ~= "" and "," or ""
  return '{"ts":"' .. _M.iso() .. '","level":"' .. level .. '","msg":' .. m .. sep1 .. own .. sep2 .. call .. "}"
end

function Log:log(level, msg, fields)
  local rank = RANK[level]
  if (rank or 2) < self.rank then return end
  -- (nothing a field holds makes a log call raise: a value the encoders
  -- choke on, too deep or with a __pairs that raises, takes the general
  -- way, which writes the error in the line)
  local ok, line = false, nil
  if rank then ok, line = pcall(quick_line, self, level, msg, fields) end
  if not (ok and line) then line = general_line(self, level, msg, fields) end
  local out = self.out
  out:write(line .. "\n")
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
  return setmetatable({ rank = self.rank, out = self.out, fields = f, own = nil }, Log)
end

return _M
