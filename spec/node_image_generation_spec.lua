local image = require "nodes.image_generation"
local fx = require "node_fixtures"

local online = { base_url = "http://127.0.0.1:8080", api_key = "sk-test", online = true }

describe("image_generation node", function()
  it("follows the node contract", function()
    assert.are.equal("image_generation", image.name)
    assert.are.equal("fail_open", image.policy)
  end)

  it("fills the prompt template", function()
    assert.are.equal("draw: 페트병 %1 분리배출", image.prompt("draw: {{message}}", "페트병 %1 분리배출"))
  end)

  it("builds the images request with the default model and size", function()
    local req = image.build_request(online, "a prompt")
    assert.are.equal("POST", req.method)
    assert.are.equal("http://127.0.0.1:8080/v1/images/generations", req.url)
    assert.are.equal("Bearer sk-test", req.headers.Authorization)
    assert.are.same({ model = "gpt-image-1", prompt = "a prompt", size = "1024x1024" }, req.json)
    local req2 = image.build_request({ base_url = "http://h", model = "dall-e-3" }, "p", "512x512")
    assert.are.same({ model = "dall-e-3", prompt = "p", size = "512x512" }, req2.json)
    assert.is_nil(req2.headers.Authorization)
  end)

  it("parses url images", function()
    local images = image.parse_response(fx.load("image_url.json"))
    assert.are.equal("https://images.example.org/generated/abc123.png", images[1].url)
    assert.matches("https://images.example.org/generated/abc123.png", image.summarize(images))
  end)

  it("parses base64 images and reports their size", function()
    local images = image.parse_response(fx.load("image_b64.json"))
    assert.is_string(images[1].b64_json)
    assert.are.equal(70, images[1].bytes)
    assert.matches("base64 이미지 %(1 KB%)", image.summarize(images))
  end)

  it("rejects responses without images", function()
    assert.has_error(function() image.parse_response({ data = { {} } }) end,
      "image_generation: response data[] holds no url or b64_json")
    assert.has_error(function() image.parse_response({ error = { message = "x" } }) end,
      "image_generation: response has no data[] array")
  end)

  it("reports unavailable offline", function()
    local c = image.run({ message = "분리배출 인포그래픽 그려줘" }, fx.offline_ctx()).contexts.image_generation
    assert.is_false(c.ok)
    assert.is_true(c.unavailable)
    assert.matches("오프라인이라 이미지를 만들 수 없습니다", c.text)
  end)
end)
