-- mg.checkpoint.redis / postgres / cached are the savers users name in
-- compile{checkpointer = ...}; a graph runs and resumes its thread on each.
local mg = require "moongraph"
local servers = require "servers"

local function counter_graph()
  local g = mg.graph { n = mg.reducers.add }
  g:add_node("one", function() return { n = 1 } end)
  g:add_node("two", function() return { n = 10 } end)
  g:add_edge(mg.START, "one")
  g:add_edge("one", "two")
  return g
end

describe("mg.checkpoint registry", function()
  local rsrv, psrv
  setup(function()
    rsrv = servers.redis()
    psrv = servers.postgres()
  end)
  teardown(function()
    if rsrv then rsrv:destroy() end
    if psrv then psrv:destroy() end
  end)

  local function run_on(make_saver, thread)
    return mg.run(function()
      local app = counter_graph():compile { checkpointer = make_saver() }
      local out = app:invoke({ n = 0 }, { thread_id = thread })
      local again = app:get_state({ thread_id = thread })
      return out.n, again.values.n
    end)
  end

  it("mg.checkpoint.redis(url) saves the thread's state", function()
    local n, saved = run_on(function() return mg.checkpoint.redis(rsrv.url) end, "reg-redis")
    assert.equal(11, n)
    assert.equal(11, saved)
  end)

  it("mg.checkpoint.postgres(url) saves the thread's state", function()
    local n, saved = run_on(function() return mg.checkpoint.postgres(psrv.url) end, "reg-pg")
    assert.equal(11, n)
    assert.equal(11, saved)
  end)

  it("mg.checkpoint.cached(redis, postgres) saves the thread's state", function()
    local n, saved = run_on(function()
      return mg.checkpoint.cached(mg.checkpoint.redis(rsrv.url), mg.checkpoint.postgres(psrv.url))
    end, "reg-cached")
    assert.equal(11, n)
    assert.equal(11, saved)
  end)
end)
