-- Intent classification of the Eco² chat pipeline's intent node.
--
-- classify(message, opts) -> result
--   opts.rules          the rule tables, as data (required): keyword_map
--                       (intent -> keywords), transitions (previous intent ->
--                       {intent = boost}), multi_intent (how messages are cut
--                       into clauses); scripts/eco/ holds the Eco² ones
--   opts.prev_intent    the previous turn's intent (Chain-of-Intent boost)
--   opts.user_location  the user's location, if known (part of the cache key)
--   opts.llm            an LLM client (llm:chat{messages, json_schema}); without
--                       one, or when the call fails, the offline classifier
--                       decides and explain.fallback_reason says why
--   opts.llm_timeout    seconds the LLM call may take (default _M.llm_timeout,
--                       MOONGRAPH_INTENT_LLM_TIMEOUT or 10)
--   opts.cache          an intent cache (new_cache(), any object with get/set,
--                       or a plain table), false for none; the module's
--                       shared LRU by default. Only LLM answers are cached.
--   opts.model          a classifier model (nodes.lib.intent_model); the one
--                       trained from data/intents.jsonl by default
--
-- Returns nil, err only when there is no LLM answer and the offline
-- classifier's data cannot be read.
--
-- result = { intent, additional_intents, confidence, is_multi,
--            complexity = "simple" | "complex", source = "llm" | "offline",
--            explain = { scores, transition_boost, keyword_adjustments,
--                        clauses, fallback_reason, cache, ... } }
--
-- Offline: the calibrated classifier scores every intent; the transition
-- boost of the previous intent is added to each candidate's score and the
-- best boosted candidate wins; its confidence is then calibrated by the
-- keyword map (+0.1 per keyword found, at most +0.2; -0.1 when none is).
-- The prompt of the LLM path is prompts/intent.txt.

local classifier = require "nodes.lib.intent_model"

local cjson = require "cjson"
local prompts = require "moongraph.prompt"

local type, ipairs, pairs, error, pcall, tostring, tonumber =
  type, ipairs, pairs, error, pcall, tostring, tonumber
local concat, sort = table.concat, table.sort
local find, sub, lower, gsub, byte = string.find, string.sub, string.lower, string.gsub, string.byte
local min, max = math.min, math.max

local _M = {}

_M.INTENTS = classifier.INTENTS

local KNOWN = {}
for _, c in ipairs(_M.INTENTS) do KNOWN[c] = true end

-- Is `name` one of the nine intents?
function _M.is_intent(name)
  return KNOWN[name] == true
end

local function is_set(v)
  return v ~= nil and v ~= cjson.null
end

local function clamp01(x)
  if x < 0 then return 0 end
  if x > 1 then return 1 end
  return x
end

local POW10 = { [2] = 10 ^ 2, [4] = 10 ^ 4 }

-- (floor division by 1 is math.floor without a call)
local function round(x, digits)
  digits = digits or 4
  local m = POW10[digits] or 10 ^ digits
  return (x * m + 0.5) // 1 / m
end

------------------------------------------------------------------------
-- Intent cache: a bounded LRU keyed by message and context.
------------------------------------------------------------------------

local Cache = {}
Cache.__index = Cache

-- A least-recently-used cache of at most `capacity` entries (default 256).
function _M.new_cache(capacity)
  capacity = capacity or 256
  if type(capacity) ~= "number" or capacity < 1 then
    error("bad argument #1 to 'new_cache': capacity must be a positive number", 2)
  end
  return setmetatable({ capacity = capacity, map = {}, size = 0, tick = 0 }, Cache)
end

function Cache:get(key)
  local e = self.map[key]
  if not e then return nil end
  self.tick = self.tick + 1
  e.used = self.tick
  return e.value
end

function Cache:set(key, value)
  local e = self.map[key]
  self.tick = self.tick + 1
  if e then
    e.value, e.used = value, self.tick
    return
  end
  if self.size >= self.capacity then
    -- evict the least recently used entry
    local oldest, ok = nil, nil
    for k, v in pairs(self.map) do
      if not oldest or v.used < oldest then oldest, ok = v.used, k end
    end
    self.map[ok] = nil
    self.size = self.size - 1
  end
  self.map[key] = { value = value, used = self.tick }
  self.size = self.size + 1
