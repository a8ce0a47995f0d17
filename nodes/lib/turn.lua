-- What one turn of the Eco² pipeline gathered, in the form the answer and
-- feedback nodes use: the usable contexts as titled sections (in the order
-- the nodes ran, state.nodes_run from the aggregator), and the notices every
-- answer carries — what could not be fetched, and which contexts are sample
-- data.
local ipairs, pairs, type, tostring, concat = ipairs, pairs, type, tostring, table.concat

local _M = {}

-- What each node's context is, for logs and the answer's headings.
_M.descriptions = {
  waste_rag = "분리배출 방법",
  character = "캐릭터 정보",
  location = "장소 정보",
  web_search = "웹 검색 결과",
  bulk_waste = "대형폐기물 정보",
  recyclable_price = "재활용 시세",
  weather = "날씨 정보",
  collection_point = "수거함 위치",
  image_generation = "이미지 생성",
  general = "일반 대화",
  clarify = "다시 질문 요청",
}

function _M.describe(node)
  return _M.descriptions[node] or node
end

-- The particle that fits after a Korean word: josa("위치", "은", "는") ->
-- "는", josa("방법", "은", "는") -> "은"; ("으로", "로") treats a final ㄹ
-- like no final consonant. Non-Hangul endings get "a(b)" ("은(는)").
function _M.josa(word, with_final, without_final)
  local last
  for _, c in utf8.codes(word or "") do last = c end
  if not last or last < 0xAC00 or last > 0xD7A3 then
    return with_final .. "(" .. without_final .. ")"
  end
  local final = (last - 0xAC00) % 28
  if final == 0 or (with_final == "으로" and final == 8) then return without_final end
  return with_final
end

-- The nodes of the turn in order: the aggregator's nodes_run, or (before
-- it ran) the routed nodes with a context, then the other contexts by name.
local function order_of(state)
  if type(state.nodes_run) == "table" and #state.nodes_run > 0 then return state.nodes_run end
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  local order, seen = {}, {}
  for _, d in ipairs(type(state.routing) == "table" and state.routing or {}) do
    if type(d) == "table" and contexts[d.node] ~= nil and not seen[d.node] then
      seen[d.node] = true
      order[#order + 1] = d.node
    end
  end
  local rest = {}
  for node in pairs(contexts) do
    if not seen[node] then rest[#rest + 1] = node end
  end
  table.sort(rest)
  for _, node in ipairs(rest) do order[#order + 1] = node end
  return order
end

-- { {node, heading, text, sample, fallback_of}, ... } of the contexts with
-- something to say (clarify excluded: it is an answer of its own).
function _M.sections(state)
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  local out = {}
  for _, node in ipairs(order_of(state)) do
    local c = contexts[node]
    if node ~= "clarify" and type(c) == "table" and c.ok and type(c.text) == "string" then
      local heading = _M.describe(node)
      if c.sample then heading = heading .. " (샘플 데이터)" end
      out[#out + 1] = { node = node, heading = heading, text = c.text, sample = c.sample == true,
                        source = c.source }
    end
  end
  -- a fallback says whom it stands in for
  local failures = {}
  for node, c in pairs(contexts) do
    if type(c) == "table" and c.fallback then failures[c.fallback] = node end
  end
  for _, s in ipairs(out) do
    local origin = failures[s.node]
    if origin then
      s.fallback_of = origin
      local o = _M.describe(origin)
      s.heading = s.heading .. " — " .. o .. _M.josa(o, "을", "를") .. " 찾지 못해 대신 가져왔습니다"
    end
  end
  return out
end

-- The missing list: aggregate.missing when the aggregator ran, else derived.
local function missing_of(state)
  local agg = state.aggregate
  if type(agg) == "table" and type(agg.missing) == "table" then return agg.missing end
  return {}
end

-- Notice lines ("※ ...") for what could not be fetched and for sample data.
-- sections: the turn's sections (_M.sections(state)) when the caller has
-- them already. A failure is named, never quoted: the end user reads the
-- answer, and an upstream's error (its address, its reply) is for the
-- operator (state.aggregate.missing keeps it, the server logs it).
function _M.notices(state, sections)
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  local lines = {}
  for _, m in ipairs(missing_of(state)) do
    local c = contexts[m.node]
    local what = _M.describe(m.node)
    local why
    if m.status == "unavailable" and type(c) == "table" and type(c.text) == "string" then
      -- the node's own text says why ("날씨 정보: 오프라인이라 ...")
      why = c.text:gsub("^[^:]*:%s*", "")
    elseif m.fallback and (contexts[m.fallback] or {}).ok then
      local fb = _M.describe(m.fallback)
      why = "찾지 못해 " .. fb .. _M.josa(fb, "으로", "로") .. " 대신했습니다"
    elseif tostring(m.reason):find("no disposal rule matches", 1, true) then
      why = "질문에 맞는 분리배출 규정을 찾지 못했습니다"
    else
      why = "가져오지 못했습니다"
    end
    lines[#lines + 1] = "※ " .. what .. ": " .. why
  end
  local samples = {}
  for _, s in ipairs(sections or _M.sections(state)) do
    if s.sample then samples[#samples + 1] = _M.describe(s.node) end
  end
  if #samples > 0 then
    lines[#lines + 1] = "※ 샘플 데이터: " .. concat(samples, ", ")
      .. _M.josa(samples[#samples], "은", "는") .. " 내장된 예시 데이터로, 실제 정보가 아닙니다."
  end
  return lines
end

-- The contexts as one text block ("[heading]\ntext" per section).
function _M.render(sections)
  local parts = {}
  for _, s in ipairs(sections) do
    parts[#parts + 1] = "[" .. s.heading .. "]\n" .. s.text
  end
  return concat(parts, "\n")
end

return _M
