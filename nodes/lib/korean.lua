-- Korean-aware text helpers for retrieval over local data: normalisation,
-- particle and ending stripping, character bigrams and fuzzy similarity.
-- Everything works on UTF-8 code points (a Hangul syllable is one character).
local utf8 = utf8
local ulen, codes, find, sub, byte = utf8.len, utf8.codes, string.find, string.sub, string.byte

local delete_bytes = require("moongraph.text").delete_bytes
local find_any = require("moongraph.core").bytes.find_any
local normalize_valid = require("moongraph.core").codepoints.normalize

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
-- The common full-width / CJK punctuation marks, as spaces.
local WIDE_PUNCTUATION = {}
for _, p in ipairs({ "，", "。", "？", "！", "～", "·", "…", "「", "」", "『", "』", "“", "”", "‘", "’", "ㆍ" }) do
  WIDE_PUNCTUATION[p] = " "
end
-- A character led by a byte that starts one of those marks (never Hangul)
local WIDE_CANDIDATE = "[\194\226\227\239][\128-\191]+"

-- The marks as one string, for the one pass in C that normalizes valid UTF-8.
local WIDE_MARKS = {}
for p in pairs(WIDE_PUNCTUATION) do WIDE_MARKS[#WIDE_MARKS + 1] = p end
WIDE_MARKS = table.concat(WIDE_MARKS)

local function normalize(s)
  local done = normalize_valid(s, WIDE_MARKS)
  if done then return done end
  s = _M.sanitize(s):lower():gsub(WIDE_CANDIDATE, WIDE_PUNCTUATION)
  -- punctuation and spacing, run by run, to one space; none at the ends
  s = s:gsub("[%p%s]+", " ")
  if byte(s, 1) == 32 then s = sub(s, 2) end
  if byte(s, -1) == 32 then s = sub(s, 1, -2) end
  return s
end

function _M.normalize(s)
  if type(s) ~= "string" then
    error("bad argument #1 to 'normalize': string expected, got " .. type(s), 2)
  end
  return normalize(s)
end

-- Removes all whitespace (spacing variants: "페트 병" == "페트병").
function _M.compact(s)
  return delete_bytes(_M.normalize(s), " ")
end

-- The first character of a non-empty string (its UTF-8 bytes).
local function first_char(s)
  local b = byte(s, 1)
  return sub(s, 1, b < 0xC0 and 1 or b < 0xE0 and 2 or b < 0xF0 and 3 or 4)
end

-- keyed_index(field, key_of) -> lookup(key): the non-empty words of the
-- list _M[field] with that key_of(word), in list order (the first that fits
-- wins), so a token is compared with the few that can fit it. Rebuilt when
-- the list is replaced or grows or shrinks.
local function keyed_index(field, key_of)
  local index, seen, seen_n = nil, nil, -1
  return function(key)
    local list = _M[field]
    if list ~= seen or #list ~= seen_n then
      index = {}
      for _, w in ipairs(list) do
        if w ~= "" then
          local k = key_of(w)
          local l = index[k]
          if not l then l = {}; index[k] = l end
          l[#l + 1] = w
        end
      end
      seen, seen_n = list, #list
    end
    return index[key]
  end
end

-- the particles by their last byte, the stop prefixes by their first character
local particles_ending = keyed_index("particles", function(p) return byte(p, -1) end)
local prefixes_starting = keyed_index("stop_prefixes", first_char)

-- Strips one trailing particle or ending when at least one character remains.
-- (tok longer than the particle leaves at least one character: the bytes
-- before a whole UTF-8 suffix are whole characters.)
function _M.strip_particle(tok)
  local n = #tok
  local candidates = n > 0 and particles_ending(byte(tok, n))
  if not candidates then return tok end
  for i = 1, #candidates do
    local p = candidates[i]
    local m = #p
    -- a plain find from the last m bytes: tok ends with p (no substring made)
    if n > m and find(tok, p, n - m + 1, true) then
      return sub(tok, 1, n - m)
    end
  end
  return tok
end

-- The forms a token may stand for: itself and up to two stripped endings
-- ("수거함에서는" -> "수거함에서는", "수거함"). Stripping can over-cut
-- ("종이" -> "종"), so callers keep every variant and score the best one.
function _M.variants(tok)
  local a = _M.strip_particle(tok)
  if a == tok then return { tok } end
  local b = _M.strip_particle(a)
  if b == a then return { tok, a } end
  return { tok, a, b }
end

local function stop_of(tok)
  if _M.stopwords[tok] then return true end
  if tok == "" then return false end
  local candidates = prefixes_starting(first_char(tok))
  if not candidates then return false end
  for _, p in ipairs(candidates) do
    if find(tok, p, 1, true) == 1 then return true end
  end
  return false
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
      if stop_of(v) then stop = true; break end
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

-- The compact forms of the words questions are checked against: keyword
-- tables, the same few hundred words on every turn (never the questions).
local word_forms, word_forms_n = {}, 0

-- word -> { compact form, whether it has two characters or more }
local function word_form(word)
  local f = word_forms[word]
  if f then return f end
  local w = _M.compact(word)
  f = { w, (ulen(w) or #w) >= 2 }
  if word_forms_n >= 4096 then word_forms, word_forms_n = {}, 0 end
  word_forms[word] = f
  word_forms_n = word_forms_n + 1
  return f
end

-- A question made ready for many mentions() checks: its compact form, and
-- the forms of its tokens when a one-character word is asked about.
local Matcher = {}
Matcher.__index = Matcher

function _M.matcher(question)
  local normalized = _M.normalize(question)
  return setmetatable({ normalized = normalized, compact = delete_bytes(normalized, " "), forms = nil }, Matcher)
end

-- The forms of the question's tokens, particles stripped (made on first use).
local function token_forms(m)
  local forms = m.forms
  if not forms then
    forms = {}
    for tok in m.normalized:gmatch("%S+") do
      for _, v in ipairs(_M.variants(tok)) do forms[v] = true end
    end
    m.forms = forms
  end
  return forms
end

-- Whether the question mentions a word: a word of two or more characters
-- anywhere in the question ignoring spaces ("의류 수거함" mentions
-- "의류수거함"); a one-character word as a whole token, particles stripped
-- ("옷은" mentions "옷", "옷걸이" does not).
function Matcher:mentions(word)
  local f = word_form(word)
  local w = f[1]
  if w == "" then return false end
  if f[2] then
    return find(self.compact, w, 1, true) ~= nil
  end
  return token_forms(self)[w] == true
end

-- A word list as mentions_any reads it, made once per list (keyword tables
-- are data that do not change between questions; a list that grows or
-- shrinks is read again): the compact forms of two characters or more, for
-- one search of the question, and those of one character.
local list_forms = setmetatable({}, { __mode = "k" })

local function forms_of_list(words)
  local v = list_forms[words]
  if v and v.n == #words then return v end
  v = { n = #words, long = {}, short = {} }
  for i = 1, #words do
    local f = word_form(words[i])
    if f[1] ~= "" then
      local into = f[2] and v.long or v.short
      into[#into + 1] = f[1]
    end
  end
  list_forms[words] = v
  return v
end

-- Whether the question mentions any word of a list (as mentions() tells),
-- the words of two characters or more looked for in one pass.
function Matcher:mentions_any(words)
  local v = forms_of_list(words)
  if #v.long > 0 and find_any(self.compact, v.long) then return true end
  local short = v.short
  if #short == 0 then return false end
  local forms = token_forms(self)
  for i = 1, #short do
    if forms[short[i]] then return true end
  end
  return false
end

-- mentions(question, word): one check (korean.matcher for many).
function _M.mentions(question, word)
  return _M.matcher(question):mentions(word)
end

-- Plain (non-pattern) substring test.
function _M.contains(hay, needle)
  return hay:find(needle, 1, true) ~= nil
end

return _M
