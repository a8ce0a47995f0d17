local intent_node = require "nodes.intent"
local routing = require "scripts.eco.routing"

describe("intent node", function()
  local node = intent_node.new { rules = routing.rules }

  it("classifies, routes and opens the turn", function()
    local up = node.run({ message = "종이 어떻게 버려? 그리고 수거함도 알려줘",
                                 user_location = "서울특별시 강남구" }, {})
    assert.are.equal(1, up.turn)
    assert.are.equal("waste", up.intent)
    assert.are.same({ "collection_point" }, up.additional_intents)
    assert.are.equal("offline", up.intent_source)
    local nodes = {}
    for i, d in ipairs(up.routing) do nodes[i] = d.node .. ":" .. d.rule end
    assert.are.same({ "waste_rag:primary", "collection_point:multi_intent",
                      "weather:enrichment:waste->weather" }, nodes)
    assert.are.same({ role = "user", content = "종이 어떻게 버려? 그리고 수거함도 알려줘",
                      turn = 1, intent = "waste" }, up.messages)
    -- the per-turn keys start empty
    assert.is_table(intent_node.RESET)
    assert.are.same(intent_node.RESET, up.contexts)
    assert.are.same(intent_node.RESET, up.errors)
    assert.is_false(up.prev_intent)
  end)

  it("takes the previous turn's intent from the state for the transition boost", function()
    local up = node.run({ message = "팔 수 있어?", intent = "bulk_waste", turn = 1 }, {})
    assert.are.equal(2, up.turn)
    assert.are.equal("bulk_waste", up.prev_intent)
    assert.are.equal("recyclable_price", up.intent)
    assert.are.equal(0.08, up.transition_boost)
  end)

  it("ignores a previous intent that is not one of the nine", function()
    local up = node.run({ message = "페트병 어떻게 버려?", intent = "nonsense" }, {})
    assert.is_false(up.prev_intent)
    assert.are.equal(0, up.transition_boost)
  end)

  it("raises on an empty message", function()
    assert.has_error(function() node.run({ message = "  " }, {}) end,
      "intent: the message (state.message) is empty")
  end)

  it("takes its rules as data and refuses to be built without them", function()
    assert.has_error(function() intent_node.new {} end,
      "bad argument #1 to 'new': {rules = {keyword_map, transitions, multi_intent, routing}} expected")
    -- a routing table that sends waste elsewhere is used as given
    local rules = {}
    for k, v in pairs(routing.rules) do rules[k] = v end
    rules.routing = { INTENT_TO_NODE = { waste = "web_search" } }
    local up = intent_node.new { rules = rules }.run({ message = "페트병 어떻게 버려?" }, {})
    assert.are.same({ node = "web_search", rule = "primary", intent = "waste" }, up.routing[1])
  end)
end)
