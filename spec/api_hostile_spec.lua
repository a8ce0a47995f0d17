-- Hostile input against `moongraph serve`, on both backends: hundreds of
-- requests with non-finite, huge, negative, fractional and wrongly typed
-- values on every route that pages or limits, text no store takes, then a
-- burst of all of them at once (spec/support/hostile.lua). Every request
-- is answered below 500 within 2 s and /ok within 0.5 s throughout.
local mg = require "moongraph"
local http = require "moongraph.http"
local cjson = require "cjson"
local lgserve = require "lgserve"
local wenv = require "worker_env"
local hostile = require "hostile"

-- a thread with one finished run, for the routes that need their ids
local function seed(url)
  return mg.run(function()
    local tid = "hostile-thread"
    local t = assert(http.request { method = "POST", url = url .. "/threads",
      json = { thread_id = tid }, timeout = 10 })
    assert(t.status == 200, t.body)
    local r = assert(http.request { method = "POST", url = url .. "/threads/" .. tid .. "/runs/wait",
      json = { assistant_id = "agent", input = { messages = { { role = "user", content = "hi" } } } },
      timeout = 30 })
    assert(r.status == 200, r.body)
    local run_id = r.headers["content-location"]:match("/runs/([^/]+)$")
    return { thread_id = tid, run_id = run_id }
  end)
end

local function sweep(s)
  local ids = seed(s.url)
  local report = mg.run(function() return hostile.sweep(s.url, ids) end)
  hostile.check(report)
  return report
end

-- what each finding answered, by name
local function answer(s, method, path, body)
  return mg.run(function()
    local res = assert(http.request { method = method, url = s.url .. path, body = body,
      headers = { ["Content-Type"] = "application/json" }, timeout = 10 })
    return { status = res.status, json = cjson.decode(res.body), headers = res.headers }
  end)
end

local function findings(s)
  -- the paging that put the loop in an endless loop
  local r = answer(s, "POST", "/assistants/search", '{"offset": -1e300}')
  assert.equal(422, r.status)
  assert.matches("^offset must be a whole number from 0 to 2147483647, got %-1e%+300", r.json.detail)
  r = answer(s, "POST", "/assistants/search", '{"limit": 1e999, "offset": -1e999}')
  assert.equal(422, r.status)
  assert.matches("^%a+ must be a finite number", r.json.detail)
  -- client mistakes are 4xx naming the field, never 500 or 503
  r = answer(s, "POST", "/threads/search", '{"limit": 5, "offset": 0.5}')
  assert.equal(422, r.status)
  assert.matches("^offset must be a whole number from 0 to 2147483647, got 0.5", r.json.detail)
  r = answer(s, "POST", "/threads/hostile-thread/history", '{"limit": -1}')
  assert.equal(422, r.status)
  assert.matches("^limit must be a whole number from 1 to 1000, got %-1", r.json.detail)
  r = answer(s, "GET", "/chat/conversations?offset=9223372036854775807")
  assert.equal(400, r.status)
  assert.matches("offset must be a whole number from 0 to 2147483647", r.json.error)
  for _, v in ipairs { "1e999", "1e308" } do
    r = answer(s, "POST", "/threads/search", '{"limit": ' .. v .. '}')
    assert.equal(422, r.status)
    assert.matches("^limit must be a ", r.json.detail)
  end
  r = answer(s, "POST", "/threads", '{"metadata": {"k": "\\u0000"}}')
  assert.equal(422, r.status)
  assert.equal("metadata.k must not contain U+0000", r.json.detail)
  r = answer(s, "POST", "/threads", '{"metadata": {"k": "\255"}}')
  assert.equal(422, r.status)
  assert.equal("metadata.k must be valid UTF-8", r.json.detail)
  r = answer(s, "POST", "/chat/messages", '{"message": "a\\u0000b"}')
  assert.equal(400, r.status)
  assert.equal("message must not contain U+0000", r.json.error)
  -- a raw NUL or tab inside a JSON string is no JSON (RFC 8259)
  r = answer(s, "POST", "/threads", '{"metadata": {"k": "a\0b"}}')
  assert.equal(400, r.status)
  assert.matches("control character in string", r.json.detail)
  -- every answer carries its request id; the client's own is kept
  r = mg.run(function()
    return assert(http.request { method = "POST", url = s.url .. "/threads/search", body = '{"limit": -3}',
      headers = { ["X-Request-Id"] = "client-chose-this-1" }, timeout = 10 })
  end)
  assert.equal("client-chose-this-1", r.headers["x-request-id"])
  assert.equal("client-chose-this-1", cjson.decode(r.body).request_id)
end

describe("hostile input, embedded backend", function()
  local s
  setup(function() s = lgserve.start() end)
  teardown(function() if s then s:stop() end end)

  it("answers each finding's request with a 4xx naming the field", function()
    findings(s)
  end)

  it("answers every hostile request below 500 within 2 s, /ok within 0.5 s throughout", function()
    local report = sweep(s)
    assert.is_true(#report.requests >= 500, #report.requests .. " requests")
    assert.is_true(s:alive())
  end)
end)

describe("hostile input, distributed backend (serve --redis --pg + a worker)", function()
  local env, s
  setup(function()
    env = wenv.new()
    local w = env:worker { "--script", "agent=spec/fixtures/lgapi_agent.lua", "--concurrency", "8" }
    mg.run(function() w:wait_started() end)
    s = lgserve.start { args = { "--redis", env.redis_url, "--pg", env.pg_url, "--checkpoint", env.checkpoint } }
  end)
  teardown(function()
    if s then s:stop() end
    if env then env:destroy() end
  end)

  it("answers each finding's request with a 4xx naming the field, never a Postgres error", function()
    findings(s)
  end)

  it("answers 503 with the request id while Postgres is down: the detail is in the log, not the answer", function()
    env.pg:stop("fast")
    local ok, err = pcall(function()
      local r = s:curl { "-X", "POST", "/threads", "-H", "Content-Type: application/json", "-d", "{}" }
      assert.equal(503, r.status)
      assert.same({ detail = "the service is unavailable: retry later", request_id = r.headers["x-request-id"] },
        r.json)
      assert.is_truthy(s:stderr():find("[" .. r.json.request_id .. "] POST /threads: 503: the thread could not be stored: ",
        1, true))
    end)
    env.pg:start()
    assert(ok, err)
    mg.run(function()
      wenv.eventually("serve to reach Postgres again", 30, function()
        local r = http.request { method = "POST", url = s.url .. "/threads", json = {}, timeout = 5 }
        return r and r.status == 200
      end)
    end)
  end)

  it("answers every hostile request below 500 within 2 s, /ok within 0.5 s throughout", function()
    local report = sweep(s)
    assert.is_true(#report.requests >= 500, #report.requests .. " requests")
    for _, r in ipairs(report.requests) do
      assert.is_nil(r.body:find("pg:", 1, true), r.route)
      assert.is_nil(r.body:find("ERROR:", 1, true), r.route)
    end
  end)
end)
