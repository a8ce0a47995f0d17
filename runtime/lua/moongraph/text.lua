--[[
moongraph.text — UTF-8 checks for text that crosses a boundary (command
lines, requests, JSON output).

  text.check_utf8(s) -> true | nil, byte position of the first bad sequence
  text.to_utf8(s)    -> s with every invalid sequence replaced by U+FFFD
]]

local utf8_len, string_sub = utf8.len, string.sub

local _M = {}

local REPLACEMENT = "\u{FFFD}"

function _M.check_utf8(s)
  local n, bad = utf8_len(s)
  if n then return true end
  return nil, bad
end

function _M.to_utf8(s)
  local n, bad = utf8_len(s)
  if n then return s end
  local out, i = {}, 1
  while bad do
    out[#out + 1] = string_sub(s, i, bad - 1)
    out[#out + 1] = REPLACEMENT
    i = bad + 1
    n, bad = utf8_len(s, i)
  end
  out[#out + 1] = string_sub(s, i)
  return table.concat(out)
end

return _M
