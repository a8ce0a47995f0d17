-- The intent classifier's LLM path against the OpenAI-compatible test
-- server: a good reply is used; a failing LLM (500, timeout, a reply that
-- does not match the schema) falls back to the offline classifier and the
-- explain output says why.
local mg = require "moongraph"
local llm = require "moongraph.llm"
local testserver = require "testserver"
local explain = require "scripts.eco.explain"

describe("Eco² intent with an LLM", function()
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() if srv then srv:stop() end end)
  before_each(function() mg.run(function() srv:reset() end) end)

  local function route(message, reply)
    return mg.run(function()
      if reply then srv:script(reply) end
      local client = assert(llm.new { base_url = srv.url .. "/v1", model = "test-model",
                                      max_retries = 0, timeout = 5 })
      local lines, obj = explain.explain(message, { llm = client, llm_timeout = 0.3 })
      return table.concat(lines, "\n"), obj
    end)
  end

  it("uses the LLM's structured answer", function()
    -- offline this is waste; the scripted LLM says location
    local text, obj = route("페트병 어떻게 버려?", {
      content = '{"intent": "location", "additional_intents": [], "confidence": 0.91}',
    })
    assert.equal("location", obj.intent)
    assert.equal("llm", obj.source)
    assert.matches("source: llm", text)
    local reqs = mg.run(function() return srv:requests("/v1/chat/completions") end)
    assert.equal(1, #reqs)
    assert.matches("response_format", reqs[1].body)
  end)

  it("falls back to the offline classifier on a 500 and says so", function()
    local text, obj = route("냉장고 버리려면 어떻게 해?", { status = 500, json = { error = "boom" } })
    assert.equal("offline", obj.source)
    assert.equal("bulk_waste", obj.intent)
    assert.matches("500", obj.fallback_reason)
    assert.matches("source: offline classifier %(.*500", text)
  end)

  it("falls back on a timeout", function()
    local text, obj = route("냉장고 버리려면 어떻게 해?", { fault = "hang" })
    assert.equal("offline", obj.source)
    assert.equal("bulk_waste", obj.intent)
    assert.matches("timeout", obj.fallback_reason)
    assert.matches("timeout", text)
  end)

  it("falls back when the reply does not match the schema", function()
    -- the client repairs once, then gives up: script two bad replies
    local text, obj = route("냉장고 버리려면 어떻게 해?", {
      { content = '{"intent": "not_an_intent", "confidence": 0.5}' },
      { content = '{"intent": "not_an_intent", "confidence": 0.5}' },
    })
    assert.equal("offline", obj.source)
    assert.equal("bulk_waste", obj.intent)
    assert.matches("schema", obj.fallback_reason)
    assert.matches("schema", text)
  end)
end)
