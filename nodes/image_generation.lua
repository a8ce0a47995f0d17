-- image_generation: an illustration or infographic for the user's request.
-- Online: OpenAI-compatible images API
--   POST {MOONGRAPH_IMAGE_BASE_URL}/v1/images/generations {model, prompt, size}
--   Authorization: Bearer <MOONGRAPH_IMAGE_API_KEY>  -> data[]{url | b64_json}
-- The prompt template is prompts/image_generation.txt ({{message}} is replaced).
-- Offline no image can be made: the node says it is unavailable.
local adapter = require "nodes.lib.adapter"
local prompts = require "moongraph.prompt"

local _M = {
  name = "image_generation",
  policy = "fail_open",
  timeout = 60,
  default_base_url = "https://api.openai.com",
  default_model = "gpt-image-1",
  size = "1024x1024",
}

-- Pure: the prompt for a user request, from the template text -> text | nil, err
function _M.prompt(template, message)
  return prompts.render(template, { message = message }, "image_generation.txt")
end

-- Pure: the images request.
function _M.build_request(cfg, prompt, size)
  if type(prompt) ~= "string" or prompt == "" then
    error("bad argument #2 to 'build_request': non-empty prompt expected", 2)
  end
  local headers = { ["Content-Type"] = "application/json" }
  if cfg.api_key then headers.Authorization = "Bearer " .. cfg.api_key end
  return {
    method = "POST",
    url = cfg.base_url .. "/v1/images/generations",
    headers = headers,
    json = { model = cfg.model or _M.default_model, prompt = prompt, size = size or _M.size },
    timeout = cfg.timeout or _M.timeout,
  }
end

-- Pure: decoded response -> list of {url} or {b64_json, bytes}.
function _M.parse_response(body)
  local list = type(body) == "table" and body.data
  if type(list) ~= "table" then
    error("image_generation: response has no data[] array", 0)
  end
  local out = {}
  for _, d in ipairs(list) do
    if type(d) == "table" then
      local url, b64 = adapter.str(d.url), adapter.str(d.b64_json)
      if url then
        out[#out + 1] = { url = url, revised_prompt = adapter.str(d.revised_prompt) }
      elseif b64 then
        local pad = #(b64:match("=*$"))
        out[#out + 1] = { b64_json = b64, bytes = math.floor(#b64 * 3 / 4) - pad,
                          revised_prompt = adapter.str(d.revised_prompt) }
      end
    end
  end
  if #out == 0 then
    error("image_generation: response data[] holds no url or b64_json", 0)
  end
  return out
end

function _M.summarize(images)
  local lines = { ("이미지 %d개를 생성했습니다."):format(#images) }
  for i, im in ipairs(images) do
    if im.url then
      lines[#lines + 1] = ("%d. %s"):format(i, im.url)
    else
      lines[#lines + 1] = ("%d. base64 이미지 (%d KB)"):format(i, math.ceil(im.bytes / 1024))
    end
  end
  return table.concat(lines, "\n")
end

function _M.run(state, ctx)
  local cfg = adapter.config("image", ctx, _M.default_base_url)
  if not cfg.online then
    return {
      contexts = {
        image_generation = {
          ok = false, unavailable = true, source = "image", sample = false,
          text = "이미지 생성: 오프라인이라 이미지를 만들 수 없습니다 (MOONGRAPH_IMAGE_API_KEY가 설정되지 않았습니다).",
          data = {},
        },
      },
    }
  end
  local message = state and state.message
  if type(message) ~= "string" or message:match("^%s*$") then
    error("image_generation: the request (state.message) is empty", 0)
  end
  local template, terr = prompts.load("image_generation.txt")
  if not template then error("image_generation: " .. terr, 0) end
  local prompt, perr = _M.prompt(template, message)
  if not prompt then error("image_generation: " .. perr, 0) end
  local images = _M.parse_response(adapter.fetch("image_generation", _M.build_request(cfg, prompt)))
  return {
    contexts = {
      image_generation = {
        ok = true, source = "image", sample = false,
        text = _M.summarize(images),
        data = { prompt = prompt, model = cfg.model or _M.default_model, images = images },
      },
    },
  }
end

return _M
