-- moongraph.worker.config — the worker's settings: defaults, environment,
-- command-line flags (flags win), and the Redis key names derived from them.
--
--   local config = require "moongraph.worker.config"
--   local cfg, err = config.parse(args [, getenv])   -- err: a usage message
--
-- Every duration is seconds (a float); counts are integers.

local type, tonumber, tostring, ipairs, pairs =
  type, tonumber, tostring, ipairs, pairs
local format = string.format

local cliargs = require "moongraph.args"

local _M = {}

_M.USAGE = [[
usage: moongraph worker --script [NAME=]PATH... [--redis URL] [--pg URL]
                        [--concurrency N] [--group NAME] [--consumer NAME]
                        [--checkpoint cached|postgres|redis|file:DIR|memory]
                        [--durability sync|async|exit]
                        [--claim-idle SEC] [--claim-interval SEC] [--max-deliveries N]
                        [--grace SEC] [--job-timeout SEC] [--heartbeat SEC]
                        [--events-ttl SEC] [--events-maxlen N] [--events-interval SEC]
                        [--metrics PATH|-] [--log-level debug|info|warn|error]
                        [--prefix PREFIX]

Reads jobs from the Redis stream PREFIX:jobs (consumer group `moongraph`),
runs each with the script it names (default the first --script) up to N at
once, stores each result in the Postgres table job_results and streams its
events to PREFIX:events:<job_id>. SIGTERM drains, SIGHUP reloads the
scripts. At least one script is required: --script (repeatable) or
MOONGRAPH_WORKER_SCRIPT (comma-separated). Environment: MOONGRAPH_REDIS_URL,
MOONGRAPH_PG_URL, MOONGRAPH_WORKER_CONCURRENCY, MOONGRAPH_WORKER_GROUP,
MOONGRAPH_WORKER_CONSUMER, MOONGRAPH_WORKER_SCRIPT, MOONGRAPH_CHECKPOINT.
docs/worker.md has the details.
]]

