--[[
moongraph.ids — the rule for ids a caller chooses: thread ids, job ids,
user ids. They become file names (the file saver), Redis keys and stream
names, so they are short and plain: 1 to 200 characters, each a letter, a
digit or one of - _ . : @ (ASCII only).

  ids.check(v [, what]) -> true | nil, "what must be ..."
]]

local type = type

local _M = {}

_M.MAX = 200
_M.PATTERN = "^[%w%-_%.:@]+$"

function _M.valid(v)
  return type(v) == "string" and v ~= "" and #v <= _M.MAX and v:find(_M.PATTERN) ~= nil
end

function _M.check(v, what)
  if _M.valid(v) then return true end
  return nil, (what or "id") .. " must be 1.." .. _M.MAX .. " letters, digits or - _ . : @"
end

return _M
