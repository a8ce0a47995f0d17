--[[
moongraph.api.langgraph_distributed — the LangGraph Agent API's service
across machines (what `moongraph serve --redis --pg` runs):
moongraph.service over PostgreSQL (moongraph.service.postgres) with runs
queued as jobs for `moongraph worker` processes (moongraph.service.jobs).
A serve process keeps no state of its own: any number of them can stand
behind a load balancer.

  local lgdist = require "moongraph.api.langgraph_distributed"
  local svc = assert(lgdist.new{
    redis = "redis://127.0.0.1:6379/0", pg = "postgresql://...",
    prefix = "moongraph",          -- the workers' --prefix
    checkpoint = "cached",         -- the workers' --checkpoint
    scripts = { {name = "agent", path = "..."}, ... },   -- as the workers run them
  })
]]

local service = require "moongraph.service"
local postgres = require "moongraph.service.postgres"
local jobs = require "moongraph.service.jobs"

local type, error = type, error

local _M = {}

_M.KEY_TTL = jobs.KEY_TTL

-- new{redis, pg, prefix, checkpoint, scripts, pool_size} -> service | nil, err
function _M.new(opts)
  if type(opts) ~= "table" then error("bad argument #1 to 'new' (options table expected)", 2) end
  if type(opts.redis) ~= "string" or type(opts.pg) ~= "string" then
    error("bad argument #1 to 'new' (redis and pg URLs expected)", 2)
  end
  if type(opts.scripts) ~= "table" or not opts.scripts[1] then
    return nil, "no script: give --script [NAME=]PATH as the workers run it"
  end
  local storage, err = postgres.open { pg = opts.pg, redis = opts.redis, checkpoint = opts.checkpoint,
    pool_size = opts.pool_size }
  if not storage then return nil, err end
  local executor
  executor, err = jobs.new { redis = opts.redis, prefix = opts.prefix }
  if not executor then storage:close(); return nil, err end
  local svc
  svc, err = service.new { storage = storage, executor = executor, scripts = opts.scripts }
  if not svc then storage:close(); executor:close(); return nil, err end
  return svc
end

return _M
