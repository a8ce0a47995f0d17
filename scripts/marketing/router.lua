-- The intent router (rule based) and the store name found in a question.

local rules = require "scripts.marketing.rules"

local _M = {}

--[[ classify(query [, r]) -> intent, hits
The intent with the most keyword hits in the lower-cased query; ties go to
the earlier intent of rules.intents; no hit is rules.default_intent. ]]
function _M.classify(query, r)
  r = r or rules
  local q = tostring(query or ""):lower()
  local best, best_hits = r.default_intent, 0
  for _, it in ipairs(r.intents) do
    local hits = 0
    for _, k in ipairs(it.keywords) do
      if q:find(k, 1, true) then hits = hits + 1 end
    end
    if hits > best_hits then best, best_hits = it.name, hits end
  end
  return best, best_hits
end

-- Korean particles that may follow a store name ("본죽의", "본죽은")
local PARTICLES = { "에서", "이랑", "은", "는", "이", "가", "을", "를", "의", "에", "도", "만", "랑", "과", "와" }

local function strip_particle(word)
  for _, p in ipairs(PARTICLES) do
    if #word > #p + 3 and word:sub(-#p) == p then return word:sub(1, -#p - 1) end
  end
  return nil
end

--[[ store_name_in(query, search) -> name | nil [, err]
The longest run of words of the query (3, 2, then 1 words, left to right)
for which search(name) finds a merchant, trying each word also without a
trailing particle: "본죽 문제점이 뭐야?" -> "본죽". A failed search
returns nil, its error. ]]
function _M.store_name_in(query, search)
  local words = {}
  for w in tostring(query or ""):gsub("[%?!%.,]", " "):gmatch("%S+") do words[#words + 1] = w end
  for n = math.min(3, #words), 1, -1 do
    for i = 1, #words - n + 1 do
      local phrase = table.concat(words, " ", i, i + n - 1)
      local tries = { phrase }
      local stripped = strip_particle(words[i + n - 1])
      if stripped then
        tries[2] = (n > 1 and (table.concat(words, " ", i, i + n - 2) .. " ") or "") .. stripped
      end
      for _, t in ipairs(tries) do
        local r = search(t)
        if r.error then return nil, r.error end
        if r.found then return t end
      end
    end
  end
  return nil
end

return _M
