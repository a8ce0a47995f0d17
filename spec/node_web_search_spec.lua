local web = require "nodes.web_search"
local fx = require "node_fixtures"

local online = { base_url = "http://127.0.0.1:8080", api_key = "tvly-test", online = true }

describe("web_search node", function()
  it("follows the node contract", function()
    assert.are.equal("web_search", web.name)
    assert.are.equal("fail_open", web.policy)
  end)

  it("builds the Tavily search request", function()
    local req = web.build_request(online, "투명 페트병 정책")
    assert.are.equal("POST", req.method)
    assert.are.equal("http://127.0.0.1:8080/search", req.url)
    assert.are.equal("Bearer tvly-test", req.headers.Authorization)
    assert.are.same({ query = "투명 페트병 정책", max_results = 5 }, req.json)
  end)

  it("rejects an empty query", function()
    assert.has_error(function() web.build_request(online, "  ") end,
      "bad argument #2 to 'build_request': non-empty query string expected")
  end)

  it("parses results and summarises the top ones", function()
    local results = web.parse_response(fx.load("tavily_search.json"))
    assert.are.equal(2, #results)
    assert.are.equal("https://example.org/pet-guide", results[1].url)
    assert.are.equal(0.91, results[1].score)
    local text = web.summarize(results)
    assert.matches("1%. 투명 페트병 별도 배출 안내 %(테스트 문서%) — 투명 페트병은", text)
    assert.matches("%(https://example.org/news/1%)", text)
  end)

  it("clips long snippets on a character boundary", function()
    local long = string.rep("가", 400)
    local text = web.summarize({ { title = "t", url = "u", content = long } })
    assert.matches(string.rep("가", 160) .. "…", text)
    assert.is_not_nil(utf8.len(text))
  end)

  it("rejects a body without results", function()
    assert.has_error(function() web.parse_response({ answer = "x" }) end,
      "web_search: Tavily response has no results[] array")
  end)

  it("reports unavailable offline", function()
    local c = web.run({ message = "최신 분리배출 정책" }, fx.offline_ctx()).contexts.web_search
    assert.is_false(c.ok)
    assert.is_true(c.unavailable)
    assert.matches("오프라인이라 웹 검색 결과를 제공할 수 없습니다", c.text)
  end)
end)
