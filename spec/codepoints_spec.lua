-- core.codepoints: code-point scans in C for hot node paths. Each scan is
-- checked against the Lua loop that defines it, over chosen texts and
-- random strings (valid and invalid UTF-8).
local codepoints = require("moongraph.core").codepoints

-- Random strings: Hangul, ASCII letters, digits, punctuation, spaces, other
-- code points, and (when `broken`) stray bytes.
local PIECES = { "가", "힣", "ㄱ", "종이", "a", "Z", "q", "7", "0", ".", "!", " ", "\t", "\n",
                 "😀", "é", "·", "？", "\u{3000}", "\0", "\127" }
local BROKEN = { "\128", "\255", "\237\160\128", "\192\175", "\244\144\128\128", "\234\176" }
local function random_text(broken)
  local parts = {}
  for i = 1, math.random(0, 30) do
    local list = (broken and math.random() < 0.2) and BROKEN or PIECES
    parts[i] = list[math.random(#list)]
  end
  return table.concat(parts)
end

describe("codepoints.token_estimate", function()
  -- the estimate as nodes/lib/tokens.lua defines it, character by character
  local function reference(text)
    local ceil = math.ceil
    if not utf8.len(text) then
      local n, letters = 0, 0
      for i = 1, #text do
        local c = text:byte(i)
        if c >= 128 then n = n + 1 elseif c > 32 then letters = letters + 1 end
      end
      return n + ceil(letters / 4)
    end
    local total, letters, digits = 0, 0, 0
    for _, c in utf8.codes(text) do
      if c >= 128 then
        total = total + ceil(letters / 4) + ceil(digits / 3) + 1
        letters, digits = 0, 0
      elseif c >= 97 and c <= 122 or c >= 65 and c <= 90 then
        total = total + ceil(digits / 3); digits = 0
        letters = letters + 1
      elseif c >= 48 and c <= 57 then
        total = total + ceil(letters / 4); letters = 0
        digits = digits + 1
      else
        total = total + ceil(letters / 4) + ceil(digits / 3)
        letters, digits = 0, 0
        if c > 32 and c ~= 127 then total = total + 1 end
      end
    end
    return math.tointeger(total + ceil(letters / 4) + ceil(digits / 3))
  end

  it("counts Korean by syllable, ASCII by runs", function()
    assert.equal(0, codepoints.token_estimate(""))
    assert.equal(5, codepoints.token_estimate("hello 세계 123"))
    assert.equal(3, codepoints.token_estimate("종이컵"))
    assert.equal(2, codepoints.token_estimate("abcde"))
    assert.equal(2, codepoints.token_estimate("1234"))
    assert.equal(2, codepoints.token_estimate("?!  \n"))
    -- not UTF-8: a token per high byte, the rest as one run of letters
    assert.equal(3, codepoints.token_estimate("\255\254ab c"))
  end)

  it("agrees with the character loop over random text", function()
    math.randomseed(19)
    for i = 1, 3000 do
      local s = random_text(i % 3 == 0)
      assert.equal(reference(s), codepoints.token_estimate(s), s)
    end
  end)

  it("names a bad argument", function()
    assert.has_error(function() codepoints.token_estimate(nil) end)
    assert.has_error(function() codepoints.token_estimate({}) end)
  end)
end)

describe("codepoints.bigram_hits", function()
  -- the count as nodes/feedback.lua defines it: a set of the text's
  -- code-point pairs, then each string's pairs looked up in order
  local function pairs_of(s)
    local out, prev = {}, nil
    for _, c in utf8.codes(s) do
      if prev then out[#out + 1] = prev * 0x110000 + c end
      prev = c
    end
    return out
  end
  local function reference(text, list)
    local set = {}
    for _, g in ipairs(pairs_of(text)) do set[g] = true end
    local out = {}
    for i, s in ipairs(list) do
      local n = 0
      for _, g in ipairs(pairs_of(s)) do if set[g] then n = n + 1 end end
      out[i] = n
    end
    return out
  end

  it("counts each string's pairs found in the text, repeats included", function()
    assert.same({ 2, 0, 2, 0, 0 }, codepoints.bigram_hits("종이컵은 종이류", { "종이컵", "컵종", "종이종이", "종", "" }))
    assert.same({}, codepoints.bigram_hits("abc", {}))
    assert.same({ 0 }, codepoints.bigram_hits("", { "ab" }))
  end)

  it("agrees with the Lua sets over random text", function()
    math.randomseed(23)
    for _ = 1, 1000 do
      local text, list = random_text(), {}
      for i = 1, math.random(0, 4) do list[i] = random_text() end
      assert.same(reference(text, list), codepoints.bigram_hits(text, list))
    end
  end)

  it("rejects what is not valid UTF-8 and a list that is not of strings", function()
    assert.has_error(function() codepoints.bigram_hits("a\255b", { "ab" }) end,
      "bad argument #1 to 'bigram_hits' (invalid UTF-8 at byte 2)")
    assert.has_error(function() codepoints.bigram_hits("ab", { "\237\160\128" }) end,
      "bad argument #2 to 'bigram_hits' (invalid UTF-8 at byte 1)")
    assert.has_error(function() codepoints.bigram_hits("ab", { "a", 3 }) end,
      "bad argument #2 to 'bigram_hits' (item 2 is not a string)")
    assert.has_error(function() codepoints.bigram_hits("ab") end)
  end)
end)

describe("codepoints.word_ngrams", function()
  local SHIFT = 2097152
  local SEPS = "？·\u{3000}"
  -- the features as nodes/lib/intent_model.lua defines them, in Lua
  local function reference(text, nmin, nmax)
    local seps = {}
    for _, c in utf8.codes(SEPS) do seps[c] = true end
    while not utf8.len(text) do
      local _, bad = utf8.len(text)
      text = text:sub(1, bad - 1) .. " " .. text:sub(bad + 1)
    end
    local seen, list, w, n = {}, {}, {}, 0
    local function add(f) if not seen[f] then seen[f] = true; list[#list + 1] = f end end
    local function flush()
      if n == 0 then return end
      w[0], w[n + 1] = 1, 2
      for i = 0, n + 1 do
        if nmin <= 1 and i >= 1 and i <= n then add(w[i]) end
        if i <= n then
          local f = w[i] * SHIFT + w[i + 1]
          if nmin <= 2 and nmax >= 2 then add(f) end
          if nmax >= 3 and i < n then add(f * SHIFT + w[i + 2]) end
        end
      end
      n = 0
    end
    for _, c in utf8.codes(text) do
      if (c < 128 and not string.char(c):match("%w")) or seps[c] then
        flush()
      else
        if c >= 65 and c <= 90 then c = c + 32 end
        n = n + 1
        w[n] = c
      end
    end
    flush()
    return list
  end

  it("lists a word's n-grams between its boundary marks, once each", function()
    local ga, na = utf8.codepoint("가"), utf8.codepoint("나")
    assert.same({ 1 * SHIFT + ga, (1 * SHIFT + ga) * SHIFT + 2, ga, ga * SHIFT + 2 },
      codepoints.word_ngrams("가", 1, 3, SEPS))
    assert.same({ 1 * SHIFT + ga, ga * SHIFT + na, na * SHIFT + 2 },
      codepoints.word_ngrams("가나？가나", 2, 2, SEPS))
    assert.same(codepoints.word_ngrams("ab", 1, 3, SEPS), codepoints.word_ngrams("AB", 1, 3, SEPS))
    assert.same({}, codepoints.word_ngrams(" .,？ ", 1, 3, SEPS))
    assert.same(codepoints.word_ngrams("a b", 1, 3, SEPS), codepoints.word_ngrams("a\255b", 1, 3, SEPS))
  end)

  it("agrees with the Lua loop over random text and every size range", function()
    math.randomseed(29)
    for i = 1, 2000 do
      local s = random_text(i % 3 == 0)
      for _, r in ipairs({ { 1, 3 }, { 1, 1 }, { 2, 3 }, { 3, 3 }, { 1, 2 } }) do
        assert.same(reference(s, r[1], r[2]), codepoints.word_ngrams(s, r[1], r[2], SEPS))
      end
    end
  end)

  it("names a bad argument", function()
    assert.has_error(function() codepoints.word_ngrams("x", 0, 3, SEPS) end)
    assert.has_error(function() codepoints.word_ngrams("x", 2, 1, SEPS) end)
    assert.has_error(function() codepoints.word_ngrams("x", 1, 4, SEPS) end)
    assert.has_error(function() codepoints.word_ngrams("x", 1, 3, "\255") end)
    assert.has_error(function() codepoints.word_ngrams("x", 1, 3, string.rep("·", 65)) end)
    assert.has_error(function() codepoints.word_ngrams(nil, 1, 3, SEPS) end)
  end)
end)

describe("codepoints.fold", function()
  local DROP = " \t\n.,!?-"
  local pattern = "[" .. DROP:gsub("%p", "%%%0") .. "]"

  it("lower-cases ASCII, drops the bytes given and counts what is left", function()
    assert.same({ "종이컵abc", 6 }, { codepoints.fold("종이 컵, ABC!", DROP) })
    assert.same({ "", 0 }, { codepoints.fold(" .. ", DROP) })
    assert.same({ "가나", 2 }, { codepoints.fold("가나", "") })
    -- lower-cased before the drop: a dropped letter goes in either case
    assert.same({ "ac", 2 }, { codepoints.fold("aBbC", "b") })
  end)

  it("agrees with lower, gsub and utf8.len over random valid text", function()
    math.randomseed(31)
    for _ = 1, 2000 do
      local s = random_text()
      local want = s:lower():gsub(pattern, "")
      assert.same({ want, utf8.len(want) }, { codepoints.fold(s, DROP) })
    end
  end)

  it("answers nil for text that is not valid UTF-8", function()
    assert.is_nil(codepoints.fold("a\255b", DROP))
    assert.is_nil(codepoints.fold("\237\160\128", DROP))
  end)

  it("names a bad argument", function()
    assert.has_error(function() codepoints.fold("x", "\200") end)
    assert.has_error(function() codepoints.fold(nil, DROP) end)
  end)
end)

describe("codepoints.normalize", function()
  local MARKS = "，。？·…"
  -- nodes/lib/korean.lua's normalisation of valid UTF-8, with patterns
  local function reference(s)
    local wide = {}
    for _, c in utf8.codes(MARKS) do wide[utf8.char(c)] = " " end
    s = s:lower():gsub(utf8.charpattern, function(ch) return wide[ch] end)
    s = s:gsub("[%p%s]+", " ")
    if s:byte(1) == 32 then s = s:sub(2) end
    if s:byte(-1) == 32 then s = s:sub(1, -2) end
    return s
  end

  it("lower-cases, makes punctuation runs one space and trims the ends", function()
    assert.equal("깨진 유리 어떻게 버려", codepoints.normalize("  깨진   유리, 어떻게 버려?! ", MARKS))
    assert.equal("pet병 종이 캔", codepoints.normalize("PET병·종이，캔。", MARKS))
    assert.equal("", codepoints.normalize(" ?! ", MARKS))
    assert.equal("가", codepoints.normalize("가", ""))
  end)

  it("agrees with the patterns over random valid text", function()
    math.randomseed(43)
    for _ = 1, 3000 do
      local s = random_text()
      assert.equal(reference(s), codepoints.normalize(s, MARKS), s)
    end
  end)

  it("answers nil for text that is not valid UTF-8, and names a bad argument", function()
    assert.is_nil(codepoints.normalize("a\255", MARKS))
    assert.has_error(function() codepoints.normalize("a", "\255") end)
    assert.has_error(function() codepoints.normalize(nil, MARKS) end)
  end)
end)
