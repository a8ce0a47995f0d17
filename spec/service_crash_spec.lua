-- A process with runs in flight is killed (SIGKILL): when a service with
-- the in-process executor starts again over the same storage, each run it
-- left pending or running is marked failed with the reason (its record and
-- its event log), its thread is free, and a new run continues the thread
-- from its last checkpoint. Over local files and over PostgreSQL.
local mg = require "moongraph"
local ids = require "moongraph.ids"
local process = require "moongraph.process"
local service = require "moongraph.service"
local tasks = require "moongraph.service.tasks"
local files = require "moongraph.service.files"
local postgres = require "moongraph.service.postgres"
local wenv = require "worker_env"
local tmp = require "tmp"
local flows = require "langgraph_flows"

local SCRIPTS = { { name = "agent", path = "spec/fixtures/lgapi_agent.lua" } }

-- runs the fixture with args until it prints its ids, then kills it
local function crash(args)
  local argv = { wenv.BIN, "run", "spec/fixtures/service_crash.lua" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local p = assert(process.spawn(argv, { timeout = 60 }))
  local line = p.stdout:read_line(60)
  assert(line, "the fixture printed nothing: " .. tostring(p.stderr:read_all(5)))
  p:kill("KILL")
  p:wait()
  local thread, running, queued = line:match("^(%S+) (%S+) (%S+)$")
  assert(thread, "unexpected output: " .. line)
  return thread, running, queued
end

local function check(svc, thread, running, queued)
  for _, id in ipairs { running, queued } do
    local run = assert(svc:run("u", thread, id))
    assert.equal("error", run.status)
    local evs = flows.drain(run)
    assert.same({ "metadata", "error" }, flows.event_names(evs))
    assert.equal(tasks.LOST, evs[2].data.message)
    assert.equal(tasks.LOST, svc:run_output(run).__error__.message)
  end
  local th = assert(svc:thread_get("u", thread))
  assert.are_not.equal("busy", th.status)
  -- the first run's input was checkpointed before it was killed: the
  -- thread's next run goes on from there
  local run = assert(svc:run_create("u", thread, { assistant_id = "agent",
    input = { messages = { { role = "user", content = "again" } }, hold = 0 } }))
  local out = svc:run_output(run)
  assert.is_nil(out.__error__)
  local contents = {}
  for i, m in ipairs(out.messages) do contents[i] = m.content end
  assert.same({ "first", "again", "echo: again" }, contents)
end

describe("a service killed with runs in flight", function()
  it("over local files: the runs it left are marked failed with the reason when it starts again", function()
    local dir = tmp.dir("crash")
    mg.run(function()
      local thread, running, queued = crash { "files", dir }
      local svc = assert(service.new { storage = assert(files.open(dir)), executor = tasks.new(), scripts = SCRIPTS })
      check(svc, thread, running, queued)
      svc:close()
    end)
  end)

  it("a data directory of an earlier version (no runs/, a thread left busy) opens with the thread idle", function()
    local dir = tmp.dir("old")
    assert(os.execute("mkdir -p " .. dir .. "/threads"))
    local f = assert(io.open(dir .. "/threads/t-old.json", "w"))
    f:write('{"thread_id":"t-old","owner":"u","created_at":1,"updated_at":1,"metadata":{},"status":"busy"}')
    f:close()
    mg.run(function()
      local svc = assert(service.new { storage = assert(files.open(dir)), executor = tasks.new(), scripts = SCRIPTS })
      assert.equal("idle", assert(svc:thread_get("u", "t-old")).status)
      local run = assert(svc:run_create("u", "t-old", { assistant_id = "agent",
        input = { messages = { { role = "user", content = "hi" } } } }))
      assert.equal("echo: hi", svc:run_output(run).messages[2].content)
      svc:close()
    end)
  end)

  describe("over PostgreSQL", function()
    local env
    setup(function() env = wenv.new() end)
    teardown(function() if env then env:destroy() end end)

    it("the runs of the executor that starts again are marked failed; another executor's stay", function()
      mg.run(function()
        local id = "tasks-" .. ids.unique()
        local thread, running, queued = crash { "postgres", env.pg_url, env.redis_url, env.checkpoint, id }
        local function open(exid)
          return assert(service.new { storage = assert(postgres.open { pg = env.pg_url, redis = env.redis_url,
            checkpoint = env.checkpoint }), executor = tasks.new { id = exid }, scripts = SCRIPTS })
        end
        local other = open("tasks-someone-else")
        assert.equal("running", assert(other:run("u", thread, running)).status)
        other:close()
        local svc = open(id)
        check(svc, thread, running, queued)
        svc:close()
      end)
    end)
  end)
end)
