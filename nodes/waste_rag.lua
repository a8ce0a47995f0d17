-- waste_rag: retrieval over the local disposal-rule asset (data/waste_rules.json).
-- Korean-aware matching of the question against item names and aliases
-- (particle stripping, spacing variants, substring and character-bigram
-- similarity), a relevance score per item and a retrieval-quality summary.
-- When nothing relevant is found it raises, so the node's fallback policy
-- hands the question to web_search.
local korean = require "nodes.lib.korean"
local data = require "nodes.lib.data"
local filecache = require "moongraph.filecache"
local alias_index = require "nodes.lib.alias_index"

local ipairs, concat, sort, min = ipairs, table.concat, table.sort, math.min

local _M = {
  name = "waste_rag",
  policy = { fallback = "web_search" },
  timeout = 2,
}

_M.defaults = {
  min_score = 0.5,  -- below this nothing is considered relevant
  spread = 0.2,     -- keep results within this distance of the best score
  top_k = 3,
}

local index -- { doc, entries = { {item} }, aliases = alias_index, cache }

local function gram_counts(text)
  local counts, n = {}, 0
  for _, g in ipairs(korean.bigrams(text)) do
    counts[g] = (counts[g] or 0) + 1
    n = n + 1
  end
  return counts, n
end

-- The normalised aliases of the rules file, in order: { {entry, text}, ... }
-- (each item's name and aliases, compacted, without repeats per item).
local function normalised_aliases(doc)
  local out = {}
  for ei, item in ipairs(doc.items) do
    local seen = {}
    local names = { item.name }
    for _, a in ipairs(item.aliases or {}) do names[#names + 1] = a end
    for _, n in ipairs(names) do
      local t = korean.compact(n)
      if t ~= "" and not seen[t] then
        seen[t] = true
        out[#out + 1] = { entry = ei, text = t }
      end
    end
  end
  return out
end

local INDEX_FORMAT = "waste_rag alias index 1"

-- The alias index of the rules file, kept between processes by
-- moongraph.filecache: valid only while the rules file and the code that
-- builds the index (this file, nodes/lib/korean.lua, nodes/lib/alias_index.lua)
-- are byte for byte those it came from. -> index, how it was had
local function alias_index_of(doc, text, path)
  local function build() return alias_index.encode(normalised_aliases(doc)) end
  local inputs = { INDEX_FORMAT, text or "" }
  for _, fn in ipairs { normalised_aliases, korean.compact, alias_index.encode } do
    inputs[#inputs + 1] = filecache.source_of(fn)
  end
  local bytes, how
  if text and inputs[5] then
    bytes, how = filecache.fetch { name = "waste_rag_index", key = path, inputs = inputs, build = build }
  else
    bytes, how = build(), "built, sources unreadable"
  end
  local ix = alias_index.open(bytes)
  if not ix then
    ix, how = assert(alias_index.open(build())), "built, cached entry unreadable"
  end
  return ix, how
end

-- The index of the rules file (built once per process): the decoded rules,
-- and their aliases by exact text and by character bigram, so a query only
-- touches the aliases it shares something with. index().cache says how the
-- alias index was had ("hit": from the file cache).
function _M.index()
  if index then return index end
  local doc, text = data.require("waste_rules.json")
  if type(doc.items) ~= "table" or #doc.items == 0 then
    error("waste_rag: data/waste_rules.json has no items", 0)
  end
  local aliases, how = alias_index_of(doc, text, data.path("waste_rules.json"))
  local entries = {}
  for ei, item in ipairs(doc.items) do entries[ei] = { item = item } end
  index = { doc = doc, entries = entries, aliases = aliases, cache = how }
  return index
end

-- Query candidates: every token variant, adjacent-pair joins and the join of
-- all content tokens ("페트 병" -> "페트병", "깨진 유리를" -> "깨진유리").
local function candidates(tokens)
  local out, seen = {}, {}
  local function add(text, first, last)
    local key = text .. "\0" .. first .. "\0" .. last
    if text ~= "" and not seen[key] then
      seen[key] = true
      local grams, ngrams = gram_counts(text)
      out[#out + 1] = { text = text, len = korean.len(text), first = first, last = last,
                        grams = grams, ngrams = ngrams }
    end
  end
  for i, t in ipairs(tokens) do
    for _, v in ipairs(t.variants) do add(v, i, i) end
    if i > 1 then
      for _, v in ipairs(t.variants) do add(tokens[i - 1].text .. v, i - 1, i) end
    end
  end
  if #tokens > 2 then
    local head = {}
    for i = 1, #tokens - 1 do head[i] = tokens[i].text end
    local h = concat(head)
    for _, v in ipairs(tokens[#tokens].variants) do add(h .. v, 1, #tokens) end
  end
  return out
end

-- Score of one alias against one candidate sharing `common` bigrams, 0..1,
-- and whether the match explains the whole candidate (false when the alias
-- is only a part of it).
local function match(alias, cand, common)
  local a, c = alias.text, cand.text
  if a == c then return 1, true end
  local dice = 2 * common / (alias.ngrams + cand.ngrams)
  -- short Latin aliases ("pp", "pet") only match whole words or near-spellings
  if alias.ascii then
    if alias.len >= 3 and cand.len >= 3 and dice >= 0.5 then return 0.85 * dice, true end
    return 0, false
  end
  if cand.len >= 2 and alias.len > cand.len and korean.contains(a, c) then
    return 0.5 + 0.35 * cand.len / alias.len, true
  end
  if alias.len >= 2 and cand.len > alias.len and korean.contains(c, a) then
    return 0.75 + 0.25 * alias.len / cand.len, false
  end
  if alias.len >= 2 and cand.len >= 2 and dice >= 0.5 then
    return 0.85 * dice, true
  end
  return 0, false
end

local NONE = {}
local function by_id(a, b) return a.id < b.id end

-- Ranks the rule items for a question. Returns the kept results (best
-- first), each { item, score, matched = alias, coverage, pos }, every scored
-- result, and the number of content tokens found in the question.
function _M.search(query, opts)
  if type(query) ~= "string" then
    error("bad argument #1 to 'search': string expected, got " .. type(query), 2)
  end
  opts = opts or {}
  local idx = _M.index()
  local tokens = korean.content_tokens(query)
  local cands = candidates(tokens)
  local whole = korean.compact(query)
  local content_len = 0
  for _, t in ipairs(tokens) do content_len = content_len + korean.len(t.variants[#t.variants]) end

  local state = {} -- entry index -> { best, alias, pos, covered }
  local function note(al, s, pos, first, last, covers)
    local st = state[al.entry]
    if not st then st = { best = 0, pos = math.huge, covered = {} }; state[al.entry] = st end
    if covers then for i = first, last do st.covered[i] = true end end
    if s > st.best or (s == st.best and pos < st.pos) then
      st.best, st.alias, st.pos = s, al.text, pos
    end
  end

  local ix = idx.aliases
  for _, c in ipairs(cands) do
    -- the aliases sharing the candidate's text or a bigram, with the
    -- bigrams they share; taken in alias order, so ties go to the alias
    -- listed first
    local common, found = {}, {}
    for _, al in ipairs(ix:with_text(c.text) or NONE) do
      if not common[al] then common[al] = 0; found[#found + 1] = al end
    end
    for g, n in pairs(c.grams) do
      for _, hit in ipairs(ix:with_gram(g) or NONE) do
        local al = hit[1]
        local k = common[al]
        if not k then found[#found + 1] = al; k = 0 end
        common[al] = k + min(n, hit[2])
      end
    end
    if found[2] then sort(found, by_id) end
    for _, al in ipairs(found) do
      local s, whole_cand = match(al, c, common[al])
      if s >= 0.5 then
        -- a joined candidate only counts as covered when the alias explains all of it
        note(al, s, c.first, c.first, c.last, whole_cand or c.first == c.last)
      end
    end
  end
  -- aliases spanning words the tokenizer dropped ("음식물 쓰레기"): an alias
  -- of two or more characters inside the question shares its first bigram
  -- with it, so only those aliases are tried, in alias order
  local tried, spanning = {}, {}
  for _, g in ipairs(korean.bigrams(whole)) do
    for _, hit in ipairs(ix:with_gram(g) or NONE) do
      local al = hit[1]
      if not tried[al] then
        tried[al] = true
        if al.len >= 2 and not al.stop and not al.ascii then spanning[#spanning + 1] = al end
      end
    end
  end
  if spanning[2] then sort(spanning, by_id) end
  for _, al in ipairs(spanning) do
    local p = whole:find(al.text, 1, true)
    if p then
      note(al, 0.75 + 0.25 * min(1, al.len / math.max(1, content_len)), 0.5 + p / #whole, 1, 0, false)
    end
  end

  local results = {}
  for ei, st in pairs(state) do
    local e = idx.entries[ei]
    local ncov = 0
    for i = 1, #tokens do if st.covered[i] then ncov = ncov + 1 end end
    local coverage = #tokens > 0 and ncov / #tokens or 1
    local score = st.best * (0.8 + 0.2 * coverage)
    if e.item.generic then score = score * 0.95 end
    results[#results + 1] = {
      item = e.item, score = score, matched = st.alias, coverage = coverage, pos = st.pos,
    }
  end
  sort(results, function(x, y)
    if x.score ~= y.score then return x.score > y.score end
    if x.pos ~= y.pos then return x.pos < y.pos end
    return x.item.id < y.item.id
  end)
  local limit = opts.top_k or _M.defaults.top_k
  local floor_score = opts.min_score or _M.defaults.min_score
  local spread = opts.spread or _M.defaults.spread
  local kept = {}
  for _, r in ipairs(results) do
    if #kept >= limit then break end
    if r.score < floor_score then break end
    if #kept > 0 and r.score < kept[1].score - spread then break end
    kept[#kept + 1] = r
  end
  return kept, results, #tokens
end

-- Retrieval quality of a result list (the seed's RAG quality idea applied to
-- the retrieval step): relevance of the best hit, how much of the question
-- it explains, and a coarse level.
function _M.quality(results)
  local top = results[1]
  if not top then return { relevance = 0, coverage = 0, level = "none" } end
  local level = top.score >= 0.85 and "high" or top.score >= 0.65 and "medium" or "low"
  return { relevance = top.score, coverage = top.coverage, level = level }
end

local function round(x) return math.floor(x * 1000 + 0.5) / 1000 end

-- Short Korean summary of the results for the answer step.
function _M.summarize(results)
  local top = results[1].item
  local lines = {}
  lines[#lines + 1] = ("%s: %s"):format(top.name, top.how)
  lines[#lines + 1] = ("배출: %s%s"):format(top.bin, top.mark and (" (분리배출 표시: " .. top.mark .. ")") or "")
  if top.steps and #top.steps > 0 then
    lines[#lines + 1] = "준비: " .. concat(top.steps, " ")
  end
  if top.cautions and #top.cautions > 0 then
    lines[#lines + 1] = "주의: " .. concat(top.cautions, " ")
  end
  for i = 2, #results do
    local it = results[i].item
    lines[#lines + 1] = ("함께 찾은 품목 — %s: %s"):format(it.name, it.how)
  end
  return concat(lines, "\n")
end

function _M.run(state, ctx)
  local message = state and state.message
  if type(message) ~= "string" or message:match("^%s*$") then
    error("waste_rag: the question (state.message) is empty", 0)
  end
  local opts = ctx and ctx.config and ctx.config.waste_rag or nil
  local results, all, ntokens = _M.search(message, opts)
  if #results == 0 then
    local best = all[1]
    error(("waste_rag: no disposal rule matches %q (best score %.2f, needed %.2f)")
      :format(message, best and best.score or 0, (opts and opts.min_score) or _M.defaults.min_score), 0)
  end
  local out = {}
  for i, r in ipairs(results) do
    local it = r.item
    out[i] = {
      id = it.id, name = it.name, category = it.category, disposal = it.disposal,
      bin = it.bin, how = it.how, steps = it.steps, cautions = it.cautions, mark = it.mark,
      score = round(r.score), matched = r.matched,
    }
  end
  local q = _M.quality(results)
  q.relevance = round(q.relevance)
  q.coverage = round(q.coverage)
  q.query_tokens = ntokens
  return {
    contexts = {
      waste_rag = {
        ok = true,
        source = "local",
        sample = false,
        text = _M.summarize(results),
        data = { items = out, quality = q },
      },
    },
  }
end

-- Drops the cached index (after editing the rules file in a session).
function _M.reload()
  index = nil
  data.clear_cache()
end

return _M
