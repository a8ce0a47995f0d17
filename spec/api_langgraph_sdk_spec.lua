-- `moongraph serve` checked by the official LangGraph SDK client
-- (@langchain/langgraph-sdk, spec/support/node/langgraph_client.mjs,
-- installed by make test) and by curl for what the SDK never sends.
local lgserve = require "lgserve"

local flows = require "langgraph_flows"

-- event ids are counted from 1 per run
local function next_id(a, b) return tonumber(b) == tonumber(a) + 1 end

describe("moongraph serve with the LangGraph SDK", function()
  local s
  setup(function() s = lgserve.start() end)
  teardown(function() if s then s:stop() end end)

  it("lists the script as an assistant and gives its graph", function()
    local r = s:sdk("assistants")
    flows.check.assistants(r)
  end)

  it("creates, gets, searches, updates and deletes threads", function()
    local r = s:sdk("threads")
    flows.check.threads(r)
  end)

  it("streams a run in each mode: metadata first, then that mode's events", function()
    local r = s:sdk("stream_modes")
    flows.check.stream_modes(r, next_id)
    for mode, list in pairs(r) do assert.equal("1", list[1].id, mode) end
  end)

  it("waits for a run, then reads the thread's state, history and an older checkpoint, and updates the state", function()
    local r = s:sdk("state")
    flows.check.state(r)
  end)

  it("surfaces an interrupt as LangGraph does and resumes it with command.resume", function()
    local r = s:sdk("interrupt_resume")
    flows.check.interrupt_resume(r)
  end)

  it("creates a background run, joins it, lists it and replays its stream", function()
    local r = s:sdk("background")
    flows.check.background(r)
  end)

  it("joinStream with the last event id after a dropped connection gets every later event once", function()
    local r = s:sdk("join_after_drop")
    flows.check.join_after_drop(r, next_id)
  end)

  it("rejects a second run on a busy thread (409), enqueues one, and cancels the first", function()
    local r = s:sdk("multitask")
    flows.check.multitask(r)
  end)

  it("runs stateless runs (no thread) with wait and stream", function()
    local r = s:sdk("stateless")
    flows.check.stateless(r)
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
    flows.check.users(r)
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
