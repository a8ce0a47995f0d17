-- The worker's pure parts: flags, job decoding, hooks, metrics, log lines.
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
      MOONGRAPH_WORKER_SCRIPT = "app=scripts/app/main.lua, other.lua",
    }))
    assert.equal("redis://r:1/0", cfg.redis)
    assert.equal("postgresql://p/db", cfg.pg)
    assert.equal(64, cfg.concurrency)
    assert.equal("g2", cfg.group)
    assert.matches("^pod%-7%-%d+$", cfg.consumer)
    assert.same({ { name = "app", path = "scripts/app/main.lua" }, { name = "other", path = "other.lua" } },
      cfg.scripts)
    assert.equal("moongraph:jobs", cfg.keys.jobs)
    assert.equal("moongraph:events:", cfg.keys.events)
    assert.equal(0.05, cfg.events_interval)
    assert.equal(0, assert(config.parse({ "--pg", "x", "--script", "a.lua", "--events-interval", "0" }, env {}))
      .events_interval)
  end)

  it("has no default script: without --script or MOONGRAPH_WORKER_SCRIPT it says what to give", function()
    local cfg, err = config.parse({ "--pg", "x" }, env {})
    assert.is_nil(cfg)
    assert.equal("no script to run: give --script [NAME=]PATH (repeatable) or set MOONGRAPH_WORKER_SCRIPT", err)
    -- --help still works without one
    assert.is_true(assert(config.parse({ "--help" }, env {})).help)
  end)

  it("names scripts by file or NAME=PATH, and refuses two of one name", function()
    local cfg = assert(config.parse({ "--pg", "x", "--script", "a/chat.lua", "--script", "b=x/y.lua" }, env {}))
    assert.same({ { name = "chat", path = "a/chat.lua" }, { name = "b", path = "x/y.lua" } }, cfg.scripts)
    local _, err = config.parse({ "--pg", "x", "--script", "a/chat.lua", "--script", "b/chat.lua" }, env {})
    assert.matches("two scripts named 'chat'", err)
  end)

  it("explains bad flags", function()
    local S = "--script"
    local cases = {
      { { S, "a.lua", "--pg", "x", "--concurrency", "0" }, "%-%-concurrency: must be at least 1" },
      { { S, "a.lua", "--pg", "x", "--concurrency", "2.5" }, "whole number" },
      { { S, "a.lua", "--pg", "x", "--grace" }, "%-%-grace needs a value" },
      { { S, "a.lua", "--pg", "x", "--bogus" }, "unknown option %-%-bogus" },
      { { S, "a.lua", "--pg", "x", "--memory-ttl", "5" }, "unknown option %-%-memory%-ttl" },
      { { "--pg", "x", "--script", "chat.txt" }, "a Lua file" },
      { { S, "a.lua", "--pg", "x", "--log-level", "loud" }, "log%-level" },
      { { S, "a.lua", "--pg", "x", "--checkpoint", "disk" }, "%-%-checkpoint must be" },
      { { S, "a.lua", "--pg", "x", "--durability", "never" }, "%-%-durability must be" },
      { { S, "a.lua", "--pg", "x", "--events-interval", "-0.1" }, "%-%-events%-interval: must be at least 0" },
      { { S, "a.lua" }, "no Postgres URL" },
    }
    for _, c in ipairs(cases) do
      local cfg, err = config.parse(c[1], env {})
      assert.is_nil(cfg)
      assert.matches(c[2], err)
    end
  end)

  it("makes the keys of the scripts' hooks under the prefix", function()
    local key = config.key_helper("app1")
    assert.equal("app1:memory:t-1", key("memory", "t-1"))
    assert.equal("app1:n:3", key("n", 3))
  end)
end)

