-- The in-memory Store (LangGraph's InMemoryStore:
-- https://reference.langchain.com/python/langgraph.store/memory/InMemoryStore).
-- Time is the store's `clock` option, moved by the contract's age().
local mg = require "moongraph"
local store = require "moongraph.store"

describe("memory store", function()
  require("store_contract")("memory", function(opts)
    local now = 1700000000.0
    opts = opts or {}
    opts.clock = function() return now end
    return {
      store = store.memory(opts),
      age = function(sec) now = now + sec end,
      close = function() end,
    }
  end, _ENV)

  it("is mg.store.memory", function()
    local s = mg.store.memory()
    mg.run(function()
      assert(s:put({ "a" }, "k", { v = 1 }))
      assert.equal(1, s:get({ "a" }, "k").value.v)
    end)
  end)

  it("sweeps expired items by itself every sweep_interval_minutes", function()
    local now = 0
    local s = store.memory { clock = function() return now end, ttl = { sweep_interval_minutes = 1 } }
    mg.run(function()
      assert(s:put({ "a" }, "old", { v = 1 }, { ttl = 0.5 }))
      assert(s:put({ "b" }, "keep", { v = 1 }))
      now = 61
      -- any operation past the interval sweeps the whole store, touched or not
      assert(s:get({ "b" }, "keep"))
      assert.is_nil(s.data["a"])
      assert.matches("1 items", tostring(s))
    end)
  end)

  it("rejects bad options", function()
    assert.has_error(function() store.memory { bogus = 1 } end,
      "bad argument #1 to 'memory' (unknown option 'bogus')")
    assert.has_error(function() store.memory { ttl = { default_ttl = 0 } } end,
      "bad argument #1 to 'memory' (ttl.default_ttl must be a positive number of minutes)")
    assert.has_error(function() store.memory { index = { dims = 3 } } end,
      "bad argument #1 to 'memory' (index.embed must be a function(texts) -> list of vectors)")
    assert.has_error(function() store.memory { index = { embed = print, dims = 3, fields = { "a[x]" } } } end)
  end)
end)
