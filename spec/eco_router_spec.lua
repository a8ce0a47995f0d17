-- The Eco² dynamic router: the seed's test cases (primary routing,
-- multi-intent fan-out, de-duplication, enrichment, conditional
-- enrichment, everything together) plus rules-as-data behaviour.

local routing = require "scripts.eco.routing"
local cjson = require "cjson"

local function node_set(decisions)
  local s = {}
  for _, d in ipairs(decisions) do s[d.node] = true end
  return s
end

local function set(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

-- Copy of the shipped rules, so a spec can change them freely.
local function copy(t)
  if type(t) ~= "table" then return t end
  local out = {}
  for k, v in pairs(t) do out[k] = copy(v) end
  return out
end

describe("eco router", function()
  it("routes the primary intent to its node", function()
    local route = routing.new_router{
      enable_multi_intent = false, enable_enrichment = false, enable_conditional = false,
    }
    local d = route({ intent = "waste", job_id = "test-123" })
    assert.equal(1, #d)
    assert.equal("waste_rag", d[1].node)
    assert.equal("primary", d[1].rule)
  end)

  it("fans out to a node per additional intent", function()
    local route = routing.new_router{ enable_multi_intent = true }
    local d = route({ intent = "waste", additional_intents = { "collection_point", "character" } })
    -- waste also brings weather (enrichment); the seed's case counts the
    -- three intent nodes
    local nodes = node_set(d)
    assert.is_true(nodes.waste_rag and nodes.collection_point and nodes.character)
    local multi = {}
    for _, x in ipairs(d) do if x.rule == "multi_intent" then multi[#multi + 1] = x.node end end
    assert.same({ "collection_point", "character" }, multi)
  end)

  it("fans out to exactly the intent nodes without enrichment", function()
    local route = routing.new_router{ enable_multi_intent = true, enable_enrichment = false }
    local d = route({ intent = "waste", additional_intents = { "collection_point", "character" } })
    assert.equal(3, #d)
    assert.same(set{ "waste_rag", "collection_point", "character" }, node_set(d))
  end)

  it("never sends a node twice", function()
    local route = routing.new_router{}
    local d = route({ intent = "waste",
      additional_intents = { "waste", "collection_point", "collection_point", "weather" } })
    assert.same({ "waste_rag", "collection_point", "weather" },
      { d[1].node, d[2].node, d[3].node })
    assert.equal(3, #d)
    -- weather came from the additional intent, so the enrichment rule is not repeated
    assert.equal("multi_intent", d[3].rule)
  end)

  it("adds weather to a waste question", function()
    local route = routing.new_router{ enable_enrichment = true }
    local d = route({ intent = "waste" })
    assert.equal(2, #d)
    assert.same(set{ "waste_rag", "weather" }, node_set(d))
    assert.equal("enrichment:waste->weather", d[2].rule)
  end)

  it("adds weather to a bulk-waste question", function()
    local route = routing.new_router{ enable_enrichment = true }
    local d = route({ intent = "bulk_waste" })
    assert.same(set{ "bulk_waste", "weather" }, node_set(d))
    assert.equal("enrichment:bulk_waste->weather", d[2].rule)
  end)

  it("adds weather when the user's location is known", function()
    local route = routing.new_router{ enable_enrichment = false, enable_conditional = true }
    local d = route({ intent = "location", user_location = "서울 강남구" })
    assert.same(set{ "location", "weather" }, node_set(d))
    assert.equal("conditional:user_location->weather", d[2].rule)
  end)

  it("adds no weather without a location", function()
    local route = routing.new_router{ enable_enrichment = false }
    assert.equal(1, #route({ intent = "location" }))
    assert.equal(1, #route({ intent = "location", user_location = cjson.null }))
  end)

  it("adds no conditional weather for excluded intents", function()
    local route = routing.new_router{ enable_enrichment = false }
    -- excluded by the rule: weather, image_generation
    -- not met by the condition: weather, general, character
    for _, intent in ipairs{ "image_generation", "general", "character" } do
      local d = route({ intent = intent, user_location = "부산" })
      assert.equal(1, #d, intent)
      assert.equal(intent, d[1].node)
    end
    local d = route({ intent = "weather", user_location = "부산" })
    assert.equal(1, #d)
    assert.equal("weather", d[1].node)
  end)

  it("adds conditional weather for every other intent", function()
    local route = routing.new_router{ enable_enrichment = false }
    for _, intent in ipairs{ "waste", "location", "bulk_waste", "recyclable_price",
                             "collection_point", "web_search" } do
      assert.is_true(node_set(route({ intent = intent, user_location = "부산" })).weather, intent)
    end
  end)

  it("does everything together, in rule order", function()
    local route = routing.new_router{}
    local d = route({
      intent = "waste", additional_intents = { "collection_point", "location" },
      user_location = "서울 강남구",
    })
    local got = {}
    for i, x in ipairs(d) do got[i] = x.node .. " " .. x.rule end
    assert.same({
      "waste_rag primary",
      "collection_point multi_intent",
      "location multi_intent",
      "weather enrichment:waste->weather",
    }, got)
  end)

  it("lets conditional weather follow multi-intent when the primary has no enrichment", function()
    local route = routing.new_router{}
    local d = route({ intent = "recyclable_price", additional_intents = { "location" },
                      user_location = "대구" })
    assert.same({ "recyclable_price", "location", "weather" }, { d[1].node, d[2].node, d[3].node })
    assert.equal("conditional:user_location->weather", d[3].rule)
  end)

  it("ignores additional intents when multi-intent is off", function()
    local route = routing.new_router{ enable_multi_intent = false }
    local d = route({ intent = "character", additional_intents = { "waste" } })
    assert.same({ "character" }, routing.nodes(d))
  end)

  it("routes a missing intent to general", function()
    local d = routing.new_router{}({})
    assert.equal("general", d[1].node)
    assert.equal(1, #d)
  end)

  it("applies the seed's condition to the state's own intent", function()
    -- no intent in the state: the primary node is general, but the
    -- condition (intent not in weather/general/character) holds
    local d = routing.new_router{}({ user_location = "서울" })
    assert.same({ "general", "weather" }, routing.nodes(d))
  end)

  it("routes an additional intent with no mapping to the node of that name", function()
    local d = routing.new_router{}({ intent = "general", additional_intents = { "translation" } })
    assert.equal("translation", d[2].node)
  end)

  describe("rules as data", function()
    it("reads the rule tables on every call", function()
      local rules = copy(require "scripts.eco.routing_rules")
      local route = routing.new_router{ rules = rules }
      assert.same({ "location" }, routing.nodes(route({ intent = "location" })))
      rules.ENRICHMENT_RULES.location = { intent = "location", enrichments = { "weather", "web_search" } }
      local d = route({ intent = "location" })
      assert.same({ "location", "weather", "web_search" }, routing.nodes(d))
      assert.equal("enrichment:location->web_search", d[3].rule)
    end)

    it("accepts a condition function", function()
      local rules = copy(require "scripts.eco.routing_rules")
      rules.CONDITIONAL_ENRICHMENTS = { {
        name = "night->general", node = "general",
        condition = function(state) return state.hour and state.hour >= 22 end,
      } }
      local route = routing.new_router{ rules = rules }
      assert.same({ "character", "general" }, routing.nodes(route({ intent = "character", hour = 23 })))
      assert.same({ "character" }, routing.nodes(route({ intent = "character", hour = 9 })))
    end)

    it("maps intents through INTENT_TO_NODE", function()
      local rules = copy(require "scripts.eco.routing_rules")
      rules.INTENT_TO_NODE.waste = "waste_rag_v2"
      local d = routing.new_router{ rules = rules }({ intent = "waste" })
      assert.equal("waste_rag_v2", d[1].node)
    end)
  end)

  describe("sends", function()
    it("builds one Send per decision with the state as its argument", function()
      local state = { intent = "waste", additional_intents = { "collection_point" } }
      local decisions = routing.new_router{}(state)
      local function Send(node, arg) return { kind = "send", node = node, arg = arg } end
      local sends = routing.sends(decisions, state, Send)
      assert.equal(3, #sends)
      for i, s in ipairs(sends) do
        assert.equal(decisions[i].node, s.node)
        assert.equal(state, s.arg)
      end
    end)

    it("rejects a missing Send constructor", function()
      assert.has_error(function() routing.sends({}, {}, nil) end,
        "bad argument #3 to 'sends': expected the Send constructor")
    end)
  end)

  describe("misuse", function()
    it("rejects a non-boolean flag", function()
      assert.has_error(function() routing.new_router{ enable_enrichment = "yes" } end,
        "bad argument #1 to 'new': enable_enrichment must be a boolean")
    end)

    it("rejects a non-table state", function()
      assert.has_error(function() routing.new_router{}("waste") end,
        "bad argument #1 to 'route': expected a state table, got string")
    end)
  end)
end)
