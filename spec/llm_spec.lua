local mg = require "moongraph"
local llm = require "moongraph.llm"
local cjson = require "cjson"
local testserver = require "testserver"

local KEY = "sk-test-SECRET-0123456789"

describe("moongraph.llm", function()
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)
  before_each(function() mg.run(function() srv:reset() end) end)

  local function run(fn) return mg.run(fn) end

  -- A client on a path prefix of the test server; sleeps are recorded
  -- instead of waited, so backoff is checked without timing.
  local function client(opts)
    opts = opts or {}
    local slept = {}
    local o = { base_url = srv.url .. (opts.prefix or "") .. "/v1", api_key = KEY, model = "m1",
                sleep = function(d) slept[#slept + 1] = d end }
    for k, v in pairs(opts) do if k ~= "prefix" then o[k] = v end end
    local c = assert(llm.new(o))
    return c, slept
  end

  local function script(replies)
    run(function() srv:script(replies) end)
  end

  local function requests(prefix)
    return run(function() return srv:requests((prefix or "") .. "/v1/chat/completions") end)
  end

  local function ask(c, extra)
    local p = { messages = { { role = "user", content = "hello there" } } }
    for k, v in pairs(extra or {}) do p[k] = v end
    return run(function() return c:chat(p) end)
  end

  describe("configuration", function()
    insulate("from the environment", function()
      it("takes base_url, api_key and model from MOONGRAPH_LLM_*", function()
        local env = { MOONGRAPH_LLM_BASE_URL = srv.url .. "/v1", MOONGRAPH_LLM_API_KEY = KEY,
                      MOONGRAPH_LLM_MODEL = "env-model" }
        local real = os.getenv
        os.getenv = function(k) return env[k] or real(k) end
        package.loaded["moongraph.llm"] = nil
        local fresh = require "moongraph.llm"
        os.getenv = real
        local c = assert(fresh.new())
        local r = run(function() return c:chat{ messages = { { role = "user", content = "x" } } } end)
        assert.equal("env-model", r.model)
        local req = requests()[1]
        assert.equal("Bearer " .. KEY, req.headers.authorization)
        package.loaded["moongraph.llm"] = nil
      end)
    end)

    insulate("with nothing configured", function()
      it("says what is missing", function()
        local real = os.getenv
        os.getenv = function(k) if k:match("^MOONGRAPH_LLM") then return nil end return real(k) end
        package.loaded["moongraph.llm"] = nil
        local fresh = require "moongraph.llm"
        os.getenv = real
        local c, err = fresh.new()
        assert.is_nil(c)
        assert.matches("MOONGRAPH_LLM_BASE_URL", err)
        local c2, err2 = fresh.new{ base_url = "http://127.0.0.1:1/v1" }
        assert.is_nil(c2)
        assert.matches("MOONGRAPH_LLM_MODEL", err2)
        package.loaded["moongraph.llm"] = nil
      end)
    end)

    it("rejects bad options", function()
      assert.has_error(function() llm.new{ base_url = "ftp://x", model = "m" } end,
        "bad argument #1 to 'new': base_url must start with http:// or https://")
      assert.has_error(function() llm.new{ base_url = "http://x", model = "m", max_retries = -1 } end,
        "bad argument #1 to 'new': max_retries must be an integer >= 0")
      assert.has_error(function() llm.new{ base_url = "http://x", model = "m", retries = 1 } end,
        "bad argument #1 to 'new': unknown option 'retries'")
      local c = client()
      run(function()
        assert.has_error(function() c:chat{ messages = {} } end,
          "bad argument #1 to 'chat': messages must be a non-empty list")
        assert.has_error(function() c:chat{ messages = { { content = "no role" } } } end,
          "bad argument #1 to 'chat': messages[1] needs a role")
        assert.has_error(function() c:chat{ messages = { { role = "user", content = "x" } }, temp = 1 } end,
          "bad argument #1 to 'chat': unknown option 'temp'")
      end)
    end)
  end)

  describe("chat", function()
    it("returns content, usage, model and finish_reason", function()
      script{ content = "Hi! How can I help?", model = "served-model" }
      local r, err = ask(client(), { temperature = 0.2, max_tokens = 50 })
      assert.is_nil(err)
      assert.equal("Hi! How can I help?", r.content)
      assert.equal("served-model", r.model)
      assert.equal("stop", r.finish_reason)
      assert.is_number(r.usage.total_tokens)
      local req = requests()[1]
      local body = cjson.decode(req.body)
      assert.equal("m1", body.model)
      assert.equal(0.2, body.temperature)
      assert.equal(50, body.max_tokens)
      assert.equal("hello there", body.messages[1].content)
      assert.equal("Bearer " .. KEY, req.headers.authorization)
      assert.is_nil(body.stream)
    end)

    it("sends extra headers and lets a call choose another model", function()
      local c = client{ headers = { ["X-Tenant"] = "t1" } }
      local r = ask(c, { model = "other" })
      assert.equal("echo: hello there", r.content)
      local req = requests()[1]
      assert.equal("t1", req.headers["x-tenant"])
      assert.equal("other", cjson.decode(req.body).model)
    end)

    it("streams tokens to the callback as they arrive", function()
      script{ content = "one two three four", hold = "rest" }
      local tokens = {}
      local r = ask(client(), { stream = function(t)
        tokens[#tokens + 1] = t
        -- the server holds the rest of the stream until released, so this
        -- token arrived before the response ended
        if #tokens == 1 then srv:release("rest") end
      end })
      assert.same({ "one ", "two ", "three ", "four" }, tokens)
      assert.equal("one two three four", r.content)
      assert.equal("stop", r.finish_reason)
      assert.is_number(r.usage.total_tokens)
      local body = cjson.decode(requests()[1].body)
      assert.is_true(body.stream)
      assert.is_true(body.stream_options.include_usage)
    end)

    it("streams with CRLF event framing and a slow drip", function()
      script{ content = "a b c", fault = "drip", drip_ms = 5, sse_eol = "\r\n" }
      local tokens = {}
      local r = ask(client(), { stream = function(t) tokens[#tokens + 1] = t end })
      assert.equal("a b c", table.concat(tokens))
      assert.equal("a b c", r.content)
    end)

    it("returns tool calls with decoded arguments, plain and streamed", function()
      local calls = { { id = "call_1", type = "function",
                        ["function"] = { name = "get_weather", arguments = '{"city":"Seoul"}' } } }
      local tools = { { name = "get_weather", description = "weather",
                        parameters = { type = "object", properties = { city = { type = "string" } } } } }
      script{ { content = cjson.null, tool_calls = calls }, { content = cjson.null, tool_calls = calls } }
      local c = client()
      local plain = ask(c, { tools = tools })
      local streamed = ask(c, { tools = tools, stream = function() end })
      for _, r in ipairs{ plain, streamed } do
        assert.equal("tool_calls", r.finish_reason)
        assert.equal("get_weather", r.tool_calls[1].name)
        assert.equal("call_1", r.tool_calls[1].id)
        assert.same({ city = "Seoul" }, r.tool_calls[1].args)
        assert.equal('{"city":"Seoul"}', r.tool_calls[1]["function"].arguments)
      end
      local body = cjson.decode(requests()[1].body)
      assert.equal("function", body.tools[1].type)
      assert.equal("get_weather", body.tools[1]["function"].name)
    end)
  end)

  describe("structured output", function()
    local schema = {
      type = "object", required = { "intent", "confidence" },
      properties = {
        intent = { type = "string", enum = { "waste", "character", "general" } },
        confidence = { type = "number" },
        tags = { type = "array", items = { type = "string" } },
      },
    }

    it("sends the schema and returns the decoded reply", function()
      script{ content = '{"intent":"waste","confidence":0.9}' }
      local r, err = ask(client(), { json_schema = schema })
      assert.is_nil(err)
      assert.same({ intent = "waste", confidence = 0.9 }, r.json)
      local body = cjson.decode(requests()[1].body)
      assert.equal("json_schema", body.response_format.type)
      assert.equal("response", body.response_format.json_schema.name)
      assert.equal("object", body.response_format.json_schema.schema.type)
    end)

    it("accepts a reply wrapped in a code fence", function()
      script{ content = '```json\n{"intent":"general","confidence":1}\n```' }
      local r = ask(client(), { json_schema = schema })
      assert.equal("general", r.json.intent)
    end)

    it("sends an invalid reply back once with the validation error", function()
      script{ { content = '{"intent":"shopping","confidence":0.5}' },
              { content = '{"intent":"general","confidence":0.5}' } }
      local r, err = ask(client(), { json_schema = schema })
      assert.is_nil(err)
      assert.equal("general", r.json.intent)
      assert.is_true(r.repaired)
      local reqs = requests()
      assert.equal(2, #reqs)
      local msgs = cjson.decode(reqs[2].body).messages
      assert.equal("assistant", msgs[2].role)
      assert.equal('{"intent":"shopping","confidence":0.5}', msgs[2].content)
      assert.matches('%$%.intent: "shopping" is not one of', msgs[3].content)
    end)

    it("fails clearly when the repaired reply is still wrong", function()
      script{ { content = "not json at all" }, { content = '{"intent":"waste"}' } }
      local r, err = ask(client(), { json_schema = schema })
      assert.is_nil(r)
      assert.matches("does not match the JSON schema after one repair", err)
      assert.matches('missing required property "confidence"', err)
      assert.equal(2, #requests())
    end)

    it("validates types, required, enum, items and nesting", function()
      local v = llm.validate
      assert.is_nil(v(schema, { intent = "waste", confidence = 1, tags = { "a" } }))
      assert.matches("%$%.confidence: expected number, got string",
        v(schema, { intent = "waste", confidence = "high" }))
      assert.matches("%$%.tags%[1%]: expected string, got integer",
        v(schema, { intent = "waste", confidence = 1, tags = { "a", 2 } }))
      assert.matches('%$: missing required property "intent"', v(schema, { confidence = 1 }))
      assert.matches("expected object, got array", v(schema, { 1, 2 }))
      assert.matches("expected integer", v({ type = "integer" }, 1.5))
      assert.is_nil(v({ type = { "string", "null" } }, cjson.null))
      assert.matches('unexpected property "x"',
        v({ type = "object", properties = {}, additionalProperties = false }, { x = 1 }))
    end)
  end)

  describe("retries", function()
    it("retries 5xx with growing, jittered backoff, then succeeds", function()
      script{ { status = 500 }, { status = 502 }, { content = "finally" } }
      local c, slept = client{ max_retries = 2, initial_delay = 0.5, max_delay = 8 }
      local r, err = ask(c)
      assert.is_nil(err)
      assert.equal("finally", r.content)
      assert.equal(3, #requests())
      assert.equal(2, #slept)
      assert.is_true(slept[1] >= 0.25 and slept[1] <= 0.5)
      assert.is_true(slept[2] >= 0.5 and slept[2] <= 1.0)
    end)

    it("caps the backoff at max_delay", function()
      script{ { status = 503 }, { status = 503 }, { status = 503 }, { content = "ok" } }
      local c, slept = client{ max_retries = 3, initial_delay = 4, max_delay = 5, jitter = false }
      assert(ask(c))
      assert.same({ 4, 5, 5 }, slept)
    end)

    it("honours Retry-After in seconds on 429", function()
      script{ { status = 429, retry_after = "7" }, { content = "ok" } }
      local c, slept = client()
      local r = ask(c)
      assert.equal("ok", r.content)
      assert.same({ 7 }, slept)
    end)

    it("honours Retry-After as an HTTP date", function()
      local when = os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 30)
      script{ { status = 429, headers = { ["Retry-After"] = when } }, { content = "ok" } }
      local c, slept = client()
      assert(ask(c))
      assert.is_true(slept[1] >= 28 and slept[1] <= 31)
    end)

    it("fails at once when Retry-After exceeds max_retry_after", function()
      script{ { status = 429, retry_after = "3600" }, { content = "ok" } }
      local c, slept = client()
      local r, err = ask(c)
      assert.is_nil(r)
      assert.matches("HTTP 429", err)
      assert.matches("retry after 3600 s", err)
      assert.equal(0, #slept)
      assert.equal(1, #requests())
    end)

    it("never retries other 4xx", function()
      for _, status in ipairs{ 400, 401, 403, 404, 422 } do
        run(function() srv:reset() end)
        script{ { status = status }, { content = "not reached" } }
        local c, slept = client()
        local r, err = ask(c)
        assert.is_nil(r)
        assert.matches("HTTP " .. status, err)
        assert.equal(0, #slept)
        assert.equal(1, #requests())
      end
    end)

    it("gives up after max_retries and says so", function()
      script{ { status = 503, times = 0 } }
      local c, slept = client{ max_retries = 2 }
      local r, err = ask(c)
      assert.is_nil(r)
      assert.matches("HTTP 503", err)
      assert.matches("after 3 attempts", err)
      assert.equal(3, #requests())
      assert.equal(2, #slept)
    end)

    it("retries timeouts", function()
      script{ { content = "late", delay_ms = 3000 }, { content = "on time" } }
      local c = client{ timeout = 0.3 }
      local r, err = ask(c)
      assert.is_nil(err)
      assert.equal("on time", r.content)
    end)

    it("retries dropped connections", function()
      script{ { fault = "reset", times = 2 }, { content = "ok" } }
      local r, err = ask(client())
      assert.is_nil(err)
      assert.equal("ok", r.content)
    end)

    it("does not retry a malformed reply", function()
      script{ { content = "x", fault = "malformed" }, { content = "not reached" } }
      local r, err = ask(client())
      assert.is_nil(r)
      assert.matches("malformed JSON in the reply", err)
      assert.equal(1, #requests())
    end)

    it("fails a malformed stream chunk", function()
      script{ { content = "a b c", fault = "malformed" } }
      local r, err = ask(client(), { stream = function() end })
      assert.is_nil(r)
      assert.matches("malformed JSON in the stream", err)
    end)

    it("does not retry once tokens were streamed", function()
      script{ { content = "partial reply here", fault = "truncate" }, { content = "not reached" } }
      local tokens = {}
      local c, slept = client()
      local r, err = ask(c, { stream = function(t) tokens[#tokens + 1] = t end })
      assert.is_nil(r)
      assert.matches("truncated response", err)
      assert.same({ "partial " }, tokens)
      assert.equal(0, #slept)
      assert.equal(1, #requests())
    end)

    it("retries a streamed request that failed before any token", function()
      script{ { status = 500 }, { content = "fine" } }
      local tokens = {}
      local r = ask(client(), { stream = function(t) tokens[#tokens + 1] = t end })
      assert.equal("fine", r.content)
      assert.same({ "fine" }, tokens)
    end)

    it("bounds the reply size with max_body", function()
      script{ { content = "", fault = "oversize", oversize_bytes = 2000000 } }
      local r, err = ask(client{ max_body = 1000000 })
      assert.is_nil(r)
      assert.matches("body exceeds max_body", err)
    end)
  end)

  describe("API keys", function()
    it("never appear in errors, logs or the client's printout", function()
      script{ { status = 500, json = { error = { message = "upstream saw key " .. KEY } } },
              { status = 401, json = { error = { message = "Incorrect API key provided: " .. KEY } } } }
      local lines = {}
      local c = client{ log = function(line) lines[#lines + 1] = line end }
      local r, err = ask(c)
      assert.is_nil(r)
      assert.matches("HTTP 401", err)
      assert.matches("%[redacted%]", err)
      assert.not_matches(KEY, err, 1, true)
      assert.is_true(#lines >= 1)
      for _, line in ipairs(lines) do assert.is_nil(line:find(KEY, 1, true)) end
      assert.is_nil(tostring(c):find(KEY, 1, true))
      assert.is_nil(require("moongraph.pretty").format(c):find(KEY, 1, true))
      -- no string anywhere in the client's tables holds it
      local strings = 0
      local function walk(t, path, seen)
        if seen[t] then return end
        seen[t] = true
        for k, v in pairs(t) do
          if type(v) == "string" then
            strings = strings + 1
            assert.is_nil(v:find(KEY, 1, true), path .. "." .. tostring(k))
          elseif type(v) == "table" then
            walk(v, path .. "." .. tostring(k), seen)
          end
        end
      end
      walk(c, "client", {})
      assert.is_true(strings > 0)
    end)

    it("are not in network errors either", function()
      local c = assert(llm.new{ base_url = "http://127.0.0.1:1/v1", api_key = KEY, model = "m",
                                max_retries = 0 })
      local r, err = run(function() return c:chat{ messages = { { role = "user", content = "x" } } } end)
      assert.is_nil(r)
      assert.matches("connection refused to 127.0.0.1:1", err)
      assert.is_nil(err:find(KEY, 1, true))
    end)
  end)

  describe("routed", function()
    local function pair(router)
      local a = client{ prefix = "/a", max_retries = 0, name = "primary" }
      local b = client{ prefix = "/b", max_retries = 0, name = "fallback" }
      return llm.routed{ models = { primary = a, fallback = b }, router = router,
                         order = { "primary", "fallback" } }
    end

    it("fails over to the next model before the first token", function()
      script{ { path = "/a/v1/chat/completions", status = 500 },
              { path = "/b/v1/chat/completions", content = "from fallback" } }
      local calls, n = {}, 0
      local r, err = ask(pair(function(models, params, ectx)
        n = n + 1
        calls[n] = ectx or false
        if not ectx then return "primary" end
        if ectx.failed_keys.primary then return "fallback" end
      end))
      assert.is_nil(err)
      assert.equal("from fallback", r.content)
      assert.equal("fallback", r.route)
      assert.equal(2, n)
      assert.is_false(calls[1])
      assert.is_true(calls[2].failed_keys.primary)
      assert.matches("HTTP 500", calls[2].last_error)
    end)

    it("tries models in order without a router", function()
      script{ { path = "/a/v1/chat/completions", fault = "reset", times = 0 },
              { path = "/b/v1/chat/completions", content = "b answers" } }
      local a = client{ prefix = "/a", max_retries = 0, name = "a" }
      local b = client{ prefix = "/b", max_retries = 0, name = "b" }
      local r = ask(llm.routed{ models = { a, b } })
      assert.equal("b answers", r.content)
      assert.equal("b", r.route)
    end)

    it("does not fail over after a token was streamed", function()
      script{ { path = "/a/v1/chat/completions", content = "half of it", fault = "truncate" },
              { path = "/b/v1/chat/completions", content = "not reached" } }
      local tokens = {}
      local r, err = ask(pair(), { stream = function(t) tokens[#tokens + 1] = t end })
      assert.is_nil(r)
      assert.matches("truncated response", err)
      assert.same({ "half " }, tokens)
      assert.equal(0, #requests("/b"))
    end)

    it("streams through the chosen model after a failover", function()
      script{ { path = "/a/v1/chat/completions", status = 503 },
              { path = "/b/v1/chat/completions", content = "x y" } }
      local tokens = {}
      local r = ask(pair(), { stream = function(t) tokens[#tokens + 1] = t end })
      assert.equal("x y", r.content)
      assert.same({ "x ", "y" }, tokens)
    end)

    it("ends with the last error when the router picks a failed key again", function()
      script{ { path = "/a/v1/chat/completions", status = 500, times = 0 } }
      local n = 0
      local r, err = ask(pair(function() n = n + 1 return "primary" end))
      assert.is_nil(r)
      assert.matches("HTTP 500", err)
      assert.equal(2, n)
      assert.equal(1, #requests("/a"))
    end)

    it("ends with the last error when the router returns nil", function()
      script{ { path = "/a/v1/chat/completions", status = 500 } }
      local r, err = ask(pair(function(_, _, ectx) if not ectx then return "primary" end end))
      assert.is_nil(r)
      assert.matches("HTTP 500", err)
      assert.equal(0, #requests("/b"))
    end)

    it("lets the router choose from the request and yield", function()
      local routed = pair(function(models, params)
        mg.sleep(0)
        return params.messages[1].content:find("hard") and "fallback" or "primary"
      end)
      local r = run(function()
        return routed:chat{ messages = { { role = "user", content = "a hard question" } } }
      end)
      assert.equal("fallback", r.route)
      assert.equal(1, #requests("/b"))
    end)

    it("raises for an unknown key and bad models", function()
      local routed = pair(function() return "nope" end)
      local ok, err = pcall(ask, routed)
      assert.is_false(ok)
      assert.matches("^the router returned 'nope', which is not one of its candidates %(fallback, primary%)\n", err)
      assert.has_error(function() llm.routed{ models = {} } end, "bad argument: models is empty")
      assert.has_error(function() llm.routed{ models = { x = {} }, order = { "x" } } end,
        "bad argument #1 to 'routed': models['x'] is not an llm client")
      local a = client{ name = "a" }
      assert.has_error(function() llm.routed{ models = { a = a } } end,
        "bad argument #1 to 'routed': models given as a map need a router or an order")
    end)
  end)
end)
