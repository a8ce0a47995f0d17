-- moongraph.text.delete_bytes: every byte of a set taken out, in one pass,
-- with the same result as the gsub it replaces on hot text paths.
local text = require "moongraph.text"

describe("text.delete_bytes", function()
  it("deletes every byte that occurs in the set, and only those", function()
    assert.equal("abc", text.delete_bytes("a, b. c!", " ,.!"))
    assert.equal("종이류배출", text.delete_bytes("종이류: 배출.", " :."))
    assert.equal("", text.delete_bytes(" , ", " ,"))
    assert.equal("", text.delete_bytes("", "abc"))
    assert.equal("x\0y", text.delete_bytes("x\0y", ""))
    assert.equal("xy", text.delete_bytes("x\0y\0", "\0"))
    -- bytes of multi-byte characters are bytes like any other
    assert.equal("\128", text.delete_bytes("\128\255", "\255"))
  end)

  it("returns the string itself when nothing is deleted", function()
    local s = string.rep("가나다", 100)
    assert.equal(s, text.delete_bytes(s, " "))
  end)

  it("agrees with gsub over random strings", function()
    math.randomseed(11)
    local set = " \t\n,.!?:;-_()[]"
    local pattern = "[" .. set:gsub("%p", "%%%0") .. "]"
    for _ = 1, 2000 do
      local parts = {}
      for i = 1, math.random(0, 40) do
        parts[i] = string.char(math.random(0, 255))
        if math.random() < 0.4 then parts[i] = set:sub(math.random(#set), math.random(#set)) end
      end
      local s = table.concat(parts)
      assert.equal((s:gsub(pattern, "")), text.delete_bytes(s, set))
    end
  end)

  it("names a bad argument", function()
    assert.has_error(function() text.delete_bytes(nil, " ") end,
      "bad argument #1 to 'delete_bytes' (string expected, got nil)")
    assert.has_error(function() text.delete_bytes("x", 3) end,
      "bad argument #2 to 'delete_bytes' (string expected, got number)")
  end)
end)

-- core.bytes.percent_encode: what moongraph.http escapes query keys and
-- values with; the same as the gsub over the unreserved set it replaces.
describe("bytes.percent_encode", function()
  local bytes = require("moongraph.core").bytes
  local http = require "moongraph.http"

  it("encodes every byte outside letters, digits and -._~", function()
    assert.equal("abc-XYZ_0.9~", bytes.percent_encode("abc-XYZ_0.9~"))
    assert.equal("a%20b%26c%3Dd%2F", bytes.percent_encode("a b&c=d/"))
    assert.equal("%EC%84%9C%EC%9A%B8", bytes.percent_encode("서울"))
    assert.equal("%00%FF", bytes.percent_encode("\0\255"))
    assert.equal("", bytes.percent_encode(""))
    assert.equal("x=1&y=%EA%B0%80", http.encode_query { y = "가", x = 1 })
  end)

  it("agrees with gsub over random strings", function()
    math.randomseed(17)
    local table_ = {}
    for b = 0, 255 do table_[string.char(b)] = string.format("%%%02X", b) end
    for _ = 1, 2000 do
      local parts = {}
      for i = 1, math.random(0, 30) do parts[i] = string.char(math.random(0, 255)) end
      local s = table.concat(parts)
      assert.equal((s:gsub("[^%w%-%._~]", table_)), bytes.percent_encode(s))
    end
  end)

  it("names a bad argument", function()
    assert.has_error(function() bytes.percent_encode(nil) end)
  end)
end)

describe("bytes.find_any", function()
  local bytes = require("moongraph.core").bytes

  it("gives the index of the first string of the list found in the text", function()
    assert.equal(2, bytes.find_any("폐건전지 수거함", { "형광등", "수거함", "건전지" }))
    assert.equal(1, bytes.find_any("abc", { "", "x" }))
    assert.is_nil(bytes.find_any("abc", { "abcd", "x.", "%a" }))
    assert.is_nil(bytes.find_any("abc", {}))
    assert.equal(1, bytes.find_any("a\0b", { "\0b" }))
  end)

  it("agrees with plain string.find over random strings", function()
    math.randomseed(37)
    for _ = 1, 2000 do
      local function rnd(n)
        local t = {}
        for i = 1, math.random(0, n) do t[i] = string.char(math.random(97, 100)) end
        return table.concat(t)
      end
      local s, list = rnd(12), {}
      for i = 1, math.random(0, 4) do list[i] = rnd(3) end
      local want
      for i, w in ipairs(list) do if s:find(w, 1, true) then want = i; break end end
      assert.equal(want, bytes.find_any(s, list))
    end
  end)

  it("names a bad argument", function()
    assert.has_error(function() bytes.find_any("x", { "a", 1 }) end,
      "bad argument #2 to 'find_any' (item 2 is not a string)")
    assert.has_error(function() bytes.find_any("x") end)
  end)
end)
