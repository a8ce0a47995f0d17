--[[
moongraph.reducers — how a state key combines the writes it receives.

A reducer is `function(old, new) -> value`; it must not modify `old` (earlier
state snapshots share it). The engine applies the writes of one superstep in
a fixed order: edge-triggered tasks by node name, then Send tasks by send
index. The built-in reducers also have a batch form (`batch[fn]`) that folds
all writes of a step in one pass, so 1,000 Send results appended to a list
copy the list once, not 1,000 times.

  last      the new value replaces the old; two writes in one step are an error
  append    lists: a list value is concatenated, any other value is one item
  merge     tables: shallow merge, keys of the new table win
  add       numbers: old + new (a missing old value counts as 0)
  messages  chat messages: appended; a message whose `id` is already present
            replaces it in place; `remove(id)` deletes one, `remove(REMOVE_ALL)`
            clears the list. A string is taken as {role="user", content=s};
            a message without `id` gets a fresh one.
]]

local type, pairs, next, error, tostring = type, pairs, next, error, tostring
local ids = require "moongraph.ids"
local table_unpack, table_move = table.unpack, table.move

local _M = {}

_M.REMOVE_ALL = "__remove_all__"

local function is_list(v)
  return type(v) == "table" and (v[1] ~= nil or next(v) == nil)
end
_M.is_list = is_list

function _M.last(_, new)
  return new
end

-- a copy of list `old` (or {old}) with room for `extra` more items; the
-- array is sized once (table.unpack into a constructor) for lists that fit
-- on the stack
local UNPACK_MAX = 4096
local function grown(old, extra)
  if old == nil then return {}, 0 end
  if not is_list(old) then return { old }, 1 end
  local n = #old
  if n + extra <= UNPACK_MAX then
    return { table_unpack(old, 1, n + extra) }, n
  end
  return table_move(old, 1, n, 1, {}), n
end

function _M.append(old, new)
  if type(new) ~= "table" then
    -- one item onto a list: the usual case, without the helpers' calls
    if type(old) == "table" and old[1] ~= nil then
      local n = #old
      if n < UNPACK_MAX then
        local out = { table_unpack(old, 1, n + 1) }
        out[n + 1] = new
        return out
      end
    end
    local out, n = grown(old, 1)
    out[n + 1] = new
    return out
  end
  if is_list(new) then
    local k = #new
    local out, n = grown(old, k)
    for i = 1, k do out[n + i] = new[i] end
    return out
  end
  local out, n = grown(old, 1)
  out[n + 1] = new
  return out
end

function _M.merge(old, new)
  local out = {}
  if old ~= nil then
    if type(old) ~= "table" then
      error("merge reducer: current value is a " .. type(old) .. ", not a table", 2)
    end
    for k, v in pairs(old) do out[k] = v end
  end
  if new ~= nil then
    if type(new) ~= "table" then
      error("merge reducer: written value is a " .. type(new) .. ", not a table", 2)
    end
    for k, v in pairs(new) do out[k] = v end
  end
  return out
end

function _M.add(old, new)
  if type(new) ~= "number" then
    error("add reducer: written value is a " .. type(new) .. ", not a number", 2)
  end
  if old == nil then return new end
  if type(old) ~= "number" then
    error("add reducer: current value is a " .. type(old) .. ", not a number", 2)
  end
  return old + new
end

--[[ remove(id): a marker message for the messages reducer that deletes the
message with that id (or every message, with REMOVE_ALL). It is plain data,
so it survives checkpoints. ]]
function _M.remove(id)
  if type(id) ~= "string" then
    error("bad argument #1 to 'remove': message id (string) expected, got " .. type(id), 2)
  end
  return { type = "remove", id = id }
end

-- Ids for messages that come without one: never the same in two processes
-- of one thread.
local function fresh_id()
  return "msg-" .. ids.unique()
end

local function coerce_message(m)
  if type(m) == "string" then
    return { role = "user", content = m, id = fresh_id() }
  end
  if type(m) ~= "table" then
    error("messages reducer: a message must be a table or a string, got " .. type(m), 3)
  end
  if m.id == nil then
    local c = {}
    for k, v in pairs(m) do c[k] = v end
    c.id = fresh_id()
    return c
  end
  return m
end

local function messages_into(out, index, new)
  local items = is_list(new) and new or { new }
  for i = 1, #items do
    local m = coerce_message(items[i])
    if m.type == "remove" then
      if m.id == _M.REMOVE_ALL then
        for j = #out, 1, -1 do out[j] = nil end
        for k in pairs(index) do index[k] = nil end
      else
        local pos = index[m.id]
        if pos == nil then
          error("messages reducer: cannot remove message '" .. tostring(m.id) ..
            "': no message has that id", 3)
        end
        table.remove(out, pos)
        index[m.id] = nil
        for j = pos, #out do index[out[j].id] = j end
      end
    else
      local pos = index[m.id]
      if pos then
        out[pos] = m
      else
        out[#out + 1] = m
        index[m.id] = #out
      end
    end
  end
end

local function messages_many(old, list)
  local out, index = {}, {}
  if old ~= nil then
    local items = is_list(old) and old or { old }
    for i = 1, #items do
      local m = coerce_message(items[i])
      out[i] = m
      index[m.id] = i
    end
  end
  for i = 1, #list do messages_into(out, index, list[i]) end
  return out
end

function _M.messages(old, new)
  return messages_many(old, { new })
end

-- Batch forms: fn(old, {w1, w2, ...}) -> value, equal to folding fn over
-- the writes in order.
local batch = {}
_M.batch = batch

batch[_M.append] = function(old, list)
  local extra = 0
  for j = 1, #list do
    local new = list[j]
    extra = extra + (is_list(new) and #new or 1)
  end
  local out, n = grown(old, extra)
  for j = 1, #list do
    local new = list[j]
    if is_list(new) then
      for i = 1, #new do out[n + i] = new[i] end
      n = n + #new
    else
      n = n + 1
      out[n] = new
    end
  end
  return out
end

batch[_M.merge] = function(old, list)
  local v = old
  local out = {}
  if v ~= nil then
    if type(v) ~= "table" then
      error("merge reducer: current value is a " .. type(v) .. ", not a table", 2)
    end
    for k, x in pairs(v) do out[k] = x end
  end
  for j = 1, #list do
    local new = list[j]
    if type(new) ~= "table" then
      error("merge reducer: written value is a " .. type(new) .. ", not a table", 2)
    end
    for k, x in pairs(new) do out[k] = x end
  end
  return out
end

batch[_M.add] = function(old, list)
  local v = old
  for j = 1, #list do v = _M.add(v, list[j]) end
  return v
end

batch[_M.messages] = messages_many

-- Reducers by name, for schemas written as { key = "append" }.
_M.by_name = {
  last = _M.last, append = _M.append, merge = _M.merge,
  add = _M.add, messages = _M.messages,
}

return _M
