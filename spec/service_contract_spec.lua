-- The service contract (spec/support/service_contract.lua) over every
-- storage × executor combination: local files with tasks in this process
-- (what `moongraph serve` runs), PostgreSQL with tasks in this process, and
-- PostgreSQL with jobs run by a real `moongraph worker` over Redis (what
-- `serve --redis --pg` runs), against throwaway Redis and PostgreSQL.
local mg = require "moongraph"
local ids = require "moongraph.ids"
local service = require "moongraph.service"
local files = require "moongraph.service.files"
local postgres = require "moongraph.service.postgres"
local tasks = require "moongraph.service.tasks"
local jobs = require "moongraph.service.jobs"
local wenv = require "worker_env"
local tmp = require "tmp"
local contract = require "service_contract"

local SCRIPTS = { { name = "agent", path = "spec/fixtures/lgapi_agent.lua" } }

local function open(storage, executor)
  return assert(service.new { storage = storage, executor = executor, scripts = SCRIPTS })
end

-- a context over storage() and executor() makers: reopen closes the
-- service and makes both again over the same data
local function context(storage, executor)
  local ctx = { user = "u-" .. ids.unique() }
  ctx.svc = open(storage(), executor())
  function ctx.reopen()
    ctx.svc:close()
    ctx.svc = open(storage(), executor())
    return ctx.svc
  end
  function ctx.close() ctx.svc:close() end
  return ctx
end

contract("files × tasks", function()
  local dir = tmp.dir("service")
  return context(function() return assert(files.open(dir)) end, tasks.new)
end, _ENV)

describe("over PostgreSQL", function()
  local env
  setup(function()
    env = wenv.new()
    local w = env:worker { "--script", "agent=spec/fixtures/lgapi_agent.lua", "--concurrency", "8" }
    mg.run(function() w:wait_started() end)
  end)
  teardown(function() if env then env:destroy() end end)

  local function pg_storage()
    return assert(postgres.open { pg = env.pg_url, redis = env.redis_url, checkpoint = env.checkpoint })
  end

  contract("postgres × tasks", function()
    local id = "tasks-" .. ids.unique()
    return context(pg_storage, function() return tasks.new { id = id } end)
  end, _ENV)

  contract("postgres × jobs", function()
    return context(pg_storage, function() return assert(jobs.new { redis = env.redis_url }) end)
  end, _ENV)
end)
