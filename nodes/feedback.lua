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
--   claims        the answer's sentences, without its headings ("■ ..."),
--                 labels ("[...]") and notices ("※ ..."); a claim needs at
--                 least three character bigrams
--   support       share of a claim's character bigrams (spaces and
--                 punctuation removed) found in the contexts and notices
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
local floor = math.floor

local _M = {
  name = "feedback",
  policy = "fail_close",
  timeout = 60,
  min_support = 0.5,
}

_M.dimensions = { "faithfulness", "groundedness", "context_relevance", "answer_relevance" }

local function round(x) return floor(x * 1000 + 0.5) / 1000 end

local function gram_set(text)
  local set = {}
  for _, g in ipairs(korean.bigrams(korean.compact(text))) do set[g] = true end
  return set
end

-- Pure: the claims of an answer (see above).
function _M.claims(answer)
  local out = {}
  for line in (answer .. "\n"):gmatch("(.-)\n") do
    local l = line:gsub("^%s+", "")
    if l ~= "" and not l:find("^■") and not l:find("^%[") and not l:find("^※") then
      l = l:gsub("^[%-%*•]%s*", ""):gsub("^%d+[%.%)]%s*", "")
      for s in (l .. " "):gmatch("(.-[%.!?])%s+") do out[#out + 1] = s end
      local tail = l:match("[%.!?]%s+([^%.!?]+)$") or (not l:find("[%.!?]") and l) or nil
      if tail and tail:find("%S") then out[#out + 1] = tail end
    end
  end
  local kept = {}
  for _, s in ipairs(out) do
    if #korean.bigrams(korean.compact(s)) >= 3 then kept[#kept + 1] = s end
  end
  return kept
end

local function mentioned(text_compact, tok)
  for _, v in ipairs(tok.variants) do
    if v ~= "" and text_compact:find(v, 1, true) then return true end
  end
  return false
end

local function relevance(tokens, text)
  if #tokens == 0 then return nil end
  local c = korean.compact(text)
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
  local ctx_grams = gram_set(grounding)
  local claims = _M.claims(answer)
  local supported_claims, supported, total = 0, 0, 0
  for _, c in ipairs(claims) do
    local grams = korean.bigrams(korean.compact(c))
    local hit = 0
    for _, g in ipairs(grams) do
      if ctx_grams[g] then hit = hit + 1 end
    end
    supported, total = supported + hit, total + #grams
    if hit / #grams >= _M.min_support then supported_claims = supported_claims + 1 end
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
