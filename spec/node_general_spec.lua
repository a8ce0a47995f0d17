local general = require "nodes.general"
local fx = require "node_fixtures"

describe("general node", function()
  it("follows the node contract", function()
    assert.are.equal("general", general.name)
    assert.are.same({ fallback = "clarify" }, general.policy)
  end)

  it("replies that no LLM is configured when ctx.llm is absent", function()
    local c = general.run({ message = "안녕?" }, fx.offline_ctx()).contexts.general
    assert.is_true(c.ok)
    assert.are.equal("offline", c.source)
    assert.matches("LLM이 설정되어 있지 않아", c.text)
  end)

  it("builds chat messages from the system prompt, recent history and the question", function()
    local msgs = general.messages("SYS", {
      message = "고마워",
      messages = {
        { role = "user", content = "페트병 어떻게 버려?" },
        { role = "assistant", content = "라벨을 떼고..." },
        { role = "tool", content = "ignored" },
      },
    })
    assert.are.same({
      { role = "system", content = "SYS" },
      { role = "user", content = "페트병 어떻게 버려?" },
      { role = "assistant", content = "라벨을 떼고..." },
      { role = "user", content = "고마워" },
    }, msgs)
  end)

  it("does not repeat the question when history already ends with it", function()
    local msgs = general.messages("S", { message = "hi", messages = { { role = "user", content = "hi" } } })
    assert.are.equal(2, #msgs)
  end)

  it("reads reply text from the usual result shapes", function()
    assert.are.equal("a", general.reply_text("a"))
    assert.are.equal("b", general.reply_text({ content = "b" }))
    assert.are.equal("c", general.reply_text({ message = { content = "c" } }))
    assert.are.equal("d", general.reply_text({ choices = { { message = { content = "d" } } } }))
    assert.is_nil(general.reply_text({}))
  end)

  it("raises on an empty question", function()
    assert.has_error(function() general.run({ message = "" }, {}) end, "general: the question (state.message) is empty")
  end)
end)
