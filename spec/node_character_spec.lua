local character = require "nodes.character"
local fx = require "node_fixtures"

local online = { base_url = "http://127.0.0.1:8080", api_key = "c-key", online = true }

describe("character node", function()
  it("follows the node contract with fail_close", function()
    assert.are.equal("character", character.name)
    assert.are.equal("fail_close", character.policy)
  end)

  it("builds the search request", function()
    local req = character.build_request(online, "페티 어떻게 얻어?")
    assert.are.equal("GET", req.method)
    assert.are.equal("http://127.0.0.1:8080/v1/characters", req.url)
    assert.are.equal("Bearer c-key", req.headers.Authorization)
    assert.are.same({ query = "페티 어떻게 얻어?", limit = 5 }, req.query)
  end)

  it("parses characters", function()
    local res = character.parse_response(fx.load("character_search.json"))
    assert.are.equal(1, res.total)
    assert.are.equal("페티", res.characters[1].name)
    assert.are.equal("투명 페트병 배출 인증 3회", res.characters[1].how_to_get)
    assert.is_nil(res.characters[1].owned)
  end)

  it("rejects a body without characters", function()
    assert.has_error(function() character.parse_response({}) end, "character: response has no characters[] array")
  end)

  it("answers about a named sample character offline", function()
    local c = character.run({ message = "페티 캐릭터 어떻게 얻어?" }, fx.offline_ctx()).contexts.character
    assert.is_true(c.ok and c.sample)
    assert.are.equal("pety", c.data.characters[1].id)
    assert.is_true(c.data.matched)
    assert.matches("샘플 데이터", c.text)
    assert.matches("얻는 법: 투명 페트병을", c.text)
  end)

  it("finds characters by the waste category they stand for", function()
    local c = character.run({ message = "스티로폼 캐릭터도 있어?" }, fx.offline_ctx()).contexts.character
    assert.are.equal("pompom", c.data.characters[1].id)
  end)

  it("describes the whole sample collection when no character is named", function()
    local c = character.run({ message = "캐릭터 어떻게 모아?" }, fx.offline_ctx()).contexts.character
    assert.is_false(c.data.matched)
    assert.are.equal(11, #c.data.characters)
    assert.matches("캐릭터 11종", c.text)
  end)
end)
