--[[
moongraph.text — text that crosses a boundary: UTF-8 checks for command
lines, requests and JSON output, and error values made readable.

  text.check_utf8(s)     -> true | nil, byte position of the first bad sequence
  text.to_utf8(s)        -> s with every invalid sequence replaced by U+FFFD
  text.error_message(e)  -> an error value as a message without the
                            traceback a task or xpcall added to it
  text.delete_bytes(s, set) -> s without any byte that occurs in set (one
                            pass in C, where gsub(s, "[...]+", "") tries a
                            pattern at every byte)
]]

local type, tostring = type, tostring
local utf8_len, string_sub, string_find = utf8.len, string.sub, string.find

local bytes = require("moongraph.core").bytes

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

function _M.error_message(e)
  if type(e) ~= "string" then
    if type(e) == "table" and e.message ~= nil then e = tostring(e.message)
    else return tostring(e) end
  end
  local cut = string_find(e, "\nstack traceback:", 1, true)
  if cut then return string_sub(e, 1, cut - 1) end
  return e
end

function _M.delete_bytes(s, set)
  if type(s) ~= "string" then
    error("bad argument #1 to 'delete_bytes' (string expected, got " .. type(s) .. ")", 2)
  end
  if type(set) ~= "string" then
    error("bad argument #2 to 'delete_bytes' (string expected, got " .. type(set) .. ")", 2)
  end
  return bytes.delete(s, set)
end

return _M
