-- The worker's pure parts: flags, job decoding, metrics, log lines.
local config = require "moongraph.worker.config"
local job = require "moongraph.worker.job"
local metrics = require "moongraph.worker.metrics"
local logm = require "moongraph.worker.log"
local scripts = require "moongraph.worker.scripts"
local cjson = require "cjson"

local function env(t) return function(k) return t[k] end end

describe("worker config", function()
  it("takes the environment, and flags over it", function()
    local cfg = assert(config.parse({ "--concurrency", "64", "--group", "g2" }, env {
      MOONGRAPH_REDIS_URL = "redis://r:1/0", MOONGRAPH_PG_URL = "postgresql://p/db",
      MOONGRAPH_WORKER_CONCURRENCY = "4", HOSTNAME = "pod-7",
    }))
    assert.equal("redis://r:1/0", cfg.redis)
    assert.equal("postgresql://p/db", cfg.pg)
    assert.equal(64, cfg.concurrency)
    assert.equal("g2", cfg.group)
    assert.matches("^pod%-7%-%d+$", cfg.consumer)
    assert.same({ { name = "chat", path = "scripts/eco/chat.lua" } }, cfg.scripts)
    assert.equal("moongraph:jobs", cfg.keys.jobs)
    assert.equal("moongraph:events:", cfg.keys.events)
  end)

  it("names scripts by file or NAME=PATH, and refuses two of one name", function()
    local cfg = assert(config.parse({ "--pg", "x", "--script", "a/chat.lua", "--script", "b=x/y.lua" }, env {}))
    assert.same({ { name = "chat", path = "a/chat.lua" }, { name = "b", path = "x/y.lua" } }, cfg.scripts)
    local _, err = config.parse({ "--pg", "x", "--script", "a/chat.lua", "--script", "b/chat.lua" }, env {})
    assert.matches("two scripts named 'chat'", err)
  end)

  it("explains bad flags", function()
    local cases = {
      { { "--pg", "x", "--concurrency", "0" }, "%-%-concurrency: must be at least 1" },
      { { "--pg", "x", "--concurrency", "2.5" }, "whole number" },
      { { "--pg", "x", "--grace" }, "%-%-grace needs a value" },
      { { "--pg", "x", "--bogus" }, "unknown option '%-%-bogus'" },
      { { "--pg", "x", "--script", "chat.txt" }, "a Lua file" },
      { { "--pg", "x", "--log-level", "loud" }, "log%-level" },
      { { "--pg", "x", "--checkpoint", "disk" }, "%-%-checkpoint must be" },
      { { "--pg", "x", "--durability", "never" }, "%-%-durability must be" },
      { {}, "no Postgres URL" },
    }
    for _, c in ipairs(cases) do
      local cfg, err = config.parse(c[1], env {})
      assert.is_nil(cfg)
      assert.matches(c[2], err)
    end
  end)
end)

