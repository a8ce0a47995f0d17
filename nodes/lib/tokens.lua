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
local ceil, type, error = math.ceil, type, error

local _M = {
  per_message = 4,
}

local gsub, gmatch = string.gsub, string.gmatch

-- Estimated tokens of a string. Counting is done with the string library's
-- matchers: a UTF-8 lead byte starts one non-ASCII character.
function _M.estimate(text)
  if type(text) ~= "string" then
    error("bad argument #1 to 'estimate': string expected, got " .. type(text), 2)
  end
  local _, n = gsub(text, "[\192-\247]", "")
  for w in gmatch(text, "[A-Za-z]+") do n = n + ceil(#w / 4) end
  for d in gmatch(text, "[0-9]+") do n = n + ceil(#d / 3) end
  local _, p = gsub(text, "[!-/:-@%[-`{-~]", "")
  return n + p
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
