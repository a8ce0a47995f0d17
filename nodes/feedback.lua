-- feedback: the quality score of the turn's answer on the four dimensions of
-- RAG evaluation, each 0..1:
--
--   faithfulness       the answer stays with the contexts (nothing invented)
--   groundedness       how much of the answer the contexts support
--   context_relevance  the contexts are about what was asked
--   answer_relevance   the answer addresses what was asked
--
-- With an LLM (ctx.config.llm) it is an LLM judge: prompts/feedback.txt with a JSON
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
local prompts = require "moongraph.prompt"
local delete_bytes = require("moongraph.text").delete_bytes
local bigram_hits = require("moongraph.core").codepoints.bigram_hits
local fold = require("moongraph.core").codepoints.fold
local split_sentences = require("moongraph.core").sentences.split

local type, ipairs, tostring, tonumber, concat = type, ipairs, tostring, tonumber, table.concat
local floor, lower = math.floor, string.lower
local find, sub, gsub, byte = string.find, string.sub, string.gsub, string.byte

local _M = {
  name = "feedback",
  policy = "fail_close",
  timeout = 60,
  min_support = 0.5,
}

_M.dimensions = { "faithfulness", "groundedness", "context_relevance", "answer_relevance" }

local function round(x) return floor(x * 1000 + 0.5) / 1000 end

local len = utf8.len

-- The bytes gsub(s, "[%s%p]+", "") deletes (ASCII spaces and punctuation),
-- taken from the pattern itself so the two agree byte for byte.
local SPACE_PUNCT = {}
for b = 0, 255 do
  local c = string.char(b)
  if find(c, "[%s%p]") then SPACE_PUNCT[#SPACE_PUNCT + 1] = c end
end
SPACE_PUNCT = concat(SPACE_PUNCT)

-- Deletes ASCII spaces and punctuation, in one pass (moongraph.text).
local function strip(s)
  return delete_bytes(s, SPACE_PUNCT)
end

-- The text units of a text as one string (see above), how many there are,
-- and whether the text was valid UTF-8 (one pass in C when it is).
local function squash(text)
  local sq, n = fold(text, SPACE_PUNCT)
  if sq then return sq, n, true end
  sq = strip(lower(korean.sanitize(text)))
  return sq, len(sq), false
end

-- s without trailing whitespace (the bytes %s matches).
local SPACE = { [9] = true, [10] = true, [11] = true, [12] = true, [13] = true, [32] = true }
local function trim_end(s)
  local e = #s
  while e > 0 and SPACE[byte(s, e)] do e = e - 1 end
  return e == #s and s or sub(s, 1, e)
end

-- The first bytes of the lines that are not claims: labels ("[...]"),
-- headings ("■ ...") and notices ("※ ...").
local NOT_CLAIMS = { "[", "■", "※" }

-- The claims of an answer with their units: { {text, sq, n = units}, ... }.
-- A line's leading spaces, bullet ("-", "*", a byte of "•") and number
-- ("1." or "1)") are not part of its first sentence; a sentence ends after
-- a run of sentence marks followed by spaces, keeping the run's first mark
-- (marks inside a word, "1.5km", stay): runtime/sentences.c.
local function claims_of(answer)
  local out = split_sentences(answer, NOT_CLAIMS)
  local kept = {}
  for i = 1, #out do
    local c = out[i]
    local sq, n = squash(c)
    if n >= 4 then kept[#kept + 1] = { text = trim_end(c), sq = sq, n = n } end
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

-- Share of the tokens a text mentions, ignoring its spacing and
-- punctuation. lowered: the text lower-cased; squashed: the same without
-- ASCII spaces and punctuation, or nil to make it only when needed (a token
-- found in the lowered text is there after squashing too: its variants
-- hold no spaces or punctuation).
local function relevance(tokens, lowered, squashed)
  if #tokens == 0 then return nil end
  local n = 0
  for _, t in ipairs(tokens) do
    if squashed then
      if mentioned(squashed, t) then n = n + 1 end
    elseif mentioned(lowered, t) then
      n = n + 1
    else
      squashed = strip(lowered)
      if mentioned(squashed, t) then n = n + 1 end
    end
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
  local gsq, _, valid = squash(grounding)
  -- relevance reads the text as it is (invalid UTF-8 bytes included); for
  -- valid UTF-8 that is the squashed text itself
  local gsq_raw = gsq
  if not valid then gsq_raw = strip(lower(grounding)) end
  local claims = claims_of(answer)
  -- a claim found word for word is wholly supported; the others' bigrams
  -- are looked up in the grounding's, all in one pass (runtime/codepoints.c)
  local hits, rest, at = {}, {}, {}
  for i, c in ipairs(claims) do
    if gsq:find(c.sq, 1, true) then
      hits[i] = c.n - 1
    else
      rest[#rest + 1], at[#at + 1] = c.sq, i
    end
  end
  if #rest > 0 then
    local found = bigram_hits(gsq, rest)
    for k, i in ipairs(at) do hits[i] = found[k] end
  end
  local supported_claims, supported, total = 0, 0, 0
  for i, c in ipairs(claims) do
    local nb = c.n - 1
    local hit = hits[i]
    supported, total = supported + hit, total + nb
    if hit / nb >= _M.min_support then supported_claims = supported_claims + 1 end
  end
  local tokens = korean.content_tokens(question)
  local scores = {
    faithfulness = #claims > 0 and supported_claims / #claims or nil,
    groundedness = total > 0 and supported / total or nil,
    context_relevance = relevance(tokens, nil, gsq_raw),
    answer_relevance = relevance(tokens, lower(answer), nil),
    claims = #claims,
  }
  return finish(scores, "heuristic")
end

-- The grounding text of a state: its usable contexts, clarify's text and
-- the notices.
function _M.grounding(state)
  local sections = turn.sections(state)
  local parts = { turn.render(sections) }
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  if type(contexts.clarify) == "table" and type(contexts.clarify.text) == "string" then
    parts[#parts + 1] = contexts.clarify.text
  end
  for _, l in ipairs(turn.notices(state, sections)) do parts[#parts + 1] = l end
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
  local prompt, err = prompts.file("feedback.txt",
    { question = state.message or "", contexts = grounding, answer = state.answer or "" })
  if not prompt then return nil, err end
  -- the judge's JSON is not for the user: never in the token stream
  local res, cerr = llm:chat { messages = { { role = "user", content = prompt } }, stream = false,
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
  local llm = ctx and ctx.config and ctx.config.llm
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
