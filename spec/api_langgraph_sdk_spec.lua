-- `moongraph serve` checked by the official LangGraph SDK client
-- (@langchain/langgraph-sdk, spec/support/node/langgraph_client.mjs,
-- installed by make test) and by curl for what the SDK never sends.
local lgserve = require "lgserve"

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

describe("moongraph serve with the LangGraph SDK", function()
  local s
  setup(function() s = lgserve.start() end)
  teardown(function() if s then s:stop() end end)

  it("lists the script as an assistant and gives its graph", function()
    local r = s:sdk("assistants")
    assert.equal(1, #r.list)
    assert.equal("agent", r.list[1].assistant_id)
    assert.equal("agent", r.one.graph_id)
    local ids = {}
    for _, n in ipairs(r.graph.nodes) do ids[#ids + 1] = n.id end
    assert.same({ "__start__", "think", "ticks", "review", "__end__" }, ids)
    assert.equal(4, #r.graph.edges)
    assert.equal(404, r.missing.status)
  end)

  it("creates, gets, searches, updates and deletes threads", function()
    local r = s:sdk("threads")
    local id = r.created.thread_id
    assert.matches("^%x+%-%x+%-4%x+%-%x+%-%x+$", id)
    assert.equal("idle", r.created.status)
    assert.equal(id, r.got.thread_id)
    assert.equal(1, #r.found)
    assert.equal(id, r.found[1].thread_id)
    assert.same({ team = "blue", more = 1 }, r.updated.metadata)
    assert.equal(404, r.gone.status)
  end)

  it("streams a run in each mode: metadata first, then that mode's events", function()
    local r = s:sdk("stream_modes")
    for mode, list in pairs(r) do
      assert.equal("metadata", list[1].event, mode)
      assert.is_string(list[1].data.run_id, mode)
      for i, p in ipairs(list) do assert.equal(tostring(i), p.id, mode .. " event ids") end
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

  it("waits for a run, then reads the thread's state, history and an older checkpoint, and updates the state", function()
    local r = s:sdk("state")
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
    local r = s:sdk("interrupt_resume")
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
    local r = s:sdk("background")
    assert.equal("pending", r.run.status)
    assert.same({ "later", "echo: later" }, contents(r.joined.messages))
    assert.equal("success", r.fetched.status)
    assert.equal(1, #r.list)
    assert.equal(r.run.run_id, r.list[1].run_id)
    assert.equal("metadata", r.replay[1].event)
    assert.same(r.joined, events(r.replay, "values")[4])
  end)

  it("joinStream with the last event id after a dropped connection gets every later event once", function()
    local r = s:sdk("join_after_drop")
    local ticks = {}
    for _, d in ipairs(events(r.first, "custom")) do if d.tick then ticks[#ticks + 1] = d.tick end end
    assert.same({ 1, 2 }, ticks)
    assert.equal(r.first[#r.first].id, r.lastEventId)
    for _, d in ipairs(events(r.rest, "custom")) do ticks[#ticks + 1] = d.tick end
    assert.same({ 1, 2, 3, 4, 5, 6 }, ticks)
    assert.equal(tonumber(r.lastEventId) + 1, tonumber(r.rest[1].id))
    assert.same({ "think", "ticks", "review" }, r.state.values.steps)
  end)

  it("rejects a second run on a busy thread (409), enqueues one, and cancels the first", function()
    local r = s:sdk("multitask")
    assert.equal(409, r.rejected.status)
    assert.equal(409, r.rejectedStream.status)
    assert.equal("interrupted", r.cancelled.status)
    assert.equal("success", r.after.status)
    assert.same({ "slow", "third", "echo: third" }, contents(r.third.messages))
  end)

  it("runs stateless runs (no thread) with wait and stream", function()
    local r = s:sdk("stateless")
    assert.same({ "no thread", "echo: no thread" }, contents(r.waited.messages))
    assert.same({ "metadata", "updates", "updates", "updates" }, event_names(r.streamed))
  end)
end)

describe("moongraph serve, bad requests answered with JSON errors", function()
  local s
  setup(function() s = lgserve.start() end)
  teardown(function() if s then s:stop() end end)

  it("answers malformed JSON with 400 and a body that is not an object with 422", function()
    local r = s:curl { "-X", "POST", "/threads", "-H", "Content-Type: application/json", "-d", "{not json" }
    assert.equal(400, r.status)
    assert.matches("not valid JSON", r.json.detail)
    r = s:curl { "-X", "POST", "/threads", "-d", "[1,2]" }
    assert.equal(422, r.status)
    r = s:curl { "-X", "POST", "/threads/search", "-d", '{"metadata": 3}' }
    assert.equal(422, r.status)
    assert.matches("metadata", r.json.detail)
  end)

  it("answers unknown threads, runs, checkpoints and assistants with 404", function()
    for _, path in ipairs { "/threads/nope", "/threads/nope/state", "/threads/nope/runs/x", "/assistants/nope",
                            "/threads/nope/runs/x/stream", "/assistants/nope/graph" } do
      local r = s:curl { path }
      assert.equal(404, r.status, path)
      assert.is_string(r.json.detail, path)
    end
    local t = s:curl { "-X", "POST", "/threads", "-d", "{}" }.json
    assert.equal(404, s:curl { "/threads/" .. t.thread_id .. "/state/0000nope" }.status)
    local r = s:curl { "-X", "POST", "/threads/" .. t.thread_id .. "/runs/wait", "-d", '{"assistant_id":"ghost"}' }
    assert.equal(404, r.status)
  end)

  it("answers a wrong method with 405 and never a traceback", function()
    local r = s:curl { "-X", "PUT", "/threads" }
    assert.equal(405, r.status)
    r = s:curl { "-X", "POST", "/threads/x/runs/stream", "-d", '{"assistant_id":"agent"}' }
    assert.equal(404, r.status)
    local t = s:curl { "-X", "POST", "/threads", "-d", "{}" }.json
    r = s:curl { "-X", "POST", "/threads/" .. t.thread_id .. "/runs/stream", "-d",
      '{"assistant_id":"agent","stream_mode":"events"}' }
    assert.equal(422, r.status)
    assert.matches("stream_mode", r.json.detail)
    assert.not_matches("traceback", s:stderr())
  end)

  it("streams over plain curl: SSE events with ids, a Location to reconnect to, Last-Event-ID resumes", function()
    local t = s:curl { "-X", "POST", "/threads", "-d", "{}" }.json
    local r = s:curl { "-N", "-X", "POST", "/threads/" .. t.thread_id .. "/runs/stream", "-d",
      '{"assistant_id":"agent","input":{"messages":["hi"]},"stream_mode":["updates"]}' }
    assert.equal(200, r.status)
    assert.matches("^text/event%-stream", r.headers["content-type"])
    local loc = r.headers["location"]
    assert.matches("^/threads/" .. t.thread_id:gsub("%-", "%%-") .. "/runs/[%x%-]+/stream$", loc)
    local ids = {}
    for id in r.body:gmatch("id: (%d+)\n") do ids[#ids + 1] = tonumber(id) end
    assert.same({ 1, 2, 3, 4 }, ids)
    local again = s:curl { "-N", loc, "-H", "Last-Event-ID: 2" }
    local later = {}
    for id in again.body:gmatch("id: (%d+)\n") do later[#later + 1] = tonumber(id) end
    assert.same({ 3, 4 }, later)
    assert.matches("event: updates\nid: 3\ndata: {\"ticks\":", again.body, 1, true)
  end)
end)

describe("moongraph serve with API keys", function()
  local s
  setup(function()
    s = lgserve.start { env = "MOONGRAPH_API_KEYS='alice-key-1=alice,bob-key-22=bob'" }
  end)
  teardown(function() if s then s:stop() end end)

  it("shows a user only their own threads: another user's thread answers 404", function()
    local r = s:sdk("users", "alice-key-1", "bob-key-22")
    assert.equal(404, r.theirs.status)
    assert.equal(404, r.theirState.status)
    assert.equal(404, r.theirRun.status)
    assert.same({}, r.theirSearch)
    assert.equal(1, #r.mySearch)
    assert.equal(401, r.noKey.status)
    assert.equal(401, r.badKey.status)
  end)

  it("takes the key as Authorization: Bearer too", function()
    local r = s:curl { "-X", "POST", "/threads/search", "-H", "Authorization: Bearer bob-key-22", "-d", "{}" }
    assert.equal(200, r.status)
    r = s:curl { "-X", "POST", "/threads/search", "-H", "Authorization: Bearer alice-key-2", "-d", "{}" }
    assert.equal(401, r.status)
  end)

  it("refuses to listen beyond loopback without keys, and says so", function()
    local cli = require "cli"
    local r = cli.run { "serve", "--script", "agent=spec/fixtures/lgapi_agent.lua", "--host", "0.0.0.0", "--port", "0" }
    assert.equal(2, r.code)
    assert.matches("refusing to listen on 0.0.0.0 without API keys", r.err)
  end)
end)
