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
local utf8_codes, ceil, type = utf8.codes, math.ceil, type
local byte, find = string.byte, string.find

local _M = {
  per_message = 4,
}

local function is_letter(c)
  return (c >= 65 and c <= 90) or (c >= 97 and c <= 122)
end

local function is_digit(c)
  return c >= 48 and c <= 57
end

-- Estimated tokens of a string.
function _M.estimate(text)
  if type(text) ~= "string" then
    error("bad argument #1 to 'estimate': string expected, got " .. type(text), 2)
  end
  if text == "" then return 0 end
  local n, letters, digits = 0, 0, 0
  local function flush()
    if letters > 0 then n = n + ceil(letters / 4); letters = 0 end
    if digits > 0 then n = n + ceil(digits / 3); digits = 0 end
  end
  if not find(text, "[\128-\255]") then
    -- ASCII fast path
    for i = 1, #text do
      local c = byte(text, i)
      if is_letter(c) then
        if digits > 0 then flush() end
        letters = letters + 1
      elseif is_digit(c) then
        if letters > 0 then flush() end
        digits = digits + 1
      else
        flush()
        if c > 32 and c ~= 127 then n = n + 1 end
      end
    end
    flush()
    return n
  end
  if not utf8.len(text) then
    -- not valid UTF-8: count every byte above 127 as a character
    for i = 1, #text do
      local c = byte(text, i)
      if c >= 128 then n = n + 1 elseif c > 32 then letters = letters + 1 end
    end
    return n + ceil(letters / 4)
  end
  for _, c in utf8_codes(text) do
    if c < 128 then
      if is_letter(c) then
        if digits > 0 then flush() end
        letters = letters + 1
      elseif is_digit(c) then
        if letters > 0 then flush() end
        digits = digits + 1
      else
        flush()
        if c > 32 and c ~= 127 then n = n + 1 end
      end
    else
      flush()
      n = n + 1
    end
  end
  flush()
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
