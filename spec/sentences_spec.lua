-- core.sentences.split: the sentences of a text's lines in one pass, with
-- the result of the Lua patterns it replaces (spec/support/sentences_reference.lua).
package.path = "spec/support/?.lua;" .. package.path
local split = require("moongraph.core").sentences.split
local reference = require "sentences_reference"

describe("sentences.split", function()
  it("cuts after a run of marks followed by spaces, keeping the run's first mark", function()
    assert.same({ "종이는 재활용됩니다.", "캔도요!", "정말?" },
      split("종이는 재활용됩니다. 캔도요!!  정말?"))
    assert.same({ "거리는 1.5km입니다." }, split("거리는 1.5km입니다."))
    assert.same({ "끝.", "다음" }, split("끝...\t다음"))
    assert.same({ "a.b!c?d" }, split("a.b!c?d"))
  end)

  it("reads each line, without its leading spaces, bullet and number", function()
    assert.same({ "첫째.", "둘째", "셋째 " }, split("  - 첫째.\n\n2) 둘째\n* 3. 셋째 "))
    -- a bullet is one byte: of "•", its first
    assert.same({ "\128\162 항목" }, split("• 항목"))
    assert.same({ "12", "x" }, split("12\n3.\n4. x"))
    assert.same({}, split(""))
    assert.same({}, split(" \n\t\n"))
  end)

  it("leaves out the lines whose first byte that is not a space begins a string of skip", function()
    assert.same({ "본문." }, split("■ 제목\n  [라벨] 내용.\n본문.\n※ 알림", { "[", "■", "※" }))
    assert.same({ "\150\160 제목" }, split("■ 제목", {}))
  end)

  it("refuses a skip list holding something other than strings", function()
    assert.has_error(function() split("x", { 1 }) end,
      "bad argument #2 to 'split' (item 1 is not a string)")
    assert.has_error(function() split("x", "[") end)
    assert.has_error(function() split(nil) end)
  end)

  it("agrees with the Lua patterns over random texts", function()
    math.randomseed(5)
    local pieces = { ".", "!", "?", " ", "\t", "\n", "\r", "-", "*", "•", "1", "2)", "3.",
                     "[", "■", "※", "가", "나다", "a", "\0", "\226", "\128", "\162" }
    local skip = { "[", "■", "※" }
    for _ = 1, 3000 do
      local parts = {}
      for i = 1, math.random(0, 30) do parts[i] = pieces[math.random(#pieces)] end
      local text = table.concat(parts)
      assert.same(reference(text, skip), split(text, skip), text)
      assert.same(reference(text), split(text), text)
    end
  end)
end)
