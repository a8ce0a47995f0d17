local mg = require "moongraph"
local G = require "moongraph.graph"
local retry = require "moongraph.engine.retry"
local START = G.START
local R = G.reducers

local function run(fn) return mg.run(fn) end

describe("node policies", function()
  it("retry re-runs a failing node until it succeeds, counting attempts", function()
    local attempts = {}
    local g = G.new()
    g:add_node("flaky", function(_, ctx)
      attempts[#attempts + 1] = ctx.attempt
      if ctx.attempt < 3 then error("503 from upstream") end
      return { ok = true }
    end, { retry = { max_attempts = 4, initial_interval = 0.001, jitter = false } })
    g:add_edge(START, "flaky")
    local out = run(function() return g:compile():invoke {} end)
    assert.is_true(out.ok)
    assert.same({ 1, 2, 3 }, attempts)
  end)

  it("retry gives up after max_attempts and the failure propagates", function()
    local calls = 0
    local g = G.new()
    g:add_node("down", function() calls = calls + 1; error("still down") end,
      { retry = { max_attempts = 3, initial_interval = 0.001 } })
    g:add_edge(START, "down")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.equal(3, calls)
    assert.matches("node 'down' failed: .*still down", err)
  end)

  it("retry_on decides which errors are retried", function()
    local calls = { auth = 0, busy = 0 }
    local retry = { max_attempts = 5, initial_interval = 0.001,
      retry_on = function(e) return not tostring(e):find("401", 1, true) end }
    local function failing(name, msg)
      local g = G.new()
      g:add_node(name, function() calls[name] = calls[name] + 1; error(msg) end, { retry = retry })
      g:add_edge(START, name)
      return run(function() return g:compile():invoke {} end)
    end
    local out, err = failing("auth", "401 unauthorized")
    assert.is_nil(out)
    assert.matches("401 unauthorized", err, 1, true)
    assert.equal(1, calls.auth)
    -- an error retry_on accepts is retried up to max_attempts
    out, err = failing("busy", "503 busy")
    assert.is_nil(out)
    assert.matches("503 busy", err, 1, true)
    assert.equal(5, calls.busy)
  end)

  it("backoff grows by backoff_factor up to max_interval; jitter stays within half to 1.5 times", function()
    local r = { initial_interval = 0.5, backoff_factor = 2, max_interval = 3, jitter = false }
    assert.same({ 0.5, 1, 2, 3, 3 }, { retry.backoff(r, 1), retry.backoff(r, 2),
      retry.backoff(r, 3), retry.backoff(r, 4), retry.backoff(r, 5) })
    r.jitter = true
    for _ = 1, 50 do
      local d = retry.backoff(r, 2)
      assert.is_true(d >= 0.5 and d < 1.5)
    end
  end)

  it("timeout cancels a sleeping node and fails it", function()
    local finished = false
    local g = G.new()
    g:add_node("sleepy", function() mg.sleep(5); finished = true end, { timeout = 0.02 })
    g:add_edge(START, "sleepy")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("node 'sleepy' timed out after 0.02 s", err)
    assert.is_false(finished)
  end)

  it("timeout applies per attempt under retry", function()
    local attempts = 0
    local g = G.new()
    g:add_node("slow_then_fast", function()
      attempts = attempts + 1
      if attempts == 1 then mg.sleep(5) end
      return { done = attempts }
    end, { timeout = 0.02, retry = { max_attempts = 2, initial_interval = 0.001 } })
    g:add_edge(START, "slow_then_fast")
    assert.equal(2, run(function() return g:compile():invoke({}).done end))
  end)

  it("a timed-out node under fail_open is recorded and the run goes on", function()
    local g = G.new()
    g:add_node("weather", function() mg.sleep(5) end, { timeout = 0.01, policy = "fail_open" })
    g:add_node("answer", function() return { answer = "without weather" } end)
    g:add_edge(START, "weather"):add_edge("weather", "answer")
    local out = run(function() return g:compile():invoke {} end)
    assert.equal("without weather", out.answer)
    assert.matches("node 'weather' timed out after 0.01 s", out.errors[1].error)
  end)

  it("fail_close (default) aborts the run and cancels sibling tasks", function()
    local sibling_finished = false
    local g = G.new()
    g:add_node("fan", function() end)
    g:add_node("boom", function() mg.sleep(0.01); error("character service down") end)
    g:add_node("sibling", function() mg.sleep(5); sibling_finished = true; return { s = 1 } end)
    g:add_node("after", function() return { after = true } end)
    g:add_edge(START, "fan"):add_edge("fan", "boom"):add_edge("fan", "sibling")
    g:add_edge("boom", "after")
    local out, err = run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("node 'boom' failed: .*character service down", err)
    assert.is_false(sibling_finished)
  end)

  it("fail_open records the error, fires the node's edges and the answer still comes", function()
    local g = G.new { contexts = R.merge }
    g:add_node("fan", function() end)
    g:add_node("weather", function() error("KMA API timeout") end, { policy = "fail_open" })
    g:add_node("rag", function() return { contexts = { rules = "flatten paper" } } end)
    g:add_node("answer", function(s)
      return { answer = "Answer from " .. (s.contexts.rules or "?"), weather_ran = true }
    end)
    g:add_edge(START, "fan"):add_edge("fan", "weather"):add_edge("fan", "rag")
    g:add_edge({ "weather", "rag" }, "answer")
    local out = run(function() return g:compile():invoke {} end)
    assert.equal("Answer from flatten paper", out.answer)
    assert.equal(1, #out.errors)
    assert.equal("weather", out.errors[1].node)
    assert.matches("KMA API timeout", out.errors[1].error)
  end)

  it("fallback runs the fallback node with the same input in the same step", function()
    local seen = {}
    local g = G.new()
    g:add_node("rag", function(s, ctx) seen.rag_step = ctx.step; error("vector store down") end,
      { policy = { fallback = "web_search" } })
    g:add_node("web_search", function(s, ctx)
      seen.fb_step, seen.fb_node, seen.q = ctx.step, ctx.node, s.q
      return { context = "from the web" }
    end)
    g:add_node("answer", function(s) return { answer = s.context } end)
    g:add_edge(START, "rag"):add_edge("rag", "answer")
    local out = run(function() return g:compile():invoke { q = "paper?" } end)
    assert.equal("from the web", out.answer)    -- rag's outgoing edge fired
    assert.is_number(seen.rag_step)
    assert.equal(seen.rag_step, seen.fb_step)
    assert.equal("web_search", seen.fb_node)
    assert.equal("paper?", seen.q)
  end)

  it("fallback chains follow each node's own policy", function()
    local tried = {}
    local function failing(name)
      return function() tried[#tried + 1] = name; error(name .. " failed") end
    end
    local g = G.new()
    g:add_node("rag", failing("rag"), { policy = { fallback = "web" } })
    g:add_node("web", failing("web"), { policy = { fallback = "general" } })
    g:add_node("general", failing("general"), { policy = { fallback = "clarify" } })
    g:add_node("clarify", function() tried[#tried + 1] = "clarify"; return { reply = "could you rephrase?" } end)
    g:add_edge(START, "rag")
    local out = run(function() return g:compile():invoke {} end)
    assert.same({ "rag", "web", "general", "clarify" }, tried)
    assert.equal("could you rephrase?", out.reply)
  end)

  it("a fallback that ends in fail_close names the chain", function()
    local g = G.new()
    g:add_node("a", function() error("a broke") end, { policy = { fallback = "b" } })
    g:add_node("b", function() error("b broke") end)
    g:add_edge(START, "a")
    local _, err = run(function() return g:compile():invoke {} end)
    assert.matches("node 'b' %(fallback of 'a'%) failed: .*b broke", err)
  end)

  it("a fallback that ends in fail_open records the last failure", function()
    local g = G.new()
    g:add_node("a", function() error("a broke") end, { policy = { fallback = "b" } })
    g:add_node("b", function() error("b broke") end, { policy = "fail_open" })
    g:add_node("next", function() return { reached = true } end)
    g:add_edge(START, "a"):add_edge("a", "next")
    local out = run(function() return g:compile():invoke {} end)
    assert.is_true(out.reached)
    assert.equal("b", out.errors[1].node)
    assert.equal("a", out.errors[1].fallback_of)
  end)

  it("a Send task failing under fail_open keeps the other branches' results", function()
    local g = G.new { results = R.append }
    g:add_node("work", function(i)
      if i == 2 then error("item 2 is bad") end
      return { results = i }
    end, { policy = "fail_open" })
    g:add_conditional_edges(START, function() return { G.Send("work", 1), G.Send("work", 2), G.Send("work", 3) } end,
      { "work" })
    local out = run(function() return g:compile():invoke {} end)
    assert.same({ 1, 3 }, out.results)
    assert.equal(1, #out.errors)
  end)

end)
