-- character: the app's character collection — which characters exist and
-- how to get them. A failing character service ends the run (fail_close).
-- Online (contract in docs/adapters.md):
--   GET {MOONGRAPH_CHARACTER_BASE_URL}/v1/characters?query=&limit=
--   Authorization: Bearer <MOONGRAPH_CHARACTER_API_KEY>  -> {characters[], total}
-- Offline: the sample collection in data/samples/characters.json.
local adapter = require "nodes.lib.adapter"
local korean = require "nodes.lib.korean"
local data = require "nodes.lib.data"

local concat = table.concat

local _M = {
  name = "character",
  policy = "fail_close",
  timeout = 5,
  limit = 5,
}

-- Pure: the search request.
function _M.build_request(cfg, query, limit)
  return adapter.json_get(cfg, "/v1/characters", { query = query, limit = limit or _M.limit }, _M.timeout)
end

local function character(c)
  return {
    id = adapter.str(c.id), name = c.name, category = adapter.str(c.category),
    description = adapter.str(c.description), how_to_get = adapter.str(c.how_to_get),
    rarity = adapter.str(c.rarity), owned = c.owned == true or nil,
  }
end

-- Pure: decoded response -> { characters = {...}, total = n }.
function _M.parse_response(body)
  local list = type(body) == "table" and body.characters
  if type(list) ~= "table" then
    error("character: response has no characters[] array", 0)
  end
  local out = {}
  for _, c in ipairs(list) do
    if type(c) == "table" and adapter.str(c.name) then out[#out + 1] = character(c) end
  end
  return { characters = out, total = adapter.num(body.total) or #out }
end

-- Characters of the sample collection the question mentions (by name,
-- category or keyword); none mentioned -> empty list.
function _M.match(characters, message)
  local asked = korean.matcher(message)
  local out = {}
  for _, c in ipairs(characters) do
    local words = { c.name, c.category }
    for _, k in ipairs(c.keywords or {}) do words[#words + 1] = k end
    for _, w in ipairs(words) do
      if w and asked:mentions(w) then out[#out + 1] = c; break end
    end
  end
  return out
end

function _M.summarize(chars, heading)
  local lines = { heading }
  for _, c in ipairs(chars) do
    lines[#lines + 1] = ("- %s (%s%s): %s 얻는 법: %s"):format(c.name, c.category or "?",
      c.rarity and (", " .. c.rarity) or "", c.description or "", c.how_to_get or "정보 없음")
  end
  return concat(lines, "\n")
end

function _M.offline(message)
  local doc = data.require("samples/characters.json")
  local found = _M.match(doc.characters, message)
  local text, list
  if #found > 0 then
    list = found
    text = _M.summarize(found, "캐릭터 정보 (샘플 데이터 — 예시 캐릭터입니다):")
  else
    list = doc.characters
    local names = {}
    for i, c in ipairs(doc.characters) do names[i] = c.name end
    text = ("캐릭터 컬렉션 (샘플 데이터 — 예시 캐릭터입니다): %s\n캐릭터 %d종: %s")
      :format(doc.collection.how_it_works, #names, concat(names, ", "))
  end
  local out = {}
  for i, c in ipairs(list) do out[i] = character(c) end
  return {
    ok = true, source = "sample", sample = true, text = text,
    data = { characters = out, matched = #found > 0, notice = doc.notice,
             how_it_works = doc.collection.how_it_works },
  }
end

function _M.run(state, ctx)
  local message = state and state.message or ""
  local cfg = adapter.config("character", ctx, nil)
  if not cfg.online then
    return { contexts = { character = _M.offline(message) } }
  end
  local res = _M.parse_response(adapter.fetch("character", _M.build_request(cfg, message)))
  local text
  if #res.characters == 0 then
    text = "캐릭터 서비스에서 질문과 맞는 캐릭터를 찾지 못했습니다."
  else
    text = _M.summarize(res.characters, "캐릭터 정보:")
  end
  return {
    contexts = {
      character = {
        ok = true, source = "character", sample = false, text = text,
        data = { characters = res.characters, total = res.total },
      },
    },
  }
end

return _M
