-- Deadlines propagate: a task's time limit (mg.timeout, a node's timeout)
-- bounds every call made inside it — HTTP, the LLM with its retries, Redis,
-- Postgres — and each call gives up early enough for the caller to take its
-- fallback. "Early enough" is checked without timing: the call returns an
-- error to code that is still running, instead of that code being cancelled
-- by the deadline.
local mg = require "moongraph"
local http = require "moongraph.http"
local llm = require "moongraph.llm"
local redis = require "moongraph.redis"
local pg = require "moongraph.pg"
local testserver = require "testserver"
local servers = require "servers"

describe("deadlines", function()
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)
  before_each(function() mg.run(function() srv:reset() end) end)

  describe("mg.deadline", function()
    it("is nil in a task without a time limit", function()
      assert.is_nil(mg.run(function() return mg.deadline() end))
    end)

    it("is set by mg.timeout and inherited by the tasks spawned inside", function()
      local got = mg.run(function()
        local t0 = mg.now()
        local ok, own, child, inner_long, inner_short = mg.timeout(2, function()
          local d = mg.deadline()
          local _, c = mg.spawn(function() return mg.deadline() end):join()
          local _, long = mg.timeout(10, function() return mg.deadline() end)
          local _, short = mg.timeout(0.5, function() return mg.deadline() end)
          return d, c, long, short
        end)
        assert.is_true(ok)
        return { t0 = t0, own = own, child = child, long = inner_long, short = inner_short }
      end)
      assert.is_number(got.own)
      assert.is_true(got.own > got.t0 + 1.5 and got.own <= got.t0 + 2.01)
      assert.are.equal(got.own, got.child)
      assert.are.equal(got.own, got.long)          -- a later limit cannot extend it
      assert.is_true(got.short < got.own)
    end)
  end)

  describe("HTTP", function()
    it("ends a request at the caller's deadline, not at its own timeout", function()
      local ok, res, err = mg.run(function()
        return mg.timeout(1, function()
          return http.get(srv.url .. "/delay?ms=10000", { timeout = 30 })
        end)
      end)
      assert.is_true(ok, "the deadline cancelled the caller instead of failing the call")
      assert.is_nil(res)
      assert.matches("^timeout %(127%.0%.0%.1:%d+, at the caller's deadline%)$", err)
    end)

    it("keeps a request's own timeout when it is the shorter one", function()
      local ok, res, err = mg.run(function()
        return mg.timeout(5, function()
          return http.get(srv.url .. "/delay?ms=10000", { timeout = 0.3 })
        end)
      end)
      assert.is_true(ok)
      assert.is_nil(res)
      assert.matches("^timeout %(127%.0%.0%.1:%d+%)$", err)
    end)
  end)

  describe("the LLM client", function()
    local function hang_all()
      mg.run(function()
        srv:record { path = "/v1/chat/completions", fault = "hang" }
      end)
    end

    it("bounds its attempts and retries by the deadline", function()
      hang_all()
      local ok, res, err = mg.run(function()
        local c = assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m",
          timeout = 10, max_retries = 2 })
        return mg.timeout(1.5, function()
          return c:chat { messages = { { role = "user", content = "hi" } } }
        end)
      end)
      assert.is_true(ok, "the deadline cancelled the caller instead of failing the call")
      assert.is_nil(res)
      assert.matches("at the caller's deadline", err)
    end)
  end)

  describe("Redis", function()
    local rs
    setup(function() rs = servers.redis() end)
    teardown(function() if rs then rs:destroy() end end)

    it("fails a command at the deadline and keeps the connection for others", function()
      local ok, v, err, after = mg.run(function()
        local r = assert(redis.connect(rs.url))
        -- WAIT blocks its connection until a replica acknowledges (none
        -- will) or 1.5 s pass
        local ok, v, err = mg.timeout(0.5, function() return r:call("WAIT", 1, 1500) end)
        return ok, v, err, r:call("PING")
      end)
      assert.is_true(ok, "the deadline cancelled the caller instead of failing the call")
      assert.is_nil(v)
      assert.matches("^redis: timeout after [%d.]+s, at the caller's deadline$", err)
      assert.are.equal("PONG", after)
    end)
  end)

  describe("Postgres", function()
    local ps, url
    setup(function()
      ps = servers.postgres()
      url = ps:create_database("deadline_spec")
    end)
    teardown(function() if ps then ps:destroy() end end)

    it("cancels a statement at the deadline; the pool serves the next one", function()
      local ok, rows, err, after = mg.run(function()
        local pool = assert(pg.pool(url, { size = 1 }))
        local ok, rows, err = mg.timeout(0.5, function()
          return pool:query("SELECT pg_sleep(10)")
        end)
        local again = assert(pool:query("SELECT 41 + 1 AS v"))
        return ok, rows, err, again[1].v
      end)
      assert.is_true(ok, "the deadline cancelled the caller instead of failing the call")
      assert.is_nil(rows)
      assert.matches("^pg: timeout after [%d.]+s, at the caller's deadline$", err)
      assert.are.equal(42, after)
    end)

    it("bounds the wait for a free pooled connection", function()
      local ok, rows, err = mg.run(function()
        local pool = assert(pg.pool(url, { size = 1 }))
        local busy = mg.spawn(function() return pool:query("SELECT pg_sleep(1)") end)
        mg.sleep(0.1)
        local ok, rows, err = mg.timeout(0.3, function() return pool:query("SELECT 1") end)
        busy:join()
        return ok, rows, err
      end)
      assert.is_true(ok)
      assert.is_nil(rows)
      assert.matches("no connection free after [%d.]+s %(pool of 1%), at the caller's deadline", err)
    end)
  end)

  describe("a graph node", function()
    it("takes its own fallback when a call inside runs out of its time", function()
      local state, err = mg.run(function()
        local g = mg.graph()
        g:add_node("fetch", function()
          local res, ferr = http.get(srv.url .. "/delay?ms=10000", { timeout = 60 })
          if not res then return { result = "fallback", why = ferr } end
          return { result = res.body }
        end, { timeout = 1 })
        g:add_edge(mg.START, "fetch")
        return g:compile():invoke({})
      end)
      assert.is_nil(err)
      assert.are.equal("fallback", state.result)
      assert.matches("at the caller's deadline", state.why)
    end)
  end)
