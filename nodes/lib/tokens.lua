-- A Korean-aware estimate of how many LLM tokens a text costs, without a
-- tokenizer. Byte-pair vocabularies of current chat models spend about one
-- token per Hangul syllable (often more), while English averages about four
-- characters per token; counting bytes or whitespace words gets Korean wrong
-- by a factor of three either way. The estimate:
--
--   Hangul syllable or jamo, CJK ideograph, kana      1 token each
--   other non-ASCII character (emoji, symbols)         1 token each
--   a run of ASCII letters                             ceil(length / 4)
--   a run of digits                                    ceil(length / 3)
--   ASCII punctuation                                  1 token each
--   whitespace                                         free
--
-- and each chat message adds `per_message` tokens for its role framing.
local ceil, type = math.ceil, type
local byte, find, codepoint, ulen = string.byte, string.find, utf8.codepoint, utf8.len

local _M = {
  per_message = 4,
}

-- Bytes (or code points) are taken CHUNK at a time into a table and
-- counted in one loop: a call per character would cost more than the count.
local CHUNK = 4096

-- Counts a list of character codes (bytes or code points) from index 1 to
-- n, carrying the open ASCII letter and digit runs across calls.
local function count(cs, n, total, letters, digits)
  for k = 1, n do
    local c = cs[k]
    if c >= 128 then
      if letters > 0 then total = total + ceil(letters / 4); letters = 0 end
      if digits > 0 then total = total + ceil(digits / 3); digits = 0 end
      total = total + 1
    elseif c >= 97 and c <= 122 or c >= 65 and c <= 90 then
      if digits > 0 then total = total + ceil(digits / 3); digits = 0 end
      letters = letters + 1
    elseif c >= 48 and c <= 57 then
      if letters > 0 then total = total + ceil(letters / 4); letters = 0 end
      digits = digits + 1
    else
      if letters > 0 then total = total + ceil(letters / 4); letters = 0 end
      if digits > 0 then total = total + ceil(digits / 3); digits = 0 end
      if c > 32 and c ~= 127 then total = total + 1 end
    end
  end
  return total, letters, digits
end

-- Estimated tokens of a string.
function _M.estimate(text)
  if type(text) ~= "string" then
    error("bad argument #1 to 'estimate': string expected, got " .. type(text), 2)
  end
  if text == "" then return 0 end
  local size = #text
  local n, letters, digits = 0, 0, 0
  if not find(text, "[\128-\255]") then
    -- ASCII: bytes are characters
    for i = 1, size, CHUNK do
      local j = i + CHUNK - 1
      if j > size then j = size end
      n, letters, digits = count({ byte(text, i, j) }, j - i + 1, n, letters, digits)
    end
  elseif not ulen(text) then
    -- not valid UTF-8: count every byte above 127 as a character
    for i = 1, size do
      local c = byte(text, i)
      if c >= 128 then n = n + 1 elseif c > 32 then letters = letters + 1 end
    end
    return n + ceil(letters / 4)
  else
    -- code points of the characters that start in each chunk of bytes
    local i = 1
    while i <= size do
      local j = i + CHUNK - 1
      if j >= size then
        j = size
      else
        -- end the chunk before the character that starts at j + 1 continues
        while true do
          local b = byte(text, j + 1)
          if b < 128 or b >= 192 then break end
          j = j - 1
        end
      end
      local cs = { codepoint(text, i, j) }
      n, letters, digits = count(cs, #cs, n, letters, digits)
      i = j + 1
    end
  end
  if letters > 0 then n = n + ceil(letters / 4) end
  if digits > 0 then n = n + ceil(digits / 3) end
  return n
end

-- Estimated tokens of a chat message ({role, content}) or a list of them.
function _M.messages(list)
  if type(list) ~= "table" then
    error("bad argument #1 to 'messages': list of messages expected, got " .. type(list), 2)
  end
  local total = 0
  for i = 1, #list do
    local m = list[i]
    local content = type(m) == "table" and m.content or m
    if type(content) == "string" then
      total = total + _M.estimate(content) + _M.per_message
    end
  end
  return total
end

return _M
