-- feedback: the quality score of the turn's answer on the four dimensions of
-- RAG evaluation, each 0..1:
--
--   faithfulness       the answer stays with the contexts (nothing invented)
--   groundedness       how much of the answer the contexts support
--   context_relevance  the contexts are about what was asked
--   answer_relevance   the answer addresses what was asked
--
-- With an LLM (ctx.llm) it is an LLM judge: prompts/feedback.txt with a JSON
-- schema for the four scores. Without one, or when the judge fails, a
-- defined heuristic over Korean-aware text units:
--
--   text units    characters, with ASCII spaces and punctuation removed and
--                 ASCII lower-cased; a bigram is two neighbouring units
--   claims        the answer's sentences, without its headings ("■ ..."),
--                 labels ("[...]") and notices ("※ ..."); a claim needs at
--                 least three bigrams
--   support       share of a claim's bigrams found in the contexts and
--                 notices (a claim found there word for word: 1)
--   faithfulness  share of claims with support >= 0.5
--   groundedness  supported bigrams / all bigrams, over every claim
--   context_relevance / answer_relevance
--                 share of the question's content words (particles and
--                 question words stripped, nodes/lib/korean.lua) that the
--                 contexts / the answer mention
--
-- overall is the mean of the dimensions that could be scored; a question
-- without content words ("안녕") scores neither relevance.
local korean = require "nodes.lib.korean"
local turn = require "nodes.lib.turn"
local data = require "nodes.lib.data"

local type, ipairs, tostring, tonumber, concat = type, ipairs, tostring, tonumber, table.concat
local floor, lower = math.floor, string.lower

local _M = {
  name = "feedback",
  policy = "fail_close",
  timeout = 60,
  min_support = 0.5,
}

_M.dimensions = { "faithfulness", "groundedness", "context_relevance", "answer_relevance" }

local function round(x) return floor(x * 1000 + 0.5) / 1000 end

local codes, len = utf8.codes, utf8.len

-- The text units of a text as one string (see above).
local function squash(text)
  return (lower(korean.sanitize(text)):gsub("[%s%p]+", ""))
end

-- Bigrams of a squashed text, each an integer key; adds them to `set` when
-- given and returns them as a list.
local function grams_of(sq, set)
  local out, n, prev = {}, 0, nil
  for _, c in codes(sq) do
    if prev then
      local g = prev * 0x110000 + c
      n = n + 1
      out[n] = g
      if set then set[g] = true end
    end
    prev = c
  end
  return out
end

function _M.grams(text, set)
  return grams_of(squash(text), set)
end