describe("worker jobs", function()
  local good = { job_id = "j-1", thread_id = "t-1", user_id = "u-1", message = "종이 어떻게 버려?" }

  it("decodes a job and keeps optional fields", function()
    local g = {}
    for k, v in pairs(good) do g[k] = v end
    g.user_location = "서울특별시 강남구"
    g.script = "chat"
    local j = assert(job.decode { "job", cjson.encode(g) })
    assert.same(g, j)
  end)

  it("round-trips through encode", function()
    assert.same(good, job.decode { "job", job.encode(good) })
  end)

  it("accepts an integer user id as text", function()
    local j = assert(job.decode { "job", '{"job_id":"a","thread_id":"b","user_id":42,"message":"hi"}' })
    assert.equal("42", j.user_id)
  end)

  it("names what is wrong, and the job id when there is one", function()
    local cases = {
      { {}, "no 'job' field", nil },
      { { "job", "{not json" }, "invalid JSON", nil },
      { { "job", "[1,2]" }, "must be a JSON object", nil },
      { { "job", '{"thread_id":"t","user_id":"u","message":"m"}' }, "'job_id' is missing", nil },
      { { "job", '{"job_id":"j 1","thread_id":"t","user_id":"u","message":"m"}' }, "'job_id' must be", nil },
      { { "job", '{"job_id":"j","user_id":"u","message":"m"}' }, "'thread_id' is missing", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","message":"m"}' }, "'user_id' is missing", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","user_id":"u"}' }, "'message' is missing", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","user_id":"u","message":"  "}' }, "'message' is empty", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","user_id":"u","message":3}' }, "must be a string", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","user_id":"u","message":"m","user_location":1}' },
        "'user_location' must be a string", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","user_id":null,"message":"m"}' }, "'user_id' is missing", "j" },
    }
    for _, c in ipairs(cases) do
      local j, reason, id = job.decode(c[1])
      assert.is_nil(j)
      assert.matches(c[2], reason)
      assert.equal(c[3], id)
    end
  end)

  it("makes distinct ids", function()
    local seen = {}
    for _ = 1, 100 do
      local id = job.new_id("j")
      assert.matches("^j%-%d+%-%x+$", id)
      assert.is_nil(seen[id])
      seen[id] = true
    end
  end)
end)

describe("worker metrics", function()
  it("counts, observes and renders the Prometheus text format", function()
    local m = metrics.new()
    m:inc("jobs_done")
    m:inc("jobs_done")
    m:inc("jobs_reclaimed")
    m:observe("node", "intent", 0.004)
    m:observe("node", "intent", 0.2)
    m:observe("job", "done", 1.5)
    local snap = m:snapshot()
    assert.equal(2, snap.counters.jobs_done)
    assert.equal(2, snap.node_latency.intent.count)
    assert.equal(1, snap.node_latency.intent.buckets["0.005"])
    assert.equal(2, snap.node_latency.intent.buckets["0.25"])
    local text = m:prometheus { worker = "w1" }
    assert.matches('moongraph_worker_jobs_done_total{worker="w1"} 2\n', text, 1, true)
    assert.matches('moongraph_worker_jobs_reclaimed_total{worker="w1"} 1\n', text, 1, true)
    assert.matches('moongraph_worker_node_duration_seconds_bucket{worker="w1",node="intent",le="0.005"} 1\n', text, 1, true)
    assert.matches('moongraph_worker_node_duration_seconds_bucket{worker="w1",node="intent",le="+Inf"} 2\n', text, 1, true)
    assert.matches('moongraph_worker_node_duration_seconds_count{worker="w1",node="intent"} 2\n', text, 1, true)
    assert.matches('moongraph_worker_job_duration_seconds_sum{worker="w1",outcome="done"} 1.500000\n', text, 1, true)
    assert.matches("# TYPE moongraph_worker_node_duration_seconds histogram", text, 1, true)
  end)
end)

describe("worker logs", function()
  it("writes one JSON object per line, ts, level and msg first", function()
    local lines = {}
    local out = { write = function(_, ...) lines[#lines + 1] = table.concat({ ... }) end }
    local log = logm.new { level = "info", out = out, fields = { worker = "w1" } }
    log:debug("hidden")
    log:with({ job_id = "j-1" }):info("node finished", { node = "intent", duration_ms = 1.5 })
    assert.equal(1, #lines)
    local line = lines[1]:gsub("\n$", "")
    assert.matches('^{"ts":"%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ","level":"info","msg":"node finished",', line)
    local v = cjson.decode(line)
    assert.same({ "info", "node finished", "w1", "j-1", "intent", 1.5 },
      { v.level, v.msg, v.worker, v.job_id, v.node, v.duration_ms })
  end)
end)

describe("worker scripts", function()
  it("maps relative paths to module names", function()
    assert.equal("scripts.eco.chat", scripts.module_name("scripts/eco/chat.lua"))
    assert.equal("scripts.eco.chat", scripts.module_name("./scripts/eco/chat.lua"))
    assert.is_nil(scripts.module_name("/abs/x.lua"))
  end)
end)