end)

-- The chat pipeline against an OpenAI-compatible server that never answers
-- properly: every turn still ends with the documented fallbacks (offline
-- classifier, extractive answer, heuristic feedback) inside the nodes' time
-- limits, never with "node 'x' timed out".
describe("the chat pipeline with a stuck LLM", function()
  local chat = require "scripts.eco.chat"
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)

  local LIMIT = 1.5   -- each LLM-calling node's time limit in these runs

  local function turn(base_url)
    local ok, state, err = pcall(mg.run, function()
      local client = assert(llm.new { base_url = base_url, api_key = "k", model = "m" })
      local app = chat.build { timeouts = { intent = LIMIT, answer = LIMIT, feedback = LIMIT },
        timeout_grace = 0 }
      return app:invoke(chat.input("종이 어떻게 버려?"), chat.config { llm = client })
    end)
    assert.is_true(ok, tostring(state))
    return state, err
  end

  local function check_fallbacks(state, err)
    assert.is_nil(err)
    assert.is_table(state)
    assert.are.equal("offline", state.intent_source)
    assert.are.equal("waste", state.intent)
    assert.is_string(state.answer)
    assert.is_truthy(state.answer:find("[오프라인 답변] LLM 호출에 실패해", 1, true) or
      state.answer:find("응답 생성이 중단되었습니다", 1, true), state.answer)
    assert.are.equal("heuristic", state.quality.method)
    assert.is_string(state.quality.judge_error)
  end

  it("falls back when the server accepts and never replies (hang)", function()
    mg.run(function()
      srv:reset()
      srv:record { path = "/hang/v1/chat/completions", fault = "hang" }
    end)
    check_fallbacks(turn(srv.url .. "/hang/v1"))
  end)

  it("falls back when the reply trickles in slower than the time limit (trickle)", function()
    mg.run(function()
      srv:reset()
      srv:record { path = "/drip/v1/chat/completions", fault = "drip", drip_ms = 1000,
        content = string.rep("느린 답변 ", 40) }
    end)
    check_fallbacks(turn(srv.url .. "/drip/v1"))
  end)

  it("falls back when the connection never completes (stall)", function()
    -- the first connection takes the stall port's only queue slot and is
    -- never served; later ones hang in the handshake
    check_fallbacks(turn(srv.stall_url .. "/v1"))
  end)
end)
