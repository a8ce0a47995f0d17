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

local function events(list, name)
  local out = {}
  for _, p in ipairs(list) do
    if p.event == name then out[#out + 1] = p.data end
  end
  return out
end

local function event_names(list)
  local out = {}
  for i, p in ipairs(list) do out[i] = p.event end
  return out
end

local function contents(messages)
  local out = {}
  for i, m in ipairs(messages) do out[i] = m.content end
  return out
end

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
    assert.equal(1, #r.list)
    assert.equal("agent", r.list[1].assistant_id)
    local ids = {}
    for _, n in ipairs(r.graph.nodes) do ids[#ids + 1] = n.id end
    assert.same({ "__start__", "think", "ticks", "review", "__end__" }, ids)
    assert.equal(404, r.missing.status)
  end)

  it("creates, gets, searches, updates and deletes threads in PostgreSQL", function()
    local r = s:sdk("threads", ALICE)
    local id = r.created.thread_id
    assert.matches("^%x+%-%x+%-4%x+%-%x+%-%x+$", id)
    assert.equal("idle", r.created.status)
    assert.equal(id, r.got.thread_id)
    assert.equal(1, #r.found)
    assert.equal(id, r.found[1].thread_id)
    assert.same({ team = "blue", more = 1 }, r.updated.metadata)
    assert.equal(404, r.gone.status)
  end)

  it("streams a run in each mode, run by a worker: metadata first, then that mode's events", function()
    local r = s:sdk("stream_modes", ALICE)
    for mode, list in pairs(r) do
      assert.equal("metadata", list[1].event, mode)
      assert.is_string(list[1].data.run_id, mode)
      for i = 2, #list do assert.is_true(before(list[i - 1].id, list[i].id), mode .. " event ids") end
    end
    local values = events(r.values, "values")
    assert.equal(4, #values)
    assert.same({ "hello world", "echo: hello world" }, contents(values[4].messages))
    assert.same({ "think", "ticks", "review" }, values[4].steps)
    local updates = events(r.updates, "updates")
    assert.same({ "think", "ticks", "review" }, { (next(updates[1])), (next(updates[2])), (next(updates[3])) })
    assert.same({ "echo: hello world" }, contents(updates[1].think.messages))
    local tokens = {}
    for _, m in ipairs(events(r["messages-tuple"], "messages")) do
      tokens[#tokens + 1] = m[1].content
      assert.equal("AIMessageChunk", m[1].type)
      assert.equal("think", m[2].langgraph_node)
    end
    assert.equal("echo: hello world ", table.concat(tokens))
    assert.same({ { progress = "thinking" } }, events(r.custom, "custom"))
    local kinds = {}
    for _, d in ipairs(events(r.debug, "debug")) do kinds[d.type] = (kinds[d.type] or 0) + 1 end
    assert.same({ checkpoint = 4, task = 3, task_result = 3 }, kinds)
    assert.same({ "metadata", "values", "custom", "messages", "messages", "messages", "updates", "values",
      "updates", "values", "updates", "values" }, event_names(r.all))
  end)

  it("waits for a run, then reads the thread's state and history through the workers' saver, and updates it", function()
    local r = s:sdk("state", ALICE)
    assert.same({ "keep me", "echo: keep me" }, contents(r.waited.messages))
    assert.same(r.waited, r.state.values)
    assert.same({}, r.state.next)
    assert.equal(4, #r.history)
    assert.equal(r.state.checkpoint.checkpoint_id, r.history[1].checkpoint.checkpoint_id)
    assert.same({ "think", "ticks" }, r.older.values.steps)
    assert.is_string(r.update.checkpoint.checkpoint_id)
    assert.equal("by hand", r.after.values.note)
    assert.equal(r.update.checkpoint.checkpoint_id, r.after.checkpoint.checkpoint_id)
  end)

  it("surfaces an interrupt as LangGraph does and resumes it with command.resume", function()
    local r = s:sdk("interrupt_resume", ALICE)
    local values = events(r.streamed, "values")
    assert.same({ __interrupt__ = { { id = "3:review/1", value = { question = "ship it?" } } } }, values[#values])
    assert.equal("interrupted", r.paused.status)
    assert.same({ "review" }, r.state.next)
    assert.equal("ship it?", r.state.interrupts[1].value.question)
    assert.equal("ship it?", r.state.tasks[1].interrupts[1].value.question)
    assert.equal("yes", r.resumed.approved)
    assert.same({ "think", "ticks", "review" }, r.resumed.steps)
    assert.equal("idle", r.done.status)
  end)

  it("creates a background run, joins it, lists it and replays its stream", function()
    local r = s:sdk("background", ALICE)
    assert.equal("pending", r.run.status)
    assert.same({ "later", "echo: later" }, contents(r.joined.messages))
    assert.equal("success", r.fetched.status)
    assert.equal(1, #r.list)
    assert.equal(r.run.run_id, r.list[1].run_id)
    assert.equal("metadata", r.replay[1].event)
    assert.same(r.joined, events(r.replay, "values")[4])
  end)

  it("joinStream on another serve with the last event id after a dropped connection gets every later event once", function()
    local r = s:sdk("join_after_drop", ALICE, nil, s2)
    local ticks = {}
    for _, d in ipairs(events(r.first, "custom")) do if d.tick then ticks[#ticks + 1] = d.tick end end
    assert.same({ 1, 2 }, ticks)
    assert.equal(r.first[#r.first].id, r.lastEventId)
    for _, d in ipairs(events(r.rest, "custom")) do ticks[#ticks + 1] = d.tick end
    assert.same({ 1, 2, 3, 4, 5, 6 }, ticks)
    assert.is_true(before(r.lastEventId, r.rest[1].id))
    assert.same({ "think", "ticks", "review" }, r.state.values.steps)
  end)

  it("rejects a second run on a busy thread (409), enqueues one, and cancels the first on its worker", function()
    local r = s:sdk("multitask", ALICE)
    assert.equal(409, r.rejected.status)
    assert.equal(409, r.rejectedStream.status)
    assert.equal("interrupted", r.cancelled.status)
    assert.equal("success", r.after.status)
    assert.same({ "slow", "third", "echo: third" }, contents(r.third.messages))
  end)

  it("runs stateless runs (no thread) with wait and stream", function()
    local r = s:sdk("stateless", ALICE)
    assert.same({ "no thread", "echo: no thread" }, contents(r.waited.messages))
    assert.same({ "metadata", "updates", "updates", "updates" }, event_names(r.streamed))
  end)

  it("shows a user only their own threads: another user's thread answers 404", function()
    local r = s:sdk("users", CAROL, BOB)   -- (carol's first thread)
    assert.equal(404, r.theirs.status)
    assert.equal(404, r.theirState.status)
    assert.equal(404, r.theirRun.status)
    assert.same({}, r.theirSearch)
    assert.equal(1, #r.mySearch)
    assert.equal(401, r.noKey.status)
    assert.equal(401, r.badKey.status)
  end)
end)