local function split_sentences(line, out)
  local from = 1
  while true do
    local a, b = line:find("[%.!?]+%s+", from)
    if not a then break end
    out[#out + 1] = line:sub(from, a)
    from = b + 1
  end
  if from <= #line then out[#out + 1] = line:sub(from) end
end

-- The claims of an answer with their units: { {text, sq, n = units}, ... }.
local function claims_of(answer)
  local out = {}
  for line in (answer .. "\n"):gmatch("(.-)\n") do
    local l = line:gsub("^%s+", "")
    if l ~= "" and not l:find("^■") and not l:find("^%[") and not l:find("^※") then
      l = l:gsub("^[%-%*•]%s*", ""):gsub("^%d+[%.%)]%s*", "")
      split_sentences(l, out)
    end
  end
  local kept = {}
  for _, c in ipairs(out) do
    local sq = squash(c)
    local n = len(sq)
    if n >= 4 then kept[#kept + 1] = { text = (c:gsub("%s+$", "")), sq = sq, n = n } end
  end
  return kept
end

-- Pure: the claims of an answer (see above).
function _M.claims(answer)
  local out = {}
  for i, c in ipairs(claims_of(answer)) do out[i] = c.text end
  return out
end

local function mentioned(text_compact, tok)
  for _, v in ipairs(tok.variants) do
    if v ~= "" and text_compact:find(v, 1, true) then return true end
  end
  return false
end

local function relevance(tokens, text)
  if #tokens == 0 then return nil end
  local c = lower(text):gsub("[%s%p]+", "")
  local n = 0
  for _, t in ipairs(tokens) do
    if mentioned(c, t) then n = n + 1 end
  end
  return n / #tokens
end

local function finish(scores, method)
  local sum, n = 0, 0
  for _, d in ipairs(_M.dimensions) do
    if scores[d] then
      scores[d] = round(scores[d])
      sum, n = sum + scores[d], n + 1
    end
  end
  scores.overall = n > 0 and round(sum / n) or nil
  scores.method = method
  return scores
end

-- Pure: heuristic scores of an answer to a question given the grounding
-- text (contexts and notices).
function _M.heuristic(question, grounding, answer)
  local gsq = squash(grounding)
  local ctx_grams = nil     -- built when a claim is not in the grounding word for word
  local claims = claims_of(answer)
  local supported_claims, supported, total = 0, 0, 0
  for _, c in ipairs(claims) do
    local nb = c.n - 1
    local hit
    if gsq:find(c.sq, 1, true) then
      hit = nb
    else
      if not ctx_grams then ctx_grams = {}; grams_of(gsq, ctx_grams) end
      hit = 0
      local gs = grams_of(c.sq)
      for i = 1, #gs do
        if ctx_grams[gs[i]] then hit = hit + 1 end
      end
    end
    supported, total = supported + hit, total + nb
    if hit / nb >= _M.min_support then supported_claims = supported_claims + 1 end
  end
  local tokens = korean.content_tokens(question)
  local scores = {
    faithfulness = #claims > 0 and supported_claims / #claims or nil,
    groundedness = total > 0 and supported / total or nil,
    context_relevance = relevance(tokens, grounding),
    answer_relevance = relevance(tokens, answer),
    claims = #claims,
  }
  return finish(scores, "heuristic")
end

-- The grounding text of a state: its usable contexts, clarify's text and
-- the notices.
function _M.grounding(state)
  local parts = { turn.render(turn.sections(state)) }
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  if type(contexts.clarify) == "table" and type(contexts.clarify.text) == "string" then
    parts[#parts + 1] = contexts.clarify.text
  end
  for _, l in ipairs(turn.notices(state)) do parts[#parts + 1] = l end
  return concat(parts, "\n")
end

function _M.schema()
  local props = { comment = { type = "string" } }
  for _, d in ipairs(_M.dimensions) do
    props[d] = { type = "number", minimum = 0, maximum = 1 }
  end
  return { type = "object", properties = props, required = _M.dimensions }
end

local function judge(llm, state, grounding)
  local template, err = data.read_text("prompts/feedback.txt")
  if not template then return nil, "cannot read prompts/feedback.txt: " .. tostring(err) end
  local vars = { question = state.message or "", contexts = grounding, answer = state.answer or "" }
  local prompt = template:gsub("{{%s*([%w_]+)%s*}}", function(k) return vars[k] or "" end)
  local res, cerr = llm:chat { messages = { { role = "user", content = prompt } },
                               json_schema = _M.schema(), temperature = 0 }
  if not res then return nil, tostring(cerr) end
  local v = type(res) == "table" and res.json or nil
  if type(v) ~= "table" then return nil, "the judge's reply has no JSON" end
  local scores = {}
  for _, d in ipairs(_M.dimensions) do
    local x = tonumber(v[d])
    if not x or x < 0 or x > 1 then return nil, "the judge's " .. d .. " is not a number in 0..1" end
    scores[d] = x
  end
  scores.comment = type(v.comment) == "string" and v.comment or nil
  return finish(scores, "llm")
end

function _M.run(state, ctx)
  local answer = type(state.answer) == "string" and state.answer or ""
  local grounding = _M.grounding(state)
  local llm = ctx and ctx.llm
  local q, err
  if llm then
    q, err = judge(llm, state, grounding)
  end
  if not q then
    q = _M.heuristic(state.message or "", grounding, answer)
    if err then q.judge_error = err end
  end
  return { quality = q }
end

return _M
