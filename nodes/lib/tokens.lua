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
--   (text that is not valid UTF-8: 1 token per byte above 127, and the
--   other bytes from 33 up count as letters of one run)
--
-- and each chat message adds `per_message` tokens for its role framing.
local type = type
local token_estimate = require("moongraph.core").codepoints.token_estimate

local _M = {
  per_message = 4,
}

-- Estimated tokens of a string (one pass in C, runtime/codepoints.c: a
-- loop over the characters here cost more than the rest of the summary).
function _M.estimate(text)
  if type(text) ~= "string" then
    error("bad argument #1 to 'estimate': string expected, got " .. type(text), 2)
  end
  return token_estimate(text)
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
