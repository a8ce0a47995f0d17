-- The Chat API of `moongraph serve` on the embedded backend, through a real
-- serve process with curl and raw sockets. The script is
-- spec/fixtures/chat_gate.lua (three parallel nodes, then an answer of 12
-- tokens that can be held after the 5th); one group runs the Eco² chat
-- pipeline itself with the seed's message.
local chatserve = require "chatserve"
local tmp = require "tmp"

local GATE = { "--script", "gate=spec/fixtures/chat_gate.lua" }

local function types(events)
  local out = {}
  for i, e in ipairs(events) do out[i] = e.event end
  return out
end

local function tokens_of(events)
  local t = {}
  for _, e in ipairs(events) do
    if e.event == "token" then t[#t + 1] = e.json.text end
  end
  return table.concat(t)
end

local function file_exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

describe("moongraph serve, Chat API (embedded)", function()
  local s
  setup(function() s = chatserve.start { args = GATE } end)
  teardown(function() if s then s:stop() end end)
  before_each(function() s:open_gate() end)

  it("accepts a message with 202 and its job, conversation and stream url, durably stored first", function()
    local r = s:post { message = "hello" }
    assert.are.equal(202, r.status)
    local j = r.json
    assert.is_string(j.job_id)
    assert.is_string(j.conversation_id)
    assert.are.equal("/chat/messages/" .. j.job_id .. "/stream", j.stream_url)
    assert.are.equal(j.stream_url, r.headers["location"])
    assert.is_true(file_exists(s.data .. "/chat/jobs/" .. j.job_id .. ".json"))
    assert.is_true(file_exists(s.data .. "/chat/conversations/" .. j.conversation_id .. ".json"))
  end)

  it("streams node starts and ends (three in parallel), the tokens, the answer and done, each with an id", function()
    local j = s:post({ message = "hello" }).json
    local st = s:stream(j.job_id)
    assert.are.equal(200, st.status)
    assert.are.equal("text/event-stream", st.headers["content-type"])
    assert.is_true(st.ended)
    local ev = st.events
    for i, e in ipairs(ev) do assert.are.equal(tostring(i), e.id) end
    assert.are.equal("done", ev[#ev].event)
    assert.are.equal("done", ev[#ev].json.status)
    assert.are.equal("answer", ev[#ev - 1].event)
    -- a, b and c all start before any of them ends
    local started, first_end = {}, nil
    for i, e in ipairs(ev) do
      if e.event == "node_start" and (e.json.node == "a" or e.json.node == "b" or e.json.node == "c") then
        started[e.json.node] = i
      elseif e.event == "node_end" and (e.json.node == "a" or e.json.node == "b" or e.json.node == "c") then
        first_end = first_end or i
        assert.is_number(e.json.duration_ms)
      end
    end
    assert.is_number(started.a); assert.is_number(started.b); assert.is_number(started.c)
    assert.is_true(math.max(started.a, started.b, started.c) < first_end)
    local answer = ev[#ev - 1].json.answer
    assert.are.equal("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 ", answer)
    assert.are.equal(answer, tokens_of(ev))
  end)

  it("gives a client that reconnects with Last-Event-ID every later event once, in order (catch-up, then live)", function()
    s:close_gate()
    local j = s:post({ message = "hello" }).json
    local first = s:stream(j.job_id, { until_tokens = 3 })
    local last = first.events[#first.events].id
    s:open_gate()
    local rest = s:stream(j.job_id, { last_id = last })
    assert.is_true(rest.ended)
    local all = {}
    for _, e in ipairs(first.events) do all[#all + 1] = e end
    for _, e in ipairs(rest.events) do all[#all + 1] = e end
    for i, e in ipairs(all) do assert.are.equal(tostring(i), e.id) end
    assert.are.equal(tonumber(last) + 1, tonumber(rest.events[1].id))
    assert.are.equal("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 ", tokens_of(all))
    assert.are.equal("done", all[#all].event)
  end)

  it("takes the last id as ?last_event_id too, and ends at once after done", function()
    local j = s:post({ message = "hello" }).json
    local full = s:stream(j.job_id)
    local n = #full.events
    local tail = s:stream(j.job_id, { query = "?last_event_id=" .. (n - 2) })
    assert.are.same({ "answer", "done" }, types(tail.events))
    local none = s:stream(j.job_id, { last_id = tostring(n) })
    assert.is_true(none.ended)
    assert.are.equal(0, #none.events)
  end)

  it("refuses a Last-Event-ID that is not an event id with 400", function()
    local j = s:post({ message = "hello" }).json
    local r = s:stream(j.job_id, { last_id = "abc" })
    assert.are.equal(400, r.status)
    assert.matches("Last%-Event%-ID", r.body)
  end)

  it("lists the caller's conversations newest first, a page at a time", function()
    local ids = {}
    for i = 1, 3 do
      local j = s:post({ message = "list " .. i }).json
      s:stream(j.job_id)
      ids[i] = j.conversation_id
    end
    local r = s:curl { "/chat/conversations?limit=2" }
    assert.are.equal(200, r.status)
    assert.are.equal(ids[3], r.json.items[1].id)
    assert.are.equal(ids[2], r.json.items[2].id)
    assert.are.equal(2, #r.json.items)
    assert.are.equal(2, r.json.next_offset)
    local r2 = s:curl { "/chat/conversations?limit=1&offset=2" }
    assert.are.equal(ids[1], r2.json.items[1].id)
    assert.are.equal("list 1", r2.json.items[1].title)
  end)

  it("continues a conversation and shows its messages, questions and answers in order", function()
    local j1 = s:post({ message = "first" }).json
    s:stream(j1.job_id)
    local j2 = s:post({ message = "second", conversation_id = j1.conversation_id }).json
    assert.are.equal(j1.conversation_id, j2.conversation_id)
    s:stream(j2.job_id)
    local r = s:curl { "/chat/conversations/" .. j1.conversation_id }
    assert.are.equal(200, r.status)
    local m = r.json.messages
    assert.are.equal(4, #m)
    assert.are.same({ "user", "assistant", "user", "assistant" }, { m[1].role, m[2].role, m[3].role, m[4].role })
    assert.are.equal("first", m[1].content)
    assert.are.equal("second", m[3].content)
    assert.are.equal("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 ", m[4].content)
    assert.are.equal(j2.job_id, m[4].job_id)
    assert.are.equal("done", m[4].status)
  end)

  it("runs a conversation's messages one after the other, in the order they came", function()
    s:close_gate()
    local j1 = s:post({ message = "one" }).json
    local j2 = s:post({ message = "two", conversation_id = j1.conversation_id }).json
    s:open_gate()
    local a = s:stream(j1.job_id)
    local b = s:stream(j2.job_id)
    assert.are.equal("done", a.events[#a.events].json.status)
    assert.are.equal("done", b.events[#b.events].json.status)
    local r = s:curl { "/chat/conversations/" .. j1.conversation_id }
    local roles = {}
    for i, m in ipairs(r.json.messages) do roles[i] = m.role .. ":" .. m.job_id end
    assert.are.same({ "user:" .. j1.job_id, "user:" .. j2.job_id, "assistant:" .. j1.job_id,
                      "assistant:" .. j2.job_id }, roles)
  end)

  it("deletes a conversation with its messages, events and checkpoints; deleting again is fine", function()
    local j = s:post({ message = "to delete" }).json
    s:stream(j.job_id)
    local cp = s.data .. "/chat/checkpoints"
    local before = io.popen("ls " .. cp):read("a")
    assert.matches(j.conversation_id, before, 1, true)
    local d = s:curl { "-X", "DELETE", "/chat/conversations/" .. j.conversation_id }
    assert.are.equal(204, d.status)
    assert.are.equal(204, s:curl({ "-X", "DELETE", "/chat/conversations/" .. j.conversation_id }).status)
    assert.are.equal(404, s:curl({ "/chat/conversations/" .. j.conversation_id }).status)
    assert.are.equal(404, s:stream(j.job_id).status)
    assert.is_false(file_exists(s.data .. "/chat/events/" .. j.job_id .. ".log"))
    assert.is_false(file_exists(s.data .. "/chat/jobs/" .. j.job_id .. ".json"))
    assert.is_nil(io.popen("ls " .. cp):read("a"):find(j.conversation_id, 1, true))
    for _, c in ipairs(s:curl({ "/chat/conversations?limit=100" }).json.items) do
      assert.are_not.equal(j.conversation_id, c.id)
    end
  end)

  it("ends a failed run with an error event and done with status failed, and records the failure", function()
    local j = s:post({ message = "fail" }).json
    local st = s:stream(j.job_id)
    local ev = st.events
    assert.are.equal("error", ev[#ev - 1].event)
    assert.are.equal("failed", ev[#ev].json.status)
    local m = s:curl({ "/chat/conversations/" .. j.conversation_id }).json.messages
    assert.are.equal("failed", m[2].status)
    -- the client learns which node failed and the job id; the error itself
    -- is the server's, in its log under that job id
    for _, said in ipairs { ev[#ev - 1].json.error, m[2].error } do
      assert.matches("node 'b'", said, 1, true)
      assert.matches(j.job_id, said, 1, true)
      assert.is_nil(said:find("could not answer", 1, true))
    end
    local log = s:stderr()
    assert.is_truthy(log:find("job " .. j.job_id .. " failed: node 'b'", 1, true))
    assert.is_truthy(log:find("b could not answer", 1, true))
  end)

  it("sends a comment heartbeat on a stream that waits", function()
    local h = chatserve.start { args = { "--script", "gate=spec/fixtures/chat_gate.lua", "--heartbeat", "0.05" } }
    local ok, err = pcall(function()
      local j = h:post({ message = "wait" }).json
      local st = h:stream(j.job_id, { until_comments = 3 })
      assert.are.equal("heartbeat", st.comments[#st.comments])
      h:open_gate()
      local rest = h:stream(j.job_id, { last_id = st.events[#st.events].id })
      assert.are.equal("done", rest.events[#rest.events].event)
    end)
    h:stop()
    assert(ok, err)
  end)

  describe("bad input", function()
    local function err_of(r, status, pattern)
      assert.are.equal(status, r.status)
      assert.matches("json", r.headers["content-type"])
      assert.is_string(r.json.error)
      if pattern then assert.matches(pattern, r.json.error) end
      assert.is_nil(r.body:find("traceback", 1, true))
    end
    it("bad JSON is 400", function() err_of(s:post("{"), 400, "not valid JSON") end)
    it("an empty body is 400", function() err_of(s:post(""), 400, "empty") end)
    it("a body that is not an object is 400", function() err_of(s:post("[1]"), 400, "JSON object") end)
    it("a missing message is 400", function() err_of(s:post("{}"), 400, "\"message\" is missing") end)
    it("a message that is not a string is 400", function() err_of(s:post { message = 5 }, 400, "must be a string") end)
    it("a blank message is 400", function() err_of(s:post { message = "  \n" }, 400, "empty") end)
    it("a message that is not UTF-8 is 400", function()
      err_of(s:post('{"message":"\255\254"}'), 400)
    end)
    it("an oversized message is 413", function()
      err_of(s:post { message = string.rep("x", 16 * 1024 + 1) }, 413, "longer than 16384 bytes")
    end)
    it("a context that is not an object, or too long, is 400", function()
      err_of(s:post { message = "hi", context = "Seoul" }, 400, "\"context\" must be an object")
      err_of(s:post { message = "hi", context = { "a" } }, 400, "\"context\" must be an object")
      err_of(s:post { message = "hi", context = { x = string.rep("y", 5000) } }, 400, "longer than 4096 bytes")
    end)
    it("a malformed conversation id is 400", function()
      err_of(s:post { message = "hi", conversation_id = "a b" }, 400, "conversation_id")
    end)
    it("an unknown conversation is 404", function()
      err_of(s:post { message = "hi", conversation_id = "c-nope" }, 404, "not found")
    end)
    it("an unknown script is 404", function() err_of(s:post { message = "hi", script = "nope" }, 404, "unknown script") end)
    it("an unknown job's stream is 404", function() err_of(s:curl { "/chat/messages/j-nope/stream" }, 404) end)
    it("an unknown conversation is 404 to GET and DELETE", function()
      err_of(s:curl { "/chat/conversations/c-nope" }, 404)
      err_of(s:curl { "-X", "DELETE", "/chat/conversations/c-nope" }, 404)
    end)
    it("a wrong method is 405 with Allow", function()
      local r = s:curl { "-X", "PUT", "/chat/messages" }
      err_of(r, 405)
      assert.matches("POST", r.headers["allow"])
    end)
    it("a bad page is 400", function()
      err_of(s:curl { "/chat/conversations?limit=0" }, 400, "limit")
      err_of(s:curl { "/chat/conversations?offset=-1" }, 400, "offset")
    end)
    it("loses nothing: the server still answers after all of it", function()
      local j = s:post({ message = "still here" }).json
      assert.are.equal("done", s:stream(j.job_id).events[#s:stream(j.job_id).events].event)
    end)
  end)
end)

describe("moongraph serve, Chat API after a restart (embedded)", function()
  it("finishes a job that was mid-answer when the process stopped, continuing its event ids", function()
    local dir = tmp.dir("chatrestart", "file")
    local s1 = chatserve.start { args = GATE, dir = dir }
    local j = s1:post({ message = "survive" }).json
    local first = s1:stream(j.job_id, { until_tokens = 5 })
    s1:stop("KILL")
    local s2 = chatserve.start { args = GATE, dir = dir }
    local ok, err = pcall(function()
      s2:open_gate()
      local rest = s2:stream(j.job_id, { last_id = first.events[#first.events].id })
      assert.is_true(rest.ended)
      assert.are.equal(tonumber(first.events[#first.events].id) + 1, tonumber(rest.events[1].id))
      assert.are.equal("done", rest.events[#rest.events].event)
      assert.are.equal("done", rest.events[#rest.events].json.status)
      -- the nodes run again in the new process say they are a second attempt
      local again = {}
      for _, e in ipairs(rest.events) do
        if e.event == "node_start" then again[#again + 1] = e.json.attempt end
      end
      assert.is_true(#again >= 1)
      for _, a in ipairs(again) do assert.are.equal(2, a) end
      local m = s2:curl({ "/chat/conversations/" .. j.conversation_id }).json.messages
      assert.are.equal("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 ", m[2].content)
    end)
    s2:stop()
    assert(ok, err)
  end)
end)

describe("moongraph serve, API keys and rate limit", function()
  local KEYS = "alice-key-123=alice,bob-key-4567=bob"
  local s
  setup(function()
    s = chatserve.start { args = { "--script", "gate=spec/fixtures/chat_gate.lua", "--rate-limit", "600",
                                   "--rate-burst", "1000" }, env = { MOONGRAPH_API_KEYS = KEYS } }
    s:open_gate()
  end)
  teardown(function() if s then s:stop() end end)

  it("refuses a request without a key, or with a wrong one, with 401", function()
    local r = s:post { message = "hi" }
    assert.are.equal(401, r.status)
    assert.matches("missing API key", r.json.error)
    local w = s:post({ message = "hi" }, { "Authorization: Bearer wrong-key-000" })
    assert.are.equal(401, w.status)
    assert.matches("invalid API key", w.json.error)
  end)

  it("takes the key as Authorization: Bearer and as x-api-key", function()
    assert.are.equal(202, s:post({ message = "hi" }, { "Authorization: Bearer alice-key-123" }).status)
    assert.are.equal(202, s:post({ message = "hi" }, { "x-api-key: alice-key-123" }).status)
  end)

  it("answers another user's conversation and job as unknown (404)", function()
    local a = s:post({ message = "mine" }, { "x-api-key: alice-key-123" }).json
    local bob = { "-H", "x-api-key: bob-key-4567" }
    assert.are.equal(404, s:curl({ bob[1], bob[2], "/chat/conversations/" .. a.conversation_id }).status)
    assert.are.equal(404, s:curl({ bob[1], bob[2], "/chat/messages/" .. a.job_id .. "/stream" }).status)
    assert.are.equal(404, s:curl({ bob[1], bob[2], "-X", "DELETE", "/chat/conversations/" .. a.conversation_id }).status)
    assert.are.equal(404, s:post({ message = "x", conversation_id = a.conversation_id }, { "x-api-key: bob-key-4567" }).status)
    for _, c in ipairs(s:curl({ bob[1], bob[2], "/chat/conversations?limit=100" }).json.items) do
      assert.are_not.equal(a.conversation_id, c.id)
    end
    -- and it is still alice's
    local st = s:stream(a.job_id, { headers = { "x-api-key: alice-key-123" } })
    assert.are.equal("done", st.events[#st.events].event)
  end)

  it("limits each key's requests with 429 and Retry-After", function()
    local r = chatserve.start { args = { "--script", "gate=spec/fixtures/chat_gate.lua", "--rate-limit", "60",
                                         "--rate-burst", "2" }, env = { MOONGRAPH_API_KEYS = KEYS } }
    local ok, err = pcall(function()
      local a = { "-H", "x-api-key: alice-key-123", "/chat/conversations" }
      assert.are.equal(200, r:curl(a).status)
      assert.are.equal(200, r:curl(a).status)
      local third = r:curl(a)
      assert.are.equal(429, third.status)
      assert.matches("rate limit", third.json.error)
      assert.is_true(tonumber(third.headers["retry-after"]) >= 1)
      -- the LangGraph API on the same server shares the key's budget
      local lg = r:curl { "-X", "POST", "-H", "x-api-key: alice-key-123", "/assistants/search", "-d", "{}" }
      assert.are.equal(429, lg.status)
      assert.matches("rate limit", lg.json.detail)
      assert.is_true(tonumber(lg.headers["retry-after"]) >= 1)
      -- another key has its own bucket
      assert.are.equal(200, r:curl({ "-H", "x-api-key: bob-key-4567", "/chat/conversations" }).status)
      assert.are.equal(200, r:curl({ "-X", "POST", "-H", "x-api-key: bob-key-4567", "/assistants/search", "-d", "{}" }).status)
    end)
    r:stop()
    assert(ok, err)
  end)

  it("refuses to listen beyond loopback without keys, and says why", function()
    local res = chatserve.start { args = { "--host", "0.0.0.0" }, expect_fail = true }
    assert.are.equal(2, res.code)
    assert.matches("refusing to listen on 0%.0%.0%.0 without API keys", res.err)
  end)
end)

describe("moongraph serve, the Eco² chat pipeline (default script)", function()
  local s
  setup(function() s = chatserve.start {} end)
  teardown(function() if s then s:stop() end end)

  it("answers the seed's message with three routed nodes in one parallel step", function()
    local j = s:post({ message = "종이 어떻게 버려? 그리고 수거함도 알려줘", user_location = "서울특별시 강남구" }).json
    local st = s:stream(j.job_id)
    local par = {}
    for _, e in ipairs(st.events) do
      if e.event == "node_start" and e.json.task_id:match("^2:") then par[#par + 1] = e.json.node end
    end
    table.sort(par)
    assert.are.same({ "collection_point", "waste_rag", "weather" }, par)
    local ans = st.events[#st.events - 1]
    assert.are.equal("answer", ans.event)
    assert.are.equal("waste", ans.json.intent)
    assert.matches("종이류", ans.json.answer)
    assert.are.equal(ans.json.answer, tokens_of(st.events))
  end)

  it("takes the location in the message's context, which the conversation shows; the earlier top-level field becomes it", function()
    for _, body in ipairs {
      { message = "종이 어떻게 버려? 그리고 수거함도 알려줘", context = { user_location = "서울특별시 강남구" } },
      { message = "종이 어떻게 버려? 그리고 수거함도 알려줘", user_location = "서울특별시 강남구" },
    } do
      local j = s:post(body).json
      local st = s:stream(j.job_id)
      local nodes = {}
      for _, e in ipairs(st.events) do
        if e.event == "node_start" then nodes[e.json.node] = true end
      end
      assert.is_true(nodes.weather)
      local m = s:curl({ "/chat/conversations/" .. j.conversation_id }).json.messages
      assert.are.same({ user_location = "서울특별시 강남구" }, m[1].context)
      assert.is_nil(m[1].user_location)
    end
  end)
end)