describe("worker jobs", function()
  local good = { job_id = "j-1", thread_id = "t-1", user_id = "u-1", script = "chat",
                 input = { message = "종이 어떻게 버려?", n = 3, tags = { "a" } } }

  it("decodes a job: ids, script and the input object", function()
    local j = assert(job.decode { "job", cjson.encode(good) })
    assert.same(good, j)
    assert.equal("integer", math.type(j.input.n))
  end)

  it("round-trips through encode", function()
    assert.same(good, job.decode { "job", assert(job.encode(good)) })
    local bare = { job_id = "a", thread_id = "b", input = {} }
    local text = assert(job.encode(bare))
    assert.matches('"input":{}', text, 1, true)
    assert.same(bare, job.decode { "job", text })
  end)

  it("takes a job without user_id or script", function()
    local j = assert(job.decode { "job", '{"job_id":"a","thread_id":"b","input":{"x":1}}' })
    assert.is_nil(j.user_id)
    assert.is_nil(j.script)
    assert.same({ x = 1 }, j.input)
  end)

  it("accepts a job in the earlier format: message and user_location become the input", function()
    local j = assert(job.decode { "job", cjson.encode {
      job_id = "j-old", thread_id = "t", user_id = "u", message = "종이 어떻게 버려?",
      user_location = "서울특별시 강남구", script = "chat" } })
    assert.same({ job_id = "j-old", thread_id = "t", user_id = "u", script = "chat",
                  input = { message = "종이 어떻게 버려?", user_location = "서울특별시 강남구" } }, j)
    -- both: the top-level fields fill the input, unless it says otherwise
    j = assert(job.decode { "job", '{"job_id":"a","thread_id":"b","message":"m","input":{"k":"v"}}' })
    assert.same({ k = "v", message = "m" }, j.input)
    local bad, reason = job.decode { "job", '{"job_id":"a","thread_id":"b","message":"m","input":{"message":"n"}}' }
    assert.is_nil(bad)
    assert.matches("'message' is given both at the top level and in 'input'", reason)
  end)

  it("accepts an integer user id as text", function()
    local j = assert(job.decode { "job", '{"job_id":"a","thread_id":"b","user_id":42,"input":{}}' })
    assert.equal("42", j.user_id)
  end)

  it("refuses a job text over the size bound, saying how big it is", function()
    local big = cjson.encode { job_id = "big", thread_id = "t", input = { blob = string.rep("x", job.MAX_BYTES) } }
    local j, reason, id = job.decode { "job", big }
    assert.is_nil(j)
    assert.equal(("the job is %d bytes, more than the limit of %d"):format(#big, 262144), reason)
    assert.is_nil(id)   -- not read at all
    assert.equal(262144, job.MAX_BYTES)
  end)

  it("names what is wrong, and the job id when there is one", function()
    local cases = {
      { {}, "no 'job' field", nil },
      { { "job", "{not json" }, "'job' is not JSON", nil },
      { { "job", "[1,2]" }, "must be a JSON object", nil },
      { { "job", "[]" }, "must be a JSON object", nil },
      { { "job", '{"thread_id":"t","input":{}}' }, "'job_id' is missing", nil },
      { { "job", '{"job_id":"j 1","thread_id":"t","input":{}}' }, "'job_id' must be 1..200 letters", nil },
      { { "job", '{"job_id":"j","input":{}}' }, "'thread_id' is missing", "j" },
      { { "job", '{"job_id":"j","thread_id":"t/1","input":{}}' }, "'thread_id' must be 1..200 letters", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","user_id":"u u","input":{}}' }, "'user_id' must be", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","user_id":true,"input":{}}' }, "'user_id' must be a string", "j" },
      { { "job", '{"job_id":"j","thread_id":"t"}' }, "'input' is missing", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","input":"hi"}' }, "'input' must be a JSON object, got string", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","input":[1]}' }, "'input' must be a JSON object, got an array", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","input":[]}' }, "'input' must be a JSON object, got an array", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","input":null}' }, "'input' is missing", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","input":{},"script":""}' }, "'script' must be", "j" },
      { { "job", '{"job_id":"j","thread_id":"t","input":{},"script":7}' }, "'script' must be", "j" },
    }
    for _, c in ipairs(cases) do
      local j, reason, id = job.decode(c[1])
      assert.is_nil(j, cjson.encode(c[1]))
      assert.matches(c[2], reason)
      assert.equal(c[3], id)
    end
  end)

  it("takes a LangGraph run: the run object, the input optional; refuses a run that is not an object", function()
    local lgjob = { job_id = "r-1", thread_id = "t-1", script = "agent",
                    run = { stream_mode = { "values" }, command = { resume = "yes" } } }
    local j = assert(job.decode { "job", assert(job.encode(lgjob)) })
    assert.is_nil(j.input)
    assert.same(lgjob.run, j.run)
    local _, why, id = job.decode { "job", '{"job_id":"r-2","thread_id":"t","run":[1]}' }
    assert.equal("field 'run' must be a JSON object", why)
    assert.equal("r-2", id)
    _, why = job.decode { "job", '{"job_id":"r-3","thread_id":"t"}' }
    assert.matches("field 'input' is missing", why)
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

  it("writes every field once, whatever the fields hold", function()
    local lines = {}
    local out = { write = function(_, ...) lines[#lines + 1] = table.concat({ ... }) end }
    local log = logm.new { level = "debug", out = out, fields = { worker = "w1" } }:with { job_id = "j-1" }
    log:info("plain")
    log:info("again", { job_id = "j-2", n = 3, f = 2.0, list = { 1, 2 }, obj = { a = "b" } })
    log:warn("odd", { fn = print, [5] = "five", q = '"quoted"\n' })
    log:error("mine", { msg = "from a field" })
    log:debug("quiet", { tiny = 1e-7 })
    assert.equal(5, #lines)
    local got = {}
    for i, l in ipairs(lines) do
      assert.equal("\n", l:sub(-1))
      assert.matches('^{"ts":"[^"]+","level":"%a+","msg":', l)
      got[i] = cjson.decode(l)
      for _, k in ipairs { "ts", "level", "msg", "worker", "job_id" } do
        local _, n = l:gsub('"' .. k .. '":', "")
        assert.equal(1, n, k .. " in " .. l)
      end
    end
    assert.same({ "plain", "w1", "j-1" }, { got[1].msg, got[1].worker, got[1].job_id })
    assert.same({ "j-2", 3, { 1, 2 }, { a = "b" } }, { got[2].job_id, got[2].n, got[2].list, got[2].obj })
    assert.matches("^function: ", got[3].fn)
    assert.same({ "five", '"quoted"\n' }, { got[3]["5"], got[3].q })
    assert.same({ "error", "from a field" }, { got[4].level, got[4].msg })
    assert.equal(1e-7, got[5].tiny)
  end)

  it("never raises: a field too deep to encode, or a ts no encoder takes, still gives a line", function()
    local lines = {}
    local out = { write = function(_, ...) lines[#lines + 1] = table.concat({ ... }) end }
    local log = logm.new { level = "info", out = out, fields = { worker = "w1" } }
    local deep = {}
    local at = deep
    for _ = 1, 50000 do at.x = {}; at = at.x end
    log:info("deep", { v = deep })
    log:info("bad ts", { ts = { 1, a = 2 } })
    log:info(nil)
    assert.equal(3, #lines)
    local got = {}
    for i, l in ipairs(lines) do got[i] = cjson.decode(l) end
    assert.equal("deep", got[1].msg)
    assert.is_string(got[1].log_error)
    assert.equal("bad ts", got[2].msg)
    assert.equal(cjson.null, got[3].msg)
    -- the fields a logger was made with are its own: changing the table later changes nothing
    local fields = { worker = "w2" }
    local l2 = logm.new { level = "info", out = out, fields = fields }
    l2:info("one")
    fields.worker, fields.extra = "changed", true
    l2:info("two", { worker = "call" })
    local two = cjson.decode(lines[#lines])
    assert.same({ "call", nil }, { two.worker, two.extra })
    local _, n = lines[#lines]:gsub('"worker":', "")
    assert.equal(1, n)
  end)
end)

describe("worker scripts", function()
  it("maps relative paths to module names", function()
    assert.equal("scripts.eco.chat", scripts.module_name("scripts/eco/chat.lua"))
    assert.equal("scripts.eco.chat", scripts.module_name("./scripts/eco/chat.lua"))
    assert.is_nil(scripts.module_name("/abs/x.lua"))
  end)

  it("takes a script without hooks, and checks the hooks a script gives", function()
    local noop = function() end
    assert.same({}, assert(scripts.hooks { build = noop }))
    local w = { scope = "app", migrations = { { version = 1, name = "t", sql = "CREATE TABLE t ()" } },
                input = noop, result = noop, record = noop, committed = noop, forget = noop }
    assert.equal(w, assert(scripts.hooks { build = noop, worker = w }))
    local cases = {
      { { worker = 3 }, "`worker` must be a table of hooks, got number" },
      { { worker = { commited = noop } }, "worker.commited: not a hook" },
      { { worker = { input = "x" } }, "worker.input must be a function, got string" },
      { { worker = { migrations = {} } }, "worker.migrations needs worker.scope" },
      { { worker = { scope = "a b", migrations = {} } }, "migration scope must be" },
      { { worker = { scope = "worker", migrations = {} } }, "is the worker's own" },
      { { worker = { scope = "a", migrations = { { version = 2, name = "x", sql = "s" },
                                                 { version = 1, name = "y", sql = "s" } } } },
        "version 1 does not follow 2" },
      { { worker = { scope = "a", migrations = { { version = 1, name = "x" } } } }, "sql must be SQL text" },
      { { worker_result = noop }, "worker_result is no longer called" },
    }
    for _, c in ipairs(cases) do
      c[1].build = noop
      local h, err = scripts.hooks(c[1])
      assert.is_nil(h)
      assert.matches(c[2], err, 1, true)
    end
  end)
end)

describe("worker migrations", function()
  it("never lists a retired version of its own scope", function()
    local migrations = require "moongraph.worker.migrations"
    assert(migrations.check(migrations.SCOPE, migrations.list, migrations.RETIRED))
    for _, m in ipairs(migrations.list) do assert.is_nil(migrations.RETIRED[m.version]) end
    local _, err = migrations.check("worker", { { version = 2, name = "x", sql = "SELECT 1" } }, migrations.RETIRED)
    assert.matches("version 2 was used before", err)
  end)
end)
