-- The LangGraph Agent API on the distributed backend: two `moongraph serve
-- --redis --pg` processes in front of two `moongraph worker` processes,
-- against real Redis and PostgreSQL, checked by the official LangGraph SDK
-- client (the scenarios of spec/support/node/langgraph_client.mjs, as for
-- the embedded backend in spec/api_langgraph_sdk_spec.lua).
local mg = require "moongraph"
local wenv = require "worker_env"
local lgserve = require "lgserve"

local AGENT = "agent=spec/fixtures/lgapi_agent.lua"
local KEYS = "MOONGRAPH_API_KEYS='alice-key-1=alice,bob-key-22=bob,carol-key-333=carol'"
local ALICE, BOB, CAROL = "alice-key-1", "bob-key-22", "carol-key-333"

local flows = require "langgraph_flows"

-- a Redis stream entry id: "<ms>-<seq>"
local function entry_id(id)
  local ms, seq = tostring(id):match("^(%d+)%-(%d+)$")
  return ms and { tonumber(ms), tonumber(seq) } or nil
end

local function before(a, b)
  local x, y = entry_id(a), entry_id(b)
  return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2])
end

describe("the LangGraph API on the distributed backend (serve --redis --pg + workers)", function()
  local env, s, s2
  setup(function()
    env = wenv.new()
    local workers = {}
    for i = 1, 2 do
      workers[i] = env:worker { "--script", AGENT, "--concurrency", "8", "--claim-idle", "3" }
    end
    mg.run(function() for _, w in ipairs(workers) do w:wait_started() end end)
    local args = { "--redis", env.redis_url, "--pg", env.pg_url, "--checkpoint", env.checkpoint }
    s = lgserve.start { env = KEYS, args = args }
    s2 = lgserve.start { env = KEYS, args = args }
  end)
  teardown(function()
    if s then s:stop() end
    if s2 then s2:stop() end
    if env then env:destroy() end
  end)

  it("lists the script as an assistant and gives its graph", function()
    local r = s:sdk("assistants", ALICE)
    flows.check.assistants(r)
  end)

  it("creates, gets, searches, updates and deletes threads in PostgreSQL", function()
    local r = s:sdk("threads", ALICE)
    flows.check.threads(r)
  end)

  it("streams a run in each mode, run by a worker: metadata first, then that mode's events", function()
    local r = s:sdk("stream_modes", ALICE)
    flows.check.stream_modes(r, before)
  end)

  it("waits for a run, then reads the thread's state and history through the workers' saver, and updates it", function()
    local r = s:sdk("state", ALICE)
    flows.check.state(r)
  end)

  it("surfaces an interrupt as LangGraph does and resumes it with command.resume", function()
    local r = s:sdk("interrupt_resume", ALICE)
    flows.check.interrupt_resume(r)
  end)

  it("creates a background run, joins it, lists it and replays its stream", function()
    local r = s:sdk("background", ALICE)
    flows.check.background(r)
  end)

  it("joinStream on another serve with the last event id after a dropped connection gets every later event once", function()
    local r = s:sdk("join_after_drop", ALICE, nil, s2)
    flows.check.join_after_drop(r, before)
  end)

  it("rejects a second run on a busy thread (409), enqueues one, and cancels the first on its worker", function()
    local r = s:sdk("multitask", ALICE)
    flows.check.multitask(r)
  end)

  it("runs stateless runs (no thread) with wait and stream", function()
    local r = s:sdk("stateless", ALICE)
    flows.check.stateless(r)
  end)

  it("streams over plain curl: stream entry ids, a Location any serve resumes with Last-Event-ID", function()
    local auth = { "-H", "x-api-key: " .. ALICE }
    local function curl(server, args)
      local full = {}
      for _, a in ipairs(auth) do full[#full + 1] = a end
      for _, a in ipairs(args) do full[#full + 1] = a end
      return server:curl(full)
    end
    local t = curl(s, { "-X", "POST", "/threads", "-d", "{}" }).json
    local r = curl(s, { "-N", "-X", "POST", "/threads/" .. t.thread_id .. "/runs/stream", "-d",
      '{"assistant_id":"agent","input":{"messages":["hi"]},"stream_mode":["updates"]}' })
    assert.equal(200, r.status)
    assert.matches("^text/event%-stream", r.headers["content-type"])
    local loc = r.headers["location"]
    assert.matches("^/threads/" .. t.thread_id:gsub("%-", "%%-") .. "/runs/[%x%-]+/stream$", loc)
    local ids, names = {}, {}
    for name, id in r.body:gmatch("event: (%S+)\nid: (%d+%-%d+)\n") do
      ids[#ids + 1], names[#names + 1] = id, name
    end
    assert.same({ "metadata", "updates", "updates", "updates" }, names)
    local again = curl(s2, { "-N", loc, "-H", "Last-Event-ID: " .. ids[2] })
    local later = {}
    for id in again.body:gmatch("id: (%d+%-%d+)\n") do later[#later + 1] = id end
    assert.same({ ids[3], ids[4] }, later)
    assert.matches('event: updates\nid: ' .. ids[3] .. '\ndata: {"ticks":', again.body, 1, true)
    -- answered with JSON errors, never a traceback
    r = curl(s, { "-X", "POST", "/threads", "-H", "Content-Type: application/json", "-d", "{not json" })
    assert.equal(400, r.status)
    assert.matches("not valid JSON", r.json.detail)
    for _, path in ipairs { "/threads/nope", "/threads/nope/state", "/threads/nope/runs/x", "/assistants/nope",
                            "/threads/nope/runs/x/stream", "/threads/" .. t.thread_id .. "/runs/nope" } do
      r = curl(s2, { path })
      assert.equal(404, r.status, path)
      assert.is_string(r.json.detail, path)
    end
    r = curl(s, { "-X", "POST", "/threads/" .. t.thread_id .. "/runs/stream", "-d",
      '{"assistant_id":"agent","stream_mode":"events"}' })
    assert.equal(422, r.status)
    assert.equal(405, curl(s, { "-X", "PUT", "/threads" }).status)
    assert.not_matches("traceback", s:stderr() .. s2:stderr())
  end)

  it("shows a user only their own threads: another user's thread answers 404", function()
    local r = s:sdk("users", CAROL, BOB)   -- (carol's first thread)
    flows.check.users(r)
  end)
end)

describe("api.langgraph_distributed driven directly, with workers running its runs", function()
  local lgdist = require "moongraph.api.langgraph_distributed"
  local env, b

  local function input(text, extra)
    local t = { messages = { { role = "user", content = text } } }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end

  local drain, reach = flows.drain, flows.reach

  local function status(run) return assert(b:run(nil, run.thread_id, run.run_id)).status end

  local function texts(out)
    local t = {}
    for _, m in ipairs(out.messages) do t[#t + 1] = m.content end
    return t
  end

  setup(function()
    env = wenv.new()
    local w = env:worker { "--script", AGENT, "--concurrency", "8", "--claim-idle", "1.5" }
    mg.run(function() w:wait_started() end)
  end)
  before_each(function()
    mg.run(function()
      b = assert(lgdist.new { redis = env.redis_url, pg = env.pg_url, checkpoint = env.checkpoint,
        scripts = { { name = "agent", path = "spec/fixtures/lgapi_agent.lua" } } })
    end)
  end)
  after_each(function() if b then mg.run(function() b:close() end) end end)
  teardown(function() if env then env:destroy() end end)

  it("a run its workers refuse (a script they lack) ends as error, and its thread is free again", function()
    mg.run(function()
      -- this backend offers a graph "other" that no worker runs
      local b2 = assert(lgdist.new { redis = env.redis_url, pg = env.pg_url, checkpoint = env.checkpoint,
        scripts = { { name = "agent", path = "spec/fixtures/lgapi_agent.lua" },
                    { name = "other", path = "spec/fixtures/lgapi_agent.lua" } } })
      local t = b2:thread_create(nil, {})
      local run = assert(b2:run_create(nil, t.thread_id, { assistant_id = "other", input = input("hi") }))
      local evs = drain(run)
      assert.equal("error", evs[#evs].event)
      assert.equal("error", status(run))
      assert.matches("unknown script 'other'", b:run_output(run).__error__.message, 1, true)
      assert.equal("idle", b:thread_get(nil, t.thread_id).status)
      -- the thread takes its next run (of its graph), even with multitask reject
      local again = assert(b2:run_create(nil, t.thread_id, { assistant_id = "other", input = input("two"),
        multitask_strategy = "reject" }))
      drain(again)
      assert.equal("error", status(again))
      assert.equal("idle", b:thread_get(nil, t.thread_id).status)
      b2:close()
    end)
  end)

  it("reports a failed run as an error event, run status error and thread status error", function()
    mg.run(function()
      local t = b:thread_create(nil, {})
      local run = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("hi", { fail = "boom" }) }))
      local evs = drain(run)
      assert.equal("metadata", evs[1].event)
      assert.equal("error", evs[#evs].event)
      assert.equal("GraphError", evs[#evs].data.error)
      -- the client hears which node failed and the run it is logged under
      local said = "node 'review' failed (run " .. run.run_id .. ")"
      assert.equal(said, evs[#evs].data.message)
      assert.equal("error", status(run))
      assert.equal(said, b:run_output(run).__error__.message)
      local th = b:thread_get(nil, t.thread_id)
      assert.equal("error", th.status)
      assert.equal(said, th.error)
    end)
  end)

  it("cancelling a queued run ends it at once; the runs behind it still run, in order", function()
    mg.run(function()
      local t = b:thread_create(nil, {})
      local first = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("one", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(first, "custom")
      assert.equal("busy", b:thread_get(nil, t.thread_id).status)
      local function enqueue(text)
        return assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input(text, { hold = false }),
          multitask_strategy = "enqueue" }))
      end
      local second, third, fourth = enqueue("two"), enqueue("three"), enqueue("four")
      assert.is_true(b:run_cancel(nil, t.thread_id, third.run_id, "interrupt"))
      assert.equal("interrupted", status(third))
      -- its stream ends with the error that says it was cancelled, and its
      -- wait answers that error: nothing looks like a success
      local evs = drain(third)
      local names = {}
      for i, e in ipairs(evs) do names[i] = e.event end
      assert.same({ "metadata", "error" }, names)
      assert.equal("UserInterrupt", evs[2].data.error)
      assert.equal("UserInterrupt", b:run_output(third).__error__.error)
      assert.is_true(b:run_cancel(nil, t.thread_id, first.run_id, "interrupt", true))
      local out = b:run_output(fourth)
      assert.same({ "interrupted", "success", "interrupted", "success" },
        { status(first), status(second), status(third), status(fourth) })
      assert.same({ "one", "two", "echo: two", "four", "echo: four" }, texts(out))
      assert.equal("idle", b:thread_get(nil, t.thread_id).status)
    end)
  end)

  it("multitask interrupt stops the running run (which ends with an error, not as a success) on its worker; rollback takes the thread back to where it started", function()
    mg.run(function()
      local t = b:thread_create(nil, {})
      b:run_output(assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("base") })))
      local busy = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("lost", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(busy, "custom")
      local second = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("next", { hold = false }),
        multitask_strategy = "rollback" }))
      local out = b:run_output(second)
      assert.equal("interrupted", status(busy))
      -- the stopped run does not look like a success: its wait answers the
      -- error its stream ends with
      local stopped = b:run_output(busy).__error__
      assert.equal("UserRollback", stopped.error)
      assert.matches("multitask_strategy rollback", stopped.message)
      local evs = drain(busy)
      assert.equal("error", evs[#evs].event)
      assert.same({ "base", "echo: base", "next", "echo: next" }, texts(out))
      local held = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("kept", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(held, "custom")
      local third = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("after", { hold = false }),
        multitask_strategy = "interrupt" }))
      out = b:run_output(third)
      assert.equal("interrupted", status(held))
      assert.equal("UserInterrupt", b:run_output(held).__error__.error)
      assert.same({ "base", "echo: base", "next", "echo: next", "kept", "after", "echo: after" }, texts(out))
    end)
  end)

  it("cancel with rollback takes the thread back to the checkpoint the run started from", function()
    mg.run(function()
      local t = b:thread_create(nil, {})
      b:run_output(assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("base") })))
      local before_run = b:thread_state(nil, t.thread_id)
      local busy = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("undo me", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(busy, "custom")
      assert.is_true(b:run_cancel(nil, t.thread_id, busy.run_id, "rollback", true))
      assert.equal("interrupted", status(busy))
      local after = b:thread_state(nil, t.thread_id)
      assert.same({ "base", "echo: base" }, texts(after.values))
      assert.same(before_run.values, after.values)
      assert.equal("idle", b:thread_get(nil, t.thread_id).status)
    end)
  end)

  it("updates a thread's state as a node and refuses it while a run is going", function()
    mg.run(function()
      local t = b:thread_create(nil, {})
      b:run_output(assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("x") })))
      local held = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("y", { hold = 30 }),
        stream_mode = "custom" }))
      reach(held, "custom")
      local none, st = b:thread_update_state(nil, t.thread_id, { values = { note = "no" } })
      assert.is_nil(none)
      assert.equal(409, st)
      b:run_cancel(nil, t.thread_id, held.run_id, "interrupt", true)
      local up = assert(b:thread_update_state(nil, t.thread_id, { values = { note = "yes" }, as_node = "review" }))
      assert.is_string(up.checkpoint.checkpoint_id)
      assert.equal("yes", b:thread_state(nil, t.thread_id).values.note)
      assert.equal("yes", b:thread_get(nil, t.thread_id).values.note)
    end)
  end)

  it("deletes a thread while its run is going: the run stops on its worker and the thread stays gone", function()
    mg.run(function()
      local t = b:thread_create(nil, { thread_id = "gone-1" })
      local run = assert(b:run_create(nil, "gone-1", { assistant_id = "agent", input = input("bye", { hold = 30 }),
        stream_mode = "custom" }))
      reach(run, "custom")
      assert.is_true(b:thread_delete(nil, t.thread_id))
      drain(run)   -- (its stream ends: the worker stopped it)
      -- and what it saved after the delete is gone too
      local saver = require("moongraph.worker.checkpointer").open(env.checkpoint,
        { redis_url = env.redis_url, pg_url = env.pg_url })
      wenv.eventually("the deleted thread's checkpoints to go", 10, function()
        return saver:get { thread_id = "gone-1" } == nil
      end)
      local none, st = b:thread_get(nil, "gone-1")
      assert.is_nil(none)
      assert.equal(404, st)
      assert(b:thread_create(nil, { thread_id = "gone-1" }))
      local out = b:run_output(assert(b:run_create(nil, "gone-1", { assistant_id = "agent", input = input("fresh") })))
      assert.same({ "fresh", "echo: fresh" }, texts(out))
    end)
  end)

  it("runs a stateless run on a temporary thread whose checkpoints are gone afterwards", function()
    mg.run(function()
      local run = assert(b:run_create(nil, nil, { assistant_id = "agent", input = input("solo") }))
      local out = b:run_output(run)
      assert.equal("echo: solo", out.messages[2].content)
      assert.is_nil(b:thread_get(nil, run.thread_id))
      assert.equal(run.run_id, assert(b:run(nil, nil, run.run_id)).run_id)
      assert.is_nil(b:run(nil, run.thread_id, run.run_id) and nil)
      local _, db = env:conns()
      local rows = assert(db:query("SELECT count(*)::int AS n FROM langgraph_threads WHERE thread_id = $1", { run.thread_id }))
      assert.equal(0, rows[1].n)
      local saver = require("moongraph.worker.checkpointer").open(env.checkpoint,
        { redis_url = env.redis_url, pg_url = env.pg_url })
      assert.is_nil(saver:get { thread_id = run.thread_id })
    end)
  end)

  it("refuses what it cannot do with 422, unknown assistants with 404, and another user's ids with 404", function()
    mg.run(function()
      local t = b:thread_create("u1", {})
      local _, st = b:run_create("u1", t.thread_id, { assistant_id = "ghost" })
      assert.equal(404, st)
      _, st = b:run_create("u1", t.thread_id, { assistant_id = "agent", stream_mode = "events" })
      assert.equal(422, st)
      _, st = b:run_create("u1", t.thread_id, { assistant_id = "agent", multitask_strategy = "later" })
      assert.equal(422, st)
      _, st = b:run_create("u1", t.thread_id, { assistant_id = "agent", input = { 1, 2 } })
      assert.equal(422, st)
      _, st = b:thread_search("u1", { sort_by = "nope" })
      assert.equal(422, st)
      local run = assert(b:run_create("u1", t.thread_id, { assistant_id = "agent", input = input("mine") }))
      b:run_output(run)
      for _, r in ipairs {
        { b:thread_get("u2", t.thread_id) }, { b:thread_state("u2", t.thread_id) },
        { b:run("u2", t.thread_id, run.run_id) }, { b:run_cancel("u2", t.thread_id, run.run_id) },
        { b:run_create("u2", t.thread_id, { assistant_id = "agent", input = input("intrude") }) },
        { b:thread_delete("u2", t.thread_id) }, { b:run("u1", "other", run.run_id) },
      } do
        assert.is_nil(r[1])
        assert.equal(404, r[2])
      end
      assert.equal(0, b:thread_count("u2", {}))
    end)
  end)
end)

describe("moongraph serve --checkpoint", function()
  it("goes with --redis and --pg (it names the workers' saver)", function()
    local cli = require "cli"
    local r = cli.run { "serve", "--script", AGENT, "--port", "0", "--checkpoint", "postgres" }
    assert.equal(2, r.code)
    assert.matches("%-%-checkpoint names the workers' saver: it goes with %-%-redis and %-%-pg", r.err)
  end)
end)
