-- Korean-aware text helpers for retrieval over local data: normalisation,
-- particle and ending stripping, character bigrams and fuzzy similarity.
-- Everything works on UTF-8 code points (a Hangul syllable is one character).
local utf8 = utf8
local ulen, codes, find, sub = utf8.len, utf8.codes, string.find, string.sub

local _M = {}

-- Particles and light endings that attach to a noun in a question
-- ("종이는", "유리를", "수거함도", "약국에서", "건전지요").
_M.particles = {
  "에서는", "으로는", "이랑은", "이에요", "이랑", "에서", "으로", "한테", "까지",
  "부터", "처럼", "이나", "이야", "이요", "예요", "에요", "은", "는", "이", "가",
  "을", "를", "도", "에", "로", "의", "와", "과", "랑", "만", "좀", "요", "나", "야",
}

-- Whole tokens that carry no item meaning in a disposal question.
_M.stopwords = {}
for w in ([[
어떻게 어떡해 어떡하지 어떡하나요 어케 어캐 어떻게해 어떻게해요 어떻게하나요 어떻게돼
어디 어디에 어디서 어디로 어디다 어디에다 뭐야 뭐예요 뭐에요 뭐 뭔가요 뭘로 방법 방법은
법 법은 방식 요령 배출 배출법 배출방법 배출요령 분리수거 분리배출 분리 재활용 처리 처리법
처리방법 폐기 폐기법 폐기방법 알려줘 알려주세요 알려줄래 알려 가르쳐줘 좀 요 그리고 또 및
하고 해 해요 하나요 되나요 돼 되나 되니 돼요 되요 되는지 되는 가능 가능해 가능한가요
나요 궁금해 궁금해요 궁금 쓰레기 쓰레기는 쓰레기로 쓰레기야 이거 이건 저거 그거 이런 그런
거 것 건 수 있어 있나요 있어요 해야 해야해 해야돼 하면 할까 할까요 버리기 내놓 내놔 넣어
넣어야 여기 거기 일반쓰레기 일반쓰레기로 종량제 종량제봉투 봉투에 같이 함께 그냥 다 전부
제대로 올바르게 올바른 정확히 정확한 어느 무슨 어떤 왜 언제 집에서 집 우리 나 내 제
싶어 싶어요 싶은데 싶다 곳 데 때 안 맞아 맞나요 인가요 인지 어때 어때요 괜찮아 괜찮나요
how to do i dispose disposal throw away of the a an recycle recycling where can is it
]]):gmatch("%S+") do _M.stopwords[w] = true end

-- Token prefixes of verbs and question words ("버리는법", "배출하나요",
-- "알려줄래?", "어디다가").
_M.stop_prefixes = { "버리", "버려", "버릴", "버린", "버림", "배출", "알려", "어떻게", "어떡", "어디", "궁금" }