end

function Cache:clear()
  self.map, self.size = {}, 0
end

-- The cache classify() uses when opts.cache is not given.
_M.cache = _M.new_cache(512)

-- A cache is an intent.new_cache() or any object with get/set methods; a
-- plain table works too (unbounded, keyed like the LRU).
local function cache_get(cache, key)
  if type(cache.get) == "function" then return cache:get(key) end
  return cache[key]
end

local function cache_set(cache, key, value)
  if type(cache.set) == "function" then return cache:set(key, value) end
  cache[key] = value
end

local function cache_key(message, prev_intent, has_location)
  return concat({ message, prev_intent or "", has_location and "1" or "0" }, "\31")
end

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deep_copy(x) end
  return out
end

------------------------------------------------------------------------
-- Keyword calibration and transition boosts
------------------------------------------------------------------------

-- Views of the rule lists made once per list (rules are data that do not
-- change between messages; a list that grows or shrinks is read again):
-- view(list) -> the view made by make(list), or of an empty list.
local EMPTY = {}
local function list_view(make)
  local views = setmetatable({}, { __mode = "k" })
  return function(list)
    list = list or EMPTY
    local v = views[list]
    if not v or v.n ~= #list then
      v = make(list)
      v.n = #list
      views[list] = v
    end
    return v
  end
end

-- the words of a list lower-cased (made once per list, see list_view)
local lowered_words = list_view(function(list)
  local out = {}
  for i = 1, #list do out[i] = lower(list[i]) end
  return { words = out }
end)

