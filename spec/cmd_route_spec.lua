local cli = require "cli"
local cjson = require "cjson"

local function last_line(s)
  local last
  for line in s:gmatch("[^\n]+") do last = line end
  return last
end

describe("moongraph route / eval commands", function()
  it("route --json prints the decision as the last line", function()
    local r = cli.run({ "route", "--json", "냉장고 버리려면 어떻게 해?" })
    assert.equal(0, r.code)
    local d = cjson.decode(last_line(r.out))
    assert.equal("bulk_waste", d.intent)
    assert.same({ "bulk_waste", "weather" }, d.nodes)
  end)

  it("route uses the previous intent's transition boost", function()
    local r = cli.run({ "route", "--json", "--prev-intent", "bulk_waste", "팔 수 있어?" })
    assert.equal(0, r.code, r.err)
    assert.equal("recyclable_price", cjson.decode(last_line(r.out)).intent)
  end)

  it("route explains the decision in words", function()
    local r = cli.run({ "route", "분리배출 방법을 인포그래픽으로 만들어줘" })
    assert.equal(0, r.code)
    assert.matches("intent: image_generation", r.out)
    assert.matches("keyword adjustment", r.out)
    assert.matches('Send%("image_generation"%)', r.out)
  end)

  it("route exits 2 on a bad flag", function()
    assert.equal(2, cli.run({ "route", "--bogus", "x" }).code)
  end)

  it("eval --json scores a labelled file", function()
    local p = cli.write_temp(table.concat({
      '{"message": "냉장고 버리려면 어떻게 해?", "intent": "bulk_waste", "nodes": ["bulk_waste", "weather"]}',
      '{"message": "분리배출 방법을 인포그래픽으로 만들어줘", "intent": "image_generation"}',
    }, "\n"), ".jsonl")
    local r = cli.run({ "eval", "--json", p })
    assert.equal(0, r.code)
    local rep = cjson.decode(last_line(r.out))
    assert.equal(2, rep.total)
    assert.equal(1, rep.intent.accuracy)
    assert.equal(1, rep.nodes.accuracy)
    assert.equal(0, #rep.failures)
  end)
end)
