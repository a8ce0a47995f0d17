-- moongraph.prompt: templates under prompts/ with {{name}} placeholders.
local prompt = require "moongraph.prompt"

describe("moongraph.prompt", function()
  it("fills placeholders, with spaces inside the braces allowed", function()
    assert.equal("a=1 b=x c=true", prompt.render("a={{a}} b={{ b }} c={{c}}", { a = 1, b = "x", c = true }))
  end)

  it("names a placeholder without a value, and what was given", function()
    local out, err = prompt.render("{{a}} {{nope}}", { a = 1, z = 2 }, "t.txt")
    assert.is_nil(out)
    assert.equal("prompt t.txt: no value for {{nope}} (given: a, z)", err)
  end)

  it("refuses a table value", function()
    local out, err = prompt.render("{{a}}", { a = {} })
    assert.is_nil(out)
    assert.equal("prompt: {{a}} has a table value; strings, numbers or booleans expected", err)
  end)

  it("takes % in values literally", function()
    assert.equal("50%1", prompt.render("{{v}}", { v = "50%1" }))
  end)

  it("loads templates from prompts/ beside the modules", function()
    local text = assert(prompt.load("answer.txt"))
    assert.matches("{{%s*summary%s*}}", text)
  end)

  it("reports a missing template with where it looked", function()
    local text, err = prompt.load("no/such/prompt.txt")
    assert.is_nil(text)
    assert.matches("^prompt no/such/prompt%.txt: 'prompts/no/such/prompt%.txt' not found beside the modules", err)
  end)

  it("has every placeholder of the shipped Eco² templates filled by their nodes", function()
    assert(prompt.file("feedback.txt", { question = "", contexts = "", answer = "" }))
    assert(prompt.file("image_generation.txt", { message = "" }))
    assert(prompt.file("answer.txt", { summary = "" }))
  end)
end)
