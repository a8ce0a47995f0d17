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