-- Keywords of `intent` found in the message, and the confidence delta.
function _M.keyword_adjustment(message, intent, keyword_map)
  if type(keyword_map) ~= "table" then
    error("bad argument #3 to 'keyword_adjustment': keyword map table expected", 2)
  end
  local text = lower(message)
  local matched = {}
  local list = keyword_map[intent]
  local lowered = lowered_words(list).words
  for i = 1, #lowered do
    if find(text, lowered[i], 1, true) then matched[#matched + 1] = list[i] end
  end
  local delta
  if #matched == 0 then
    delta = -0.1
  else
    delta = min(0.1 * #matched, 0.2)
  end
  return { intent = intent, matched = matched, delta = round(delta, 2) }
end

-- Boosts from the previous intent: {candidate = boost}, possibly empty.
local function boosts_from(transitions, prev_intent)
  if not prev_intent then return {} end
  local t = transitions[prev_intent]
  return t or {}
end

------------------------------------------------------------------------
-- Clauses
------------------------------------------------------------------------

local function ends_with(word, suffix)
  return #word > #suffix and sub(word, -#suffix) == suffix
end

-- the words of a list as a set
local set_of = list_view(function(list)
  local s = {}
  for _, w in ipairs(list) do s[w] = true end
  return { set = s }
end)

-- the non-empty suffixes of a list by their last byte, in list order, so a
-- word is compared only with those that can end it
local suffixes_ending = list_view(function(list)
  local by = {}
  for _, suf in ipairs(list) do
    if suf ~= "" then
      local b = byte(suf, -1)
      local l = by[b]
      if not l then l = {}; by[b] = l end
      l[#l + 1] = suf
    end
  end
  return { by = by }
end)

-- The first suffix of `list` (suffixes_ending view) that ends word and
-- leaves something before it, or nil.
local function suffix_of(word, view)
  local cands = view.by[byte(word, -1)]
  if not cands then return nil end
  for i = 1, #cands do
    if ends_with(word, cands[i]) then return cands[i] end
  end
  return nil
end

-- Cut a message into clauses at the markers of multi_intent.lua, undoing
-- cuts that would split a list of nouns. Returns a list of
-- {text =, words = {...}, cut = "sentence"|"list"|"conjunction"|"particle"|"verb"|nil}
-- where cut names the marker that ended the clause.
function _M.split(message, mi)
  if type(message) ~= "string" then
    error("bad argument #1 to 'split': expected a string, got " .. type(message), 2)
  end
  if type(mi) ~= "table" then
    error("bad argument #2 to 'split': multi-intent rule table expected", 2)
  end
  local text = message
  -- a mark is replaced only where it occurs (a plain find is cheaper than
  -- a gsub that finds nothing)
  for _, m in ipairs(mi.sentence_marks or {}) do
    if find(text, m, 1, true) then text = gsub(text, m:gsub("%p", "%%%0"), " \1S ") end
  end
  if find(text, ".", 1, true) then
    text = gsub(text, "%.(%s)", " \1S %1")
    text = gsub(text, "%.$", " \1S ")
  end
  for _, m in ipairs(mi.list_marks or {}) do
    if find(text, m, 1, true) then text = gsub(text, m:gsub("%p", "%%%0"), " \1L ") end
  end
  local conj = set_of(mi.conjunction_words).set
  local particles = suffixes_ending(mi.particle_suffixes)
  local verbs = suffixes_ending(mi.verb_suffixes)

  -- raw segments; a segment records the words as written and as used for
  -- classification (joining particles dropped)
  local segs = {}
  local cur = { words = {}, plain = {} }
  local function cut(kind)
    if #cur.words > 0 then
      cur.cut = kind
      segs[#segs + 1] = cur
    elseif kind == "sentence" and segs[#segs] then
      segs[#segs].cut = "sentence"
    end
    cur = { words = {}, plain = {} }
  end
  for tok in text:gmatch("%S+") do
    if tok == "\1S" then
      cut("sentence")
    elseif tok == "\1L" then
      cut("list")
    elseif conj[tok] then
      cut("conjunction")
    else
      local kind, stripped
      local suf = suffix_of(tok, particles)
      if suf then
        kind, stripped = "particle", sub(tok, 1, #tok - #suf)
      elseif suffix_of(tok, verbs) then
        kind, stripped = "verb", tok
      end
      cur.words[#cur.words + 1] = tok
      cur.plain[#cur.plain + 1] = stripped or tok
      if kind then cut(kind) end
    end
  end
  cut(nil)

  -- undo cuts after a lone word joined by a particle, comma or conjunction:
  -- "종이, 캔, 유리병 버리는 법" is one clause
  local need = mi.min_clause_words or 2
  local merged = {}
  local carry
  for _, s in ipairs(segs) do
    local own = #s.words
    if carry then
      local words, plain = {}, {}
      for _, w in ipairs(carry.words) do words[#words + 1] = w; plain[#plain + 1] = w end
      for i, w in ipairs(s.words) do words[#words + 1] = w; plain[#plain + 1] = s.plain[i] end
      s = { words = words, plain = plain, cut = s.cut }
      carry = nil
    end
    local weak = s.cut == "list" or s.cut == "particle" or s.cut == "conjunction"
    if weak and own < need then
      carry = s
    else
      merged[#merged + 1] = s
    end
  end
  if carry then merged[#merged + 1] = carry end

  for _, s in ipairs(merged) do
    s.text = concat(s.plain, " ")
    s.plain = nil
  end
  return merged
end

-- Where an "also" request ("수거함도 알려줘") starts inside a clause's words:
-- the index of the "...도" word, or nil.
local function also_index(words, mi)
  local suffix = mi.also_suffix
  if not suffix then return nil end
  for k = 2, #words do
    local w = words[k]
    if ends_with(w, suffix) then
      for j = k, min(k + 2, #words) do
        for _, r in ipairs(mi.request_words or {}) do
          if find(words[j], r, 1, true) then return k end
        end
      end
    end
  end
  return nil
end

------------------------------------------------------------------------
-- Offline decision
------------------------------------------------------------------------

-- The model's verdict on a text; memo (optional) keeps verdicts within one
-- classification, where the same text is often scored twice.
local function top_of(model, text, memo)
  local t = memo and memo[text]
  if t then return t end
  local ps, best, known = model:probabilities(text)
  t = { ps = ps, known = known, intent = model.labels[best], p = ps[best] }
  if memo then memo[text] = t end
  return t
end

local function char_len(s)
  return utf8.len(s) or #s
end

local function judge_complexity(message, is_multi, nquestions, mi)
  local c = mi.complexity or {}
  if is_multi then return "complex", "several intents" end
  if nquestions > 1 then return "complex", "several questions" end
  if c.max_simple_chars and char_len(message) > c.max_simple_chars then
    return "complex", "long message"
  end
  for _, m in ipairs(c.markers or {}) do
    if find(message, m, 1, true) then return "complex", "asks for \"" .. m .. "\"" end
  end
  return "simple", nil
end

-- Clauses of the message with their classifications, after "also" cuts and
-- dropping pleasantries next to real requests.
local function analyse_clauses(model, message, mi, memo)
  local clauses = _M.split(message, mi)
  local out = {}
  local need = mi.min_clause_words or 2
  for _, cl in ipairs(clauses) do
    -- only a message without any other marker is searched for an "also" cut
    local k = #clauses == 1 and also_index(cl.words, mi)
    local done = false
    if k then
      -- try every cut before the "...도" word; keep the surest one whose
      -- sides disagree
      local best, bestj
      for j = need + 1, k do
        local left = concat(cl.words, " ", 1, j - 1)
        local right = concat(cl.words, " ", j)
        local a, b = top_of(model, left, memo), top_of(model, right, memo)
        local m = min(a.p, b.p)
        if a.intent ~= b.intent and m >= (mi.min_also_prob or 0.6)
          and (not best or m > best) then
          best, bestj = m, j
        end
      end
      if bestj then
        out[#out + 1] = { text = concat(cl.words, " ", 1, bestj - 1), cut = "also" }
        out[#out + 1] = { text = concat(cl.words, " ", bestj), cut = cl.cut }
        done = true
      end
    end
    if not done then out[#out + 1] = { text = cl.text, cut = cl.cut } end
  end
  for _, cl in ipairs(out) do
    local t = top_of(model, cl.text, memo)
    cl.intent, cl.p, cl.known = t.intent, t.p, t.known
  end
  -- pleasantries ("안녕!", "고마워") are not requests when a request follows
  local any_request = false
  for _, cl in ipairs(out) do
    if cl.known > 0 and cl.intent ~= "general" then any_request = true end
  end
  for _, cl in ipairs(out) do
    if cl.known == 0 then
      cl.dropped = "no known words"
    elseif any_request and cl.intent == "general" then
      cl.dropped = "pleasantry"
    end
  end
  return out
end

local function offline(message, opts, mi)
  local model = opts.model
  if not model then
    local err
    model, err = classifier.default()
    if not model then return nil, err end
  end

  local memo = {}
  local clauses = analyse_clauses(model, message, mi, memo)
  local kept = {}
  for _, cl in ipairs(clauses) do
    if not cl.dropped then kept[#kept + 1] = cl end
  end

  -- separate questions: clauses ended by a sentence mark, a conjunction or
  -- a request verb (not by a particle or comma inside one question)
  local nquestions = 1
  local separate = { sentence = true, conjunction = true, verb = true, also = true }
  for i = 1, #kept - 1 do
    if separate[kept[i].cut] then nquestions = nquestions + 1 end
  end

  -- distinct intents of the kept clauses, in order
  local distinct, seen = {}, {}
  for _, cl in ipairs(kept) do
    if not seen[cl.intent] then
      seen[cl.intent] = true
      distinct[#distinct + 1] = cl.intent
    end
  end

  -- the text the primary intent is decided on: the whole message, unless it
  -- holds several requests (or pleasantries around one)
  local primary_text = message
  local dropped_any = #kept < #clauses
  if #kept >= 1 and (#distinct > 1 or dropped_any) then
    primary_text = kept[1].text
  end
  local top = top_of(model, primary_text, memo)
  -- its probability of every label, by name
  local probs = {}
  for j, c in ipairs(model.labels) do probs[c] = top.ps[j] end

  -- transition boost on every candidate, then the choice
  local boosts = boosts_from(opts.rules.transitions, opts.prev_intent)
  local boosted, best, best_score = {}, nil, -math.huge
  for _, c in ipairs(_M.INTENTS) do
    local s = probs[c] + (boosts[c] or 0)
    boosted[c] = s
    if s > best_score or (s == best_score and c < best) then best, best_score = c, s end
  end
  local intent = best
  -- a message without a single known n-gram ("👍", "???") carries no
  -- evidence: the scores are only the class priors, so it is small talk
  local no_evidence = top.known == 0
  if no_evidence then intent = "general" end

  -- additional intents: other clauses' intents the classifier is sure of
  local additional, have = {}, { [intent] = true }
  local min_p = mi.min_additional_prob or 0.5
  if #distinct > 1 then
    for i = 2, #kept do
      local cl = kept[i]
      if cl.p >= min_p and not have[cl.intent] then
        have[cl.intent] = true
        additional[#additional + 1] = cl.intent
      elseif cl.p < min_p then
        cl.ignored = "probability below " .. min_p
      end
    end
    -- the first clause's own intent, when the boost moved the primary away
    if kept[1].intent ~= intent and not have[kept[1].intent] and kept[1].p >= min_p then
      have[kept[1].intent] = true
      additional[#additional + 1] = kept[1].intent
    end
  end

  local kw = _M.keyword_adjustment(message, intent, opts.rules.keyword_map)
  local base = probs[intent]
  local boost = boosts[intent] or 0
  local confidence = clamp01(base + boost + kw.delta)

  local scores = {}
  for _, c in ipairs(_M.INTENTS) do scores[c] = round(probs[c]) end
  local clause_info = {}
  for i, cl in ipairs(clauses) do
    clause_info[i] = { text = cl.text, intent = cl.intent, p = round(cl.p),
                       cut = cl.cut, dropped = cl.dropped, ignored = cl.ignored }
  end
  local boosted_r = {}
  for c, s in pairs(boosted) do boosted_r[c] = round(s) end

  return {
    intent = intent,
    additional_intents = additional,
    confidence = round(confidence),
    nquestions = nquestions,
    explain = {
      scores = scores,
      decided_on = primary_text,
      known_features = top.known,
      no_evidence = no_evidence or nil,
      transition_boost = {
        prev_intent = opts.prev_intent,
        boosts = deep_copy(boosts),
        applied = boost,
        boosted_scores = opts.prev_intent and boosted_r or nil,
        changed_choice = (opts.prev_intent ~= nil and not no_evidence
          and intent ~= top.intent) or nil,
        unboosted_choice = top.intent,
      },
      base_confidence = round(base),
      keyword_adjustments = kw,
      clauses = clause_info,
    },
  }
end

------------------------------------------------------------------------
-- LLM decision
------------------------------------------------------------------------

local function json_schema()
  local enum = {}
  for i, c in ipairs(_M.INTENTS) do enum[i] = c end
  return {
    type = "object",
    properties = {
      intent = { type = "string", enum = enum },
      additional_intents = { type = "array", items = { type = "string", enum = enum } },
      confidence = { type = "number" },
    },
    required = { "intent", "confidence" },
  }
end
_M.json_schema = json_schema

-- Seconds one intent LLM call may take before the offline classifier
-- decides instead (classification sits in front of every answer).
_M.llm_timeout = tonumber(os.getenv("MOONGRAPH_INTENT_LLM_TIMEOUT") or "") or 10

-- Ask the LLM. Returns the decision or nil, reason.
local function ask_llm(message, opts)
  local prompt, perr = prompts.file("intent.txt", {
    intents = concat(_M.INTENTS, ", "),
    prev_intent = opts.prev_intent or "none",
    user_location = is_set(opts.user_location) and tostring(opts.user_location) or "unknown",
  })
  if not prompt then return nil, perr end
  local req = {
    messages = {
      { role = "system", content = prompt },
      { role = "user", content = message },
    },
    json_schema = json_schema(),
    timeout = opts.llm_timeout or _M.llm_timeout,
    stream = false,   -- a decision, not text for the user
  }
  local llm = opts.llm
  local ok, res, cerr = pcall(llm.chat, llm, req)
  if not ok then return nil, "llm error: " .. tostring(res) end
  if not res then return nil, "llm failed: " .. tostring(cerr) end
  local j = res.json
  if type(j) ~= "table" then return nil, "llm reply has no JSON object" end
  if type(j.intent) ~= "string" or not KNOWN[j.intent] then
    return nil, "llm reply does not match the schema: intent " .. tostring(j.intent)
  end
  local conf = tonumber(j.confidence)
  if type(j.confidence) ~= "number" or conf ~= conf then
    return nil, "llm reply does not match the schema: confidence " .. tostring(j.confidence)
  end
  local additional, have = {}, { [j.intent] = true }
  if is_set(j.additional_intents) then
    if type(j.additional_intents) ~= "table" then
      return nil, "llm reply does not match the schema: additional_intents is not a list"
    end
    for _, a in ipairs(j.additional_intents) do
      if type(a) ~= "string" or not KNOWN[a] then
        return nil, "llm reply does not match the schema: additional intent " .. tostring(a)
      end
      if not have[a] then
        have[a] = true
        additional[#additional + 1] = a
      end
    end
  end
  local intent = j.intent
  local base = clamp01(conf)
  local boosts = boosts_from(opts.rules.transitions, opts.prev_intent)
  local boost = boosts[intent] or 0
  local kw = _M.keyword_adjustment(message, intent, opts.rules.keyword_map)
  return {
    intent = intent,
    additional_intents = additional,
    confidence = round(clamp01(base + boost + kw.delta)),
    nquestions = 1 + #additional,
    explain = {
      scores = { [intent] = round(base) },
      transition_boost = {
        prev_intent = opts.prev_intent, boosts = deep_copy(boosts), applied = boost,
      },
      base_confidence = round(base),
      keyword_adjustments = kw,
      model = res.model,
    },
  }
end

------------------------------------------------------------------------
-- classify
------------------------------------------------------------------------

function _M.classify(message, opts)
  if type(message) ~= "string" then
    error("bad argument #1 to 'classify': expected a string, got " .. type(message), 2)
  end
  if not find(message, "%S") then
    error("bad argument #1 to 'classify': message is empty", 2)
  end
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #2 to 'classify': expected a table of options", 2)
  end
  local prev = opts.prev_intent
  if not is_set(prev) then
    prev = nil
  elseif not KNOWN[prev] then
    error("bad argument #2 to 'classify': unknown prev_intent '" .. tostring(prev) .. "'", 2)
  end
  local rules = opts.rules
  if type(rules) ~= "table" or type(rules.keyword_map) ~= "table" or
     type(rules.transitions) ~= "table" or type(rules.multi_intent) ~= "table" then
    error("bad argument #2 to 'classify': rules = {keyword_map, transitions, multi_intent} expected", 2)
  end
  local o = { prev_intent = prev, user_location = opts.user_location, llm = opts.llm,
              llm_timeout = opts.llm_timeout, model = opts.model, rules = rules }
  local mi = rules.multi_intent

  local decision, source, fallback_reason, cache_state
  if o.llm then
    local cache = opts.cache
    if cache == nil then cache = _M.cache end
    local key = cache_key(message, prev, is_set(o.user_location))
    if cache and type(cache) ~= "table" then
      error("bad argument #2 to 'classify': cache must be a table or false", 2)
    end
    local hit = cache and cache_get(cache, key)
    if hit then
      decision, source, cache_state = deep_copy(hit), "llm", "hit"
    else
      local d, reason = ask_llm(message, o)
      if d then
        decision, source = d, "llm"
        if cache then
          cache_set(cache, key, deep_copy(d))
          cache_state = "miss"
        end
      else
        fallback_reason = reason
      end
    end
  end
  if not decision then
    local err
    decision, err = offline(message, o, mi)
    if not decision then
      return nil, fallback_reason and (fallback_reason .. "; offline classifier: " .. err) or err
    end
    source = "offline"
    if not o.llm then fallback_reason = fallback_reason or "no LLM configured" end
  end

  local is_multi = #decision.additional_intents > 0
  local complexity, why = judge_complexity(message, is_multi, decision.nquestions, mi)
  local explain = decision.explain
  explain.fallback_reason = fallback_reason
  explain.cache = cache_state
  explain.complexity_reason = why
  return {
    intent = decision.intent,
    additional_intents = decision.additional_intents,
    confidence = decision.confidence,
    is_multi = is_multi,
    complexity = complexity,
    source = source,
    explain = explain,
  }
end

return _M