_M.defaults = {
  redis = "redis://127.0.0.1:6379/0",
  pg = nil,                     -- required
  scripts = nil,                -- { {name=, path=}, ... }; required
  concurrency = 16,
  group = "moongraph",
  consumer = nil,               -- default <hostname>-<pid>
  checkpoint = "cached",
  durability = "async",         -- checkpoint writes: async (batched, as LangGraph's default) | sync (each before the run goes on) | exit
  claim_idle = 30,              -- a pending job idle this long is claimed by another worker
  claim_interval = nil,         -- default min(5, claim_idle / 2)
  max_deliveries = 5,           -- a job delivered more often goes to the dead-letter stream
  grace = 25,                   -- SIGTERM drain period
  job_timeout = 600,
  heartbeat = 5,
  events_ttl = 3600,            -- events stream lifetime after `done`
  events_maxlen = 10000,
  events_interval = 0.05,       -- a job's event writes at least this far apart (tokens joined meanwhile)
  metrics = nil,
  log_level = "info",
  prefix = "moongraph",
  block = 2,                    -- XREADGROUP BLOCK, seconds
}

-- The Redis keys of one prefix.
function _M.keys(prefix)
  return {
    jobs = prefix .. ":jobs",
    dead = prefix .. ":jobs:dead",
    events = prefix .. ":events:",        -- .. job_id
    worker = prefix .. ":workers:",       -- .. consumer (heartbeat)
  }
end

-- key_helper(prefix) -> function(...) -> "PREFIX:a:b": the keys a script's
-- hooks keep in Redis, under the worker's prefix.
function _M.key_helper(prefix)
  local concat, select, tostring = table.concat, select, tostring
  return function(...)
    local parts = { prefix }
    for i = 1, select("#", ...) do parts[#parts + 1] = tostring((select(i, ...))) end
    return concat(parts, ":")
  end
end

local function read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("l")
  f:close()
  return s
end

-- hostname([getenv]) -> $HOSTNAME, else the kernel's hostname | nil
function _M.hostname(getenv)
  local host = (getenv or os.getenv)("HOSTNAME")
  if not host or host == "" then host = read_file("/proc/sys/kernel/hostname") end
  return host ~= "" and host or nil
end

-- <hostname>-<pid>: unique among the workers of a cluster (a pod's hostname
-- is its name).
function _M.default_consumer(getenv)
  local host = _M.hostname(getenv) or "worker"
  local stat = read_file("/proc/self/stat")
  local pid = stat and stat:match("^(%d+)") or tostring(math.random(1, 1 << 30))
  return host .. "-" .. pid
end

-- "NAME=PATH" or "PATH" (NAME: the file name without .lua).
function _M.script_spec(s)
  if type(s) ~= "string" or s == "" then return nil, "--script needs a value" end
  local name, path = s:match("^([%w_%-%.]+)=(.+)$")
  if not name then
    path = s
    name = path:match("([^/]+)%.lua$") or path:match("([^/]+)$")
  end
  if not path:match("%.lua$") then
    return nil, "--script " .. s .. ": a Lua file (PATH.lua) expected"
  end
  return { name = name, path = path }
end

local numeric = {
  ["--concurrency"] = { "concurrency", "int", 1 },
  ["--claim-idle"] = { "claim_idle", "num", 0.1 },
  ["--claim-interval"] = { "claim_interval", "num", 0.05 },
  ["--max-deliveries"] = { "max_deliveries", "int", 1 },
  ["--grace"] = { "grace", "num", 0 },
  ["--job-timeout"] = { "job_timeout", "num", 0.1 },
  ["--heartbeat"] = { "heartbeat", "num", 0.1 },
  ["--events-ttl"] = { "events_ttl", "int", 1 },
  ["--events-maxlen"] = { "events_maxlen", "int", 10 },
  ["--events-interval"] = { "events_interval", "num", 0 },
  ["--block"] = { "block", "num", 0.01 },
}

local strings = {
  ["--redis"] = "redis", ["--pg"] = "pg", ["--group"] = "group",
  ["--consumer"] = "consumer", ["--checkpoint"] = "checkpoint", ["--durability"] = "durability",
  ["--metrics"] = "metrics", ["--log-level"] = "log_level", ["--prefix"] = "prefix",
}

-- the flags as moongraph.args reads them (values checked by set_number)
local ARGS = { name = "worker", options = { script = "list" } }
for flag in pairs(numeric) do ARGS.options[flag:sub(3)] = "string" end
for flag in pairs(strings) do ARGS.options[flag:sub(3)] = "string" end

local function set_number(cfg, flag, v)
  local spec = numeric[flag]
  local n = tonumber(v)
  if not n then return nil, format("%s: number expected, got '%s'", flag, tostring(v)) end
  if spec[2] == "int" then
    if n ~= math.floor(n) then return nil, format("%s: whole number expected, got '%s'", flag, v) end
    n = math.tointeger(n)
  end
  if n < spec[3] then return nil, format("%s: must be at least %s", flag, tostring(spec[3])) end
  cfg[spec[1]] = n
  return true
end

local LEVELS = { debug = true, info = true, warn = true, error = true }

-- parse(args [, getenv]) -> cfg | nil, message. cfg.help is set for -h.
function _M.parse(args, getenv)
  getenv = getenv or os.getenv
  local cfg = {}
  for k, v in pairs(_M.defaults) do cfg[k] = v end
  local env = function(name)
    local v = getenv(name)
    if v == "" then return nil end
    return v
  end
  cfg.redis = env("MOONGRAPH_REDIS_URL") or cfg.redis
  cfg.pg = env("MOONGRAPH_PG_URL") or cfg.pg
  cfg.group = env("MOONGRAPH_WORKER_GROUP") or cfg.group
  cfg.consumer = env("MOONGRAPH_WORKER_CONSUMER") or cfg.consumer
  cfg.checkpoint = env("MOONGRAPH_CHECKPOINT") or cfg.checkpoint
  local ok, err
  if env("MOONGRAPH_WORKER_CONCURRENCY") then
    ok, err = set_number(cfg, "--concurrency", env("MOONGRAPH_WORKER_CONCURRENCY"))
    if not ok then return nil, "MOONGRAPH_WORKER_CONCURRENCY: " .. err end
  end
  local scripts = {}
  if env("MOONGRAPH_WORKER_SCRIPT") then
    for s in env("MOONGRAPH_WORKER_SCRIPT"):gmatch("[^,%s]+") do
      local spec, serr = _M.script_spec(s)
      if not spec then return nil, "MOONGRAPH_WORKER_SCRIPT: " .. serr end
      scripts[#scripts + 1] = spec
    end
  end
  local o, perr = cliargs.parse(ARGS, args)
  if not o then return nil, perr end
  cfg.help = o.help
  for flag, spec in pairs(numeric) do
    local v = o[spec[1]]
    if v ~= nil then
      ok, err = set_number(cfg, flag, v)
      if not ok then return nil, err end
    end
  end
  for _, key in pairs(strings) do
    if o[key] ~= nil then cfg[key] = o[key] end
  end
  local flag_scripts = {}
  for _, s in ipairs(o.script or {}) do
    local spec, serr = _M.script_spec(s)
    if not spec then return nil, serr end
    flag_scripts[#flag_scripts + 1] = spec
  end
  if #flag_scripts > 0 then scripts = flag_scripts end
  if #scripts == 0 and not cfg.help then
    return nil, "no script to run: give --script [NAME=]PATH (repeatable) or set MOONGRAPH_WORKER_SCRIPT"
  end
  local seen = {}
  for _, s in ipairs(scripts) do
    if seen[s.name] then return nil, "two scripts named '" .. s.name .. "' (use NAME=PATH)" end
    seen[s.name] = true
  end
  cfg.scripts = scripts
  local ck = cfg.checkpoint
  if not (ck == "cached" or ck == "postgres" or ck == "redis" or ck == "memory" or ck:match("^file:.")) then
    return nil, "--checkpoint must be cached, postgres, redis, file:DIR or memory"
  end
  if cfg.durability ~= "sync" and cfg.durability ~= "async" and cfg.durability ~= "exit" then
    return nil, "--durability must be sync, async or exit"
  end
  if not LEVELS[cfg.log_level] then
    return nil, "--log-level must be debug, info, warn or error"
  end
  if not cfg.prefix:match("^[%w_%-%.:]+$") then
    return nil, "--prefix takes letters, digits and _ - . : only"
  end
  if not cfg.group:match("^[%w_%-%.:]+$") then
    return nil, "--group takes letters, digits and _ - . : only"
  end
  cfg.consumer = cfg.consumer or _M.default_consumer(getenv)
  if not cfg.consumer:match("^[%w_%-%.:@]+$") then
    return nil, "--consumer takes letters, digits and _ - . : @ only"
  end
  if not cfg.help and not cfg.pg then
    return nil, "no Postgres URL: give --pg URL or set MOONGRAPH_PG_URL"
  end
  cfg.claim_interval = cfg.claim_interval or math.min(5, cfg.claim_idle / 2)
  cfg.keys = _M.keys(cfg.prefix)
  return cfg
end

return _M
