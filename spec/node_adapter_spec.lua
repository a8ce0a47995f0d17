local adapter = require "nodes.lib.adapter"

describe("nodes.lib.adapter.config", function()
  it("is offline when neither URL nor key is configured", function()
    local cfg = adapter.config("kakao", { config = { kakao = { base_url = "", api_key = "" } } }, "https://dapi.kakao.com")
    assert.is_false(cfg.online)
    assert.are.equal("https://dapi.kakao.com", cfg.base_url)
  end)

  it("goes online with a key and the public default URL", function()
    local cfg = adapter.config("kakao", { config = { kakao = { api_key = "k" } } }, "https://dapi.kakao.com")
    assert.is_true(cfg.online)
    assert.are.equal("k", cfg.api_key)
    assert.are.equal("https://dapi.kakao.com", cfg.base_url)
  end)

  it("goes online with a URL alone and trims its trailing slash", function()
    local cfg = adapter.config("bulk_waste", { config = { bulk_waste = { base_url = "http://127.0.0.1:9/", api_key = "" } } })
    assert.is_true(cfg.online)
    assert.is_nil(cfg.api_key)
    assert.are.equal("http://127.0.0.1:9", cfg.base_url)
  end)

  it("names the missing URL of a service without a public default", function()
    assert.has_error(function()
      adapter.config("character", { config = { character = { api_key = "k", base_url = "" } } })
    end, "character: MOONGRAPH_CHARACTER_API_KEY is set but MOONGRAPH_CHARACTER_BASE_URL is not (this service has no public default)")
  end)
end)

describe("nodes.lib.adapter.decode", function()
  it("returns the decoded JSON body of a 2xx response", function()
    assert.are.same({ a = 1 }, adapter.decode("svc", { status = 200, body = '{"a":1}' }))
  end)

  it("names transport failures", function()
    assert.has_error(function() adapter.decode("svc", nil, "timeout") end, "svc: request failed: timeout")
  end)

  it("names HTTP errors with the start of the body", function()
    assert.has_error(function() adapter.decode("svc", { status = 500, body = "boom\n" }) end,
      "svc: HTTP 500: boom ")
  end)

  it("names malformed bodies", function()
    local ok, err = pcall(adapter.decode, "svc", { status = 200, body = "<OpenAPI_ServiceResponse>" })
    assert.is_false(ok)
    assert.matches("^svc: malformed response body", err)
  end)

  it("maps JSON null and odd types to nil", function()
    assert.is_nil(adapter.str(adapter.null))
    assert.are.equal("3", adapter.str(3))
    assert.are.equal(418, adapter.num("418"))
    assert.is_nil(adapter.num({}))
  end)
end)
