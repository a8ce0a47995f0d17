local registry = require "nodes.registry"

describe("nodes.registry", function()
  it("loads every node with the contract the pipeline relies on", function()
    local nodes = registry.load_all()
    assert.are.equal(11, #registry.names)
    for _, name in ipairs(registry.names) do
      local n = nodes[name]
      assert.are.equal(name, n.name)
      assert.is_function(n.run)
      assert.is_number(n.timeout)
      assert.is_not_nil(n.policy)
    end
  end)

  it("maps every intent to a known node", function()
    local known = {}
    for _, n in ipairs(registry.names) do known[n] = true end
    local mapped = 0
    for intent, node in pairs(registry.intent_to_node) do
      assert.is_true(known[node], intent .. " -> " .. node)
      mapped = mapped + 1
    end
    assert.are.equal(9, mapped)   -- the nine intents
  end)

  it("carries the seed's policies", function()
    local nodes = registry.load_all()
    assert.are.same({ fallback = "web_search" }, nodes.waste_rag.policy)
    assert.are.equal("fail_open", nodes.web_search.policy)
    assert.are.equal("fail_close", nodes.character.policy)
    assert.are.equal("fail_open", nodes.weather.policy)
  end)

  it("rejects unknown names", function()
    assert.has_error(function() registry.load("nope") end, "bad argument #1 to 'load': unknown node 'nope'")
  end)

  it("every node's offline default returns its context under its own name", function()
    local fx = require "node_fixtures"
    local nodes = registry.load_all()
    local state = { message = "페트병 어떻게 버려? 캐릭터랑 수거함도", user_location = "서울특별시 강남구",
                    intent = "waste", additional_intents = {} }
    for _, name in ipairs(registry.names) do
      local out = nodes[name].run(state, fx.offline_ctx())
      local c = out.contexts[name]
      assert.is_table(c, name)
      assert.is_boolean(c.ok, name)
      assert.is_string(c.text, name)
      assert.is_true(c.ok or c.unavailable == true, name)
    end
  end)
end)
