-- The Chat API on the distributed backend: `moongraph serve --redis --pg`
-- in front of a `moongraph worker`, against real Redis and PostgreSQL. The
-- same contract as spec/api_chat_spec.lua (embedded): accepted before 202,
-- SSE events resumable with Last-Event-ID, conversations per user, delete.
local mg = require "moongraph"
local http = require "moongraph.http"
local cjson = require "cjson"
local wenv = require "worker_env"

local CHAT = "chat=scripts/eco/chat.lua"
local KEYS = "key-alice-1=alice,key-bob-22=bob"

local env, worker, serve, base

local function call(method, path, opts)
  opts = opts or {}
  local headers = { Authorization = "Bearer " .. (opts.key or "key-alice-1") }
  if opts.body then headers["Content-Type"] = "application/json" end
  for k, v in pairs(opts.headers or {}) do headers[k] = v end
  local res = assert(http.request { method = method, url = base .. path, headers = headers,
    body = opts.body and (type(opts.body) == "string" and opts.body or cjson.encode(opts.body)), timeout = 30 })
  local ok, j = pcall(cjson.decode, res.body)
  res.json = ok and j or nil
  return res
end

-- The SSE events of a stream: {id, event, data (decoded)} until done, or
-- until `stop_after` events when given.
local function stream(path, opts)
  opts = opts or {}
  local headers = { Authorization = "Bearer " .. (opts.key or "key-alice-1"), Accept = "text/event-stream" }
  if opts.last_id then headers["Last-Event-ID"] = opts.last_id end
  local evs, buf = {}, ""
  local res, err = http.request { url = base .. path, headers = headers, timeout = 60,
    on_data = function(chunk)
      buf = buf .. chunk
      while true do
        local block, rest = buf:match("^(.-)\n\n(.*)$")
        if not block then break end
        buf = rest
        local e = {}
        for line in block:gmatch("[^\n]+") do
          local k, v = line:match("^(%a+): ?(.*)$")
          if k == "id" then e.id = v elseif k == "event" then e.event = v
          elseif k == "data" then e.data = cjson.decode(v) end
        end
        if e.event then
          evs[#evs + 1] = e
          if e.event == "done" or (opts.stop_after and #evs >= opts.stop_after) then return false end
        end
      end
    end }
  assert(res or #evs > 0, tostring(err))
  return evs, res
end

local function types(evs)
  local out = {}
  for i, e in ipairs(evs) do out[i] = e.event end
  return out
end

describe("Chat API, distributed backend (serve --redis --pg + worker)", function()
  setup(function()
    env = wenv.new()
    worker = env:worker { "--script", CHAT, "--concurrency", "4" }
    serve = env:spawn({ "serve", "--port", "0", "--rate-limit", "0", "--script", CHAT,
                        "--redis", env.redis_url, "--pg", env.pg_url }, { MOONGRAPH_API_KEYS = KEYS })
    mg.run(function()
      worker:wait_started()
      local ok, url = pcall(wenv.eventually, "serve to listen", 20, function()
        assert(serve:running(), "serve exited")
        return serve:output():match("listening on (%S+)")
      end)
      assert(ok, tostring(url) .. "\n" .. serve:log())
      base = url
    end)
  end)
  teardown(function() if env then env:destroy() end end)

  it("accepts a message, streams the worker's events to done, and keeps the conversation", function()
    mg.run(function()
      local r = call("POST", "/chat/messages", { body = { message = "종이 어떻게 버려? 그리고 수거함도 알려줘",
                                                          user_location = "서울특별시 강남구" } })
      assert.equal(202, r.status, r.body)
      local job, conv = r.json.job_id, r.json.conversation_id
      assert.equal("/chat/messages/" .. job .. "/stream", r.json.stream_url)
      -- accepted means stored: the row is there before any worker answered
      local _, db = env:conns()
      local rows = assert(db:query("SELECT conversation_id FROM chat_messages WHERE job_id = $1", { job }))
      assert.equal(conv, rows[1].conversation_id)

      local evs = stream(r.json.stream_url)
      local ts = types(evs)
      assert.equal("done", ts[#ts])
      assert.equal("done", evs[#evs].data.status)
      local started = {}
      for _, e in ipairs(evs) do
        assert.matches("^%d+%-%d+$", e.id)
        if e.event == "node_start" then started[e.data.node] = true end
      end
      assert.is_true(started.intent and started.waste_rag and started.collection_point and started.weather, cjson.encode(ts))

      -- a second turn in the same conversation, then the conversation
      local r2 = call("POST", "/chat/messages", { body = { message = "근처 수거함은?", conversation_id = conv } })
      assert.equal(202, r2.status, r2.body)
      assert.equal(conv, r2.json.conversation_id)
      stream(r2.json.stream_url)
      local c = call("GET", "/chat/conversations/" .. conv)
      assert.equal(200, c.status, c.body)
      local m = c.json.messages
      assert.equal(4, #m)
      assert.same({ "user", "assistant", "user", "assistant" }, { m[1].role, m[2].role, m[3].role, m[4].role })
      assert.equal("종이 어떻게 버려? 그리고 수거함도 알려줘", m[1].content)
      assert.equal("done", m[2].status)
      assert.is_string(m[2].content)
      assert.truthy(#m[2].content > 0)
      -- the answer event carried the same text the conversation keeps
      local answer
      for _, e in ipairs(evs) do if e.event == "answer" then answer = e.data.answer or e.data.text end end
      if answer then assert.equal(m[2].content, answer) end
      local list = call("GET", "/chat/conversations")
      assert.equal(200, list.status)
      assert.equal(conv, list.json.items[1].id)
      assert.equal(4, list.json.items[1].messages)
      assert.equal("종이 어떻게 버려? 그리고 수거함도 알려줘", list.json.items[1].title)
      assert.is_string(list.json.items[1].last_message)
    end)
  end)

  it("resumes a stream after Last-Event-ID: every event once, in order", function()
    mg.run(function()
      local r = call("POST", "/chat/messages", { body = { message = "페트병은 어떻게 버려?" } })
      assert.equal(202, r.status, r.body)
      local all = stream(r.json.stream_url)
      local part = stream(r.json.stream_url, { stop_after = 3 })
      local rest = stream(r.json.stream_url, { last_id = part[3].id })
      local joined = { part[1].id, part[2].id, part[3].id }
      for _, e in ipairs(rest) do joined[#joined + 1] = e.id end
      local want = {}
      for i, e in ipairs(all) do want[i] = e.id end
      assert.same(want, joined)
      local bad = call("GET", r.json.stream_url, { headers = { ["Last-Event-ID"] = "seven" } })
      assert.equal(400, bad.status)
    end)
  end)

  it("shows a user only their own conversations and jobs, and deletes one for good", function()
    mg.run(function()
      local r = call("POST", "/chat/messages", { body = { message = "유리병 분리수거 방법" } })
      assert.equal(202, r.status, r.body)
      stream(r.json.stream_url)
      local conv = r.json.conversation_id
      assert.equal(404, call("GET", "/chat/conversations/" .. conv, { key = "key-bob-22" }).status)
      assert.equal(404, call("GET", r.json.stream_url, { key = "key-bob-22" }).status)
      assert.equal(404, call("POST", "/chat/messages", { key = "key-bob-22",
        body = { message = "x", conversation_id = conv } }).status)
      for _, item in ipairs(call("GET", "/chat/conversations", { key = "key-bob-22" }).json.items) do
        assert.are_not.equal(conv, item.id)
      end
      local _, db = env:conns()
      assert.equal(1, #assert(db:query("SELECT 1 FROM conversations WHERE thread_id = $1", { conv })))
      assert.equal(204, call("DELETE", "/chat/conversations/" .. conv).status)
      assert.equal(404, call("GET", "/chat/conversations/" .. conv).status)
      assert.equal(404, call("DELETE", "/chat/conversations/" .. conv).status)
      -- its rows, the worker's results and the Eco² memory are gone
      assert.equal(0, #assert(db:query("SELECT 1 FROM chat_messages WHERE conversation_id = $1", { conv })))
      assert.equal(0, #assert(db:query("SELECT 1 FROM job_results WHERE thread_id = $1", { conv })))
      assert.equal(0, #assert(db:query("SELECT 1 FROM conversations WHERE thread_id = $1", { conv })))
      assert.equal(0, #assert(db:query("SELECT 1 FROM messages WHERE thread_id = $1", { conv })))
    end)
  end)

  it("ends the stream of a finished job whose events have expired, pointing at the conversation", function()
    mg.run(function()
      local r = call("POST", "/chat/messages", { body = { message = "캔은 어떻게 버려?" } })
      assert.equal(202, r.status, r.body)
      stream(r.json.stream_url)
      local redis, db = env:conns()
      assert.equal(1, redis:call("DEL", "moongraph:events:" .. r.json.job_id))
      assert(db:query("UPDATE job_results SET created_at = now() - interval '1 hour' WHERE job_id = $1",
        { r.json.job_id }))
      local evs = stream(r.json.stream_url)
      assert.equal(1, #evs)
      assert.equal("error", evs[1].event)
      assert.matches("expired; the answer is in the conversation", evs[1].data.error, 1, true)
      assert.matches(r.json.conversation_id, evs[1].data.error, 1, true)
    end)
  end)

  it("waits for the events of a job whose result was stored a moment ago, before they are written", function()
    mg.run(function()
      local r = call("POST", "/chat/messages", { body = { message = "우유팩은 어디에 버려?" } })
      assert.equal(202, r.status, r.body)
      stream(r.json.stream_url)
      local redis = env:conns()
      -- as a worker that stored the result and has not written its events yet
      local key = "moongraph:events:" .. r.json.job_id
      assert.equal(1, redis:call("DEL", key))
      mg.spawn(function()
        mg.sleep(0.5)
        assert(redis:call("XADD", key, "*", "type", "done", "data", '{"status":"done"}'))
      end)
      local evs = stream(r.json.stream_url)
      assert.same({ "done" }, types(evs))
      assert.equal("done", evs[1].data.status)
    end)
  end)

  it("answers bad input with JSON errors", function()
    mg.run(function()
      assert.equal(400, call("POST", "/chat/messages", { body = "{not json" }).status)
      assert.equal(400, call("POST", "/chat/messages", { body = {} }).status)
      assert.equal(404, call("POST", "/chat/messages",
        { body = { message = "hi", conversation_id = "c-nope" } }).status)
      assert.equal(400, call("POST", "/chat/messages", { body = { message = "hi", script = "nope" } }).status)
      assert.equal(404, call("GET", "/chat/messages/j-nope/stream").status)
      assert.equal(401, call("GET", "/chat/conversations", { key = "wrong" }).status)
    end)
  end)

  it("limits each key's requests with 429 and Retry-After, across both APIs", function()
    local limited = env:spawn({ "serve", "--port", "0", "--rate-limit", "60", "--rate-burst", "2", "--script", CHAT,
                                "--redis", env.redis_url, "--pg", env.pg_url }, { MOONGRAPH_API_KEYS = KEYS })
    mg.run(function()
      local saved = base
      local ok, err = pcall(function()
        base = wenv.eventually("the limited serve to listen", 20, function()
          assert(limited:running(), "serve exited")
          return limited:output():match("listening on (%S+)")
        end)
        assert.equal(200, call("GET", "/chat/conversations").status)
        assert.equal(200, call("GET", "/chat/conversations").status)
        local third = call("GET", "/chat/conversations")
        assert.equal(429, third.status)
        assert.matches("rate limit", third.json.error)
        assert.is_true(tonumber(third.headers["retry-after"]) >= 1)
        -- the LangGraph API on the same server shares the key's budget
        assert.equal(429, call("POST", "/assistants/search", { body = {} }).status)
        -- another key has its own
        assert.equal(200, call("GET", "/chat/conversations", { key = "key-bob-22" }).status)
      end)
      base = saved
      limited:signal("TERM")
      limited:wait(10)
      assert(ok, err)
    end)
  end)

  it("refuses to listen beyond loopback without keys, and says why", function()
    local p = env:spawn({ "serve", "--host", "0.0.0.0", "--port", "0", "--script", CHAT,
                          "--redis", env.redis_url, "--pg", env.pg_url })
    mg.run(function()
      assert.equal(2, p:wait(10))
      assert.matches("refusing to listen on 0%.0%.0%.0 without API keys", p:log())
    end)
  end)

  it("needs both --redis and --pg", function()
    local p = env:spawn({ "serve", "--port", "0", "--redis", env.redis_url })
    mg.run(function()
      assert.equal(2, p:wait(10))
      assert.matches("%-%-redis and %-%-pg go together", p:log())
    end)
  end)
end)