-- Characters of a UTF-8 string as an array.
function _M.chars(s)
  local out = {}
  for _, c in utf8.codes(s) do out[#out + 1] = utf8.char(c) end
  return out
end

function _M.len(s)
  return utf8.len(s) or #s
end

local function ends_with(s, suffix)
  return #s > #suffix and s:sub(-#suffix) == suffix
end

-- Drops bytes that are not part of a valid UTF-8 sequence.
function _M.sanitize(s)
  if utf8.len(s) then return s end
  local out = {}
  for ch in s:gmatch(utf8.charpattern) do
    if utf8.len(ch) == 1 then out[#out + 1] = ch end
  end
  return table.concat(out)
end

-- Lower-cases ASCII, turns punctuation into spaces, collapses spacing.
-- Invalid UTF-8 bytes are dropped.
-- Results are memoised (a node asks about the same question many times:
-- one keyword at a time); the memo is emptied when it grows past 512 entries.
local memo, memo_n = {}, 0

local function normalize(s)
  s = _M.sanitize(s):lower()
  -- ASCII punctuation and the common full-width / CJK punctuation marks
  s = s:gsub("[%p]", " ")
  for _, p in ipairs({ "，", "。", "？", "！", "～", "·", "…", "「", "」", "『", "』", "“", "”", "‘", "’", "ㆍ" }) do
    s = s:gsub(p, " ")
  end
  s = s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
  return s
end

function _M.normalize(s)
  if type(s) ~= "string" then
    error("bad argument #1 to 'normalize': string expected, got " .. type(s), 2)
  end
  local r = memo[s]
  if r then return r end
  r = normalize(s)
  if memo_n >= 512 then memo, memo_n = {}, 0 end
  memo[s] = r
  memo_n = memo_n + 1
  return r
end

-- Removes all whitespace (spacing variants: "페트 병" == "페트병").
-- Memoised like normalize (a node tests one question against many words).
local cmemo, cmemo_n = {}, 0

function _M.compact(s)
  local r = cmemo[s]
  if r then return r end
  r = (_M.normalize(s):gsub(" ", ""))
  if cmemo_n >= 512 then cmemo, cmemo_n = {}, 0 end
  cmemo[s] = r
  cmemo_n = cmemo_n + 1
  return r
end

-- Strips one trailing particle or ending when at least one character remains.
function _M.strip_particle(tok)
  for _, p in ipairs(_M.particles) do
    if ends_with(tok, p) and _M.len(tok) - _M.len(p) >= 1 then
      return tok:sub(1, #tok - #p)
    end
  end
  return tok
end

-- The forms a token may stand for: itself and up to two stripped endings
-- ("수거함에서는" -> "수거함에서는", "수거함"). Stripping can over-cut
-- ("종이" -> "종"), so callers keep every variant and score the best one.
-- The list is shared between callers (memoised like normalize): read it,
-- do not change it.
local vmemo, vmemo_n = {}, 0

function _M.variants(tok)
  local hit = vmemo[tok]
  if hit then return hit end
  local out = _M.variants_of(tok)
  if vmemo_n >= 512 then vmemo, vmemo_n = {}, 0 end
  vmemo[tok] = out
  vmemo_n = vmemo_n + 1
  return out
end

function _M.variants_of(tok)
  local out, seen = {}, {}
  local function add(v) if not seen[v] then seen[v] = true; out[#out + 1] = v end end
  add(tok)
  local a = _M.strip_particle(tok)
  add(a)
  add(_M.strip_particle(a))
  return out
end

local function stop_of(tok)
  if _M.stopwords[tok] then return true end
  for _, p in ipairs(_M.stop_prefixes) do
    if tok:sub(1, #p) == p then return true end
  end
  return false
end

-- Memoised like variants (a question's words are checked against every
-- prefix on each call of content_tokens).
local smemo, smemo_n = {}, 0

local function is_stop(tok)
  local r = smemo[tok]
  if r ~= nil then return r end
  r = stop_of(tok)
  if smemo_n >= 512 then smemo, smemo_n = {}, 0 end
  smemo[tok] = r
  smemo_n = smemo_n + 1
  return r
end

-- Content tokens of a question: normalised, stop words and verb forms
-- removed. Each entry is { text = token, variants = {...}, pos = index }.
function _M.content_tokens(s)
  local out = {}
  local i = 0
  for tok in _M.normalize(s):gmatch("%S+") do
    i = i + 1
    local vs = _M.variants(tok)
    local stop = false
    for _, v in ipairs(vs) do
      if is_stop(v) then stop = true; break end
    end
    if not stop then
      out[#out + 1] = { text = tok, variants = vs, pos = i }
    end
  end
  return out
end

-- Character bigrams (a one-character string yields itself). Each bigram is
-- cut from s between character boundaries (the bytes utf8.char would give
-- back for its two characters).
function _M.bigrams(s)
  local out, n = {}, 0
  local a, b  -- where the previous two characters start
  for p in codes(s) do
    if a then
      n = n + 1
      out[n] = sub(s, a, p - 1)
    end
    a, b = b, p
  end
  if a then
    out[n + 1] = sub(s, a)
  elseif b then
    out[1] = sub(s, b)
  end
  return out
end

-- Dice coefficient over character bigrams, 0..1.
function _M.similarity(a, b)
  if a == b then return 1 end
  local ba, bb = _M.bigrams(a), _M.bigrams(b)
  if #ba == 0 or #bb == 0 then return 0 end
  local count = {}
  for _, g in ipairs(ba) do count[g] = (count[g] or 0) + 1 end
  local common = 0
  for _, g in ipairs(bb) do
    if (count[g] or 0) > 0 then common = common + 1; count[g] = count[g] - 1 end
  end
  return 2 * common / (#ba + #bb)
end

-- Whether a question mentions a word: a word of two or more characters
-- anywhere in the question ignoring spaces ("의류 수거함" mentions
-- "의류수거함"); a one-character word as a whole token, particles stripped
-- ("옷은" mentions "옷", "옷걸이" does not).
function _M.mentions(question, word)
  local w = cmemo[word] or _M.compact(word)
  if w == "" then return false end
  if (ulen(w) or #w) >= 2 then
    return find(cmemo[question] or _M.compact(question), w, 1, true) ~= nil
  end
  for tok in _M.normalize(question):gmatch("%S+") do
    for _, v in ipairs(_M.variants(tok)) do
      if v == w then return true end
    end
  end
  return false
end

-- Plain (non-pattern) substring test.
function _M.contains(hay, needle)
  return hay:find(needle, 1, true) ~= nil
end

return _M
