-- web_search: fresh information from the web (policies, news, rules the
-- local dataset does not cover); also the fallback of waste_rag.
-- Online: Tavily  POST {MOONGRAPH_TAVILY_BASE_URL}/search {query, max_results}
--   Authorization: Bearer <MOONGRAPH_TAVILY_API_KEY>
-- Offline the web cannot be searched: the node says it is unavailable.
local adapter = require "nodes.lib.adapter"

local concat = table.concat

local _M = {
  name = "web_search",
  policy = "fail_open",
  timeout = 10,
  default_base_url = "https://api.tavily.com",
  max_results = 5,
  snippet_chars = 160, -- characters of each result's content kept in the summary
}

-- Pure: the Tavily search request.
function _M.build_request(cfg, query, max_results)
  if type(query) ~= "string" or query:match("^%s*$") then
    error("bad argument #2 to 'build_request': non-empty query string expected", 2)
  end
  local headers = { ["Content-Type"] = "application/json" }
  if cfg.api_key then headers.Authorization = "Bearer " .. cfg.api_key end
  return {
    method = "POST",
    url = cfg.base_url .. "/search",
    headers = headers,
    json = { query = query, max_results = max_results or _M.max_results },
    timeout = cfg.timeout or _M.timeout,
  }
end

-- Pure: decoded Tavily response -> list of {title, url, content}.
function _M.parse_response(body)
  local results = type(body) == "table" and body.results
  if type(results) ~= "table" then
    error("web_search: Tavily response has no results[] array", 0)
  end
  local out = {}
  for _, r in ipairs(results) do
    if type(r) == "table" and adapter.str(r.url) then
      out[#out + 1] = {
        title = adapter.str(r.title) or r.url,
        url = r.url,
        content = adapter.str(r.content) or "",
        score = adapter.num(r.score),
      }
    end
  end
  return out
end

-- First n characters (UTF-8 aware) of s, with an ellipsis when cut.
local function clip(s, n)
  s = s:gsub("%s+", " ")
  if (utf8.len(s) or #s) <= n then return s end
  return s:sub(1, (utf8.offset(s, n + 1) or (#s + 1)) - 1) .. "…"
end

function _M.summarize(results)
  local lines = { "웹 검색 결과:" }
  for i, r in ipairs(results) do
    if i > 3 then break end
    lines[#lines + 1] = ("%d. %s — %s (%s)"):format(i, r.title, clip(r.content, _M.snippet_chars), r.url)
  end
  return concat(lines, "\n")
end

function _M.run(state, ctx)
  local cfg = adapter.config("tavily", ctx, _M.default_base_url)
  if not cfg.online then
    return {
      contexts = {
        web_search = {
          ok = false, unavailable = true, source = "tavily", sample = false,
          text = "웹 검색: 오프라인이라 웹 검색 결과를 제공할 수 없습니다 (MOONGRAPH_TAVILY_API_KEY가 설정되지 않았습니다).",
          data = {},
        },
      },
    }
  end
  local query = state and state.message
  if type(query) ~= "string" or query:match("^%s*$") then
    error("web_search: the question (state.message) is empty", 0)
  end
  local results = _M.parse_response(adapter.fetch("web_search", _M.build_request(cfg, query)))
  if #results == 0 then
    error(("web_search: no results for %q"):format(query), 0)
  end
  return {
    contexts = {
      web_search = {
        ok = true, source = "tavily", sample = false,
        text = _M.summarize(results),
        data = { query = query, results = results },
      },
    },
  }
end

return _M
