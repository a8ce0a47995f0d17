--[[
moongraph.checkpoint.memory — an in-process checkpoint saver.

Keeps checkpoints and pending writes for the life of the process. Each
checkpoint with its metadata, and each task's writes, are kept packed
(moongraph.json pack: one string each), so nothing a caller holds is
shared with the store, and get hands out new tables equal to what the
JSON codec would give back (integers and floats kept apart, empty arrays
marked, unsavable values refused with their path): a graph that works with
this saver works with the file, Redis and Postgres savers too.
Implements the saver interface described in docs/checkpoints.md.
]]

local type, pairs, ipairs, error, tostring, setmetatable = type, pairs, ipairs, error, tostring, setmetatable
local table_sort = table.sort

local json = require "moongraph.json"
local common = require "moongraph.checkpoint.common"

local pack, unpack, null = json.pack, json.unpack, json.null
local EMPTY = {}

local _M = {}
local saver = {}
local mt = { __index = saver, __name = "moongraph.checkpoint.memory" }

-- its calls never yield: the engine calls it inline (engine/writer.lua)
saver.yields = false
-- put and put_writes keep packed copies, never the tables they are given:
-- the engine may reuse those once a call returns
saver.keeps_copies = true

function _M.new()
  return setmetatable({ threads = {} }, mt)
end

local function space(self, cfg, create)
  local thread = self.threads[cfg.thread_id]
  if not thread then
    if not create then return nil end
    thread = {}
    self.threads[cfg.thread_id] = thread
  end
  local ns = cfg.checkpoint_ns or ""
  local s = thread[ns]
  if not s and create then
    -- per checkpoint id: its checkpoint, metadata and parent id (false:
    -- none) packed together, and its tasks' writes, each packed with its
    -- task id: one task's string, or a table of them by task id
    s = { ids = {}, items = {}, writes = {} }
    thread[ns] = s
  end
  return s
end

function saver:put(cfg, checkpoint, metadata)
  common.check_put(cfg, checkpoint)
  local packed = pack(checkpoint, metadata or EMPTY, cfg.checkpoint_id or false)
  if not packed then
    local _, err = common.encode_checkpoint(checkpoint, metadata)
    return nil, err
  end
  local thread = self.threads[cfg.thread_id]
  local s = thread and thread[cfg.checkpoint_ns or ""] or space(self, cfg, true)
  local id = checkpoint.id
  local ids = s.ids
  local latest = ids[#ids]
  -- common.expected(cfg)
  local want = cfg.head_id
  if want == nil then want = cfg.checkpoint_id or false end
  if latest ~= nil and latest ~= want and latest ~= id then
    return nil, common.conflict_error(cfg.thread_id, cfg.checkpoint_ns or "", want, latest)
  end
  if not s.items[id] then
    ids[#ids + 1] = id
    if ids[#ids - 1] and ids[#ids - 1] > id then table_sort(ids) end
  end
  s.items[id] = packed
  return { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "", checkpoint_id = id }
end

function saver:put_writes(cfg, task_id, writes)
  common.check_put_writes(cfg, task_id)
  local packed, err = common.pack_writes(task_id, writes)
  if not packed then return nil, err end
  local thread = self.threads[cfg.thread_id]
  local writes_of = (thread and thread[cfg.checkpoint_ns or ""] or space(self, cfg, true)).writes
  local id = cfg.checkpoint_id
  local w = writes_of[id]
  if w == nil then
    writes_of[id] = packed
  elseif type(w) == "string" then
    local first = unpack(w)
    writes_of[id] = first == task_id and packed or { [first] = w, [task_id] = packed }
  else
    w[task_id] = packed
  end
  return true
end

local function tuple(cfg, s, id)
  local item = s.items[id]
  if not item then return nil end
  local checkpoint, metadata, parent = unpack(item)
  local ns = cfg.checkpoint_ns or ""
  local pending = {}
  local w = s.writes[id]
  if type(w) == "string" then w = { w } end
  if w then
    local tasks, by_task = {}, {}
    for _, packed in pairs(w) do
      local task_id, list = unpack(packed)
      tasks[#tasks + 1] = task_id
      by_task[task_id] = list
    end
    table_sort(tasks)
    for _, task_id in ipairs(tasks) do
      local list = by_task[task_id]
      for i = 1, #list do
        local pair = list[i]
        local v = pair[2]
        if v == nil then v = null end
        pending[#pending + 1] = { task_id, pair[1], v }
      end
    end
  end
  return {
    config = { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = id },
    checkpoint = checkpoint,
    metadata = metadata,
    parent_config = parent and
      { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = parent } or nil,
    pending_writes = pending,
  }
end

function saver:get(cfg)
  common.check_cfg(cfg, "get")
  local s = space(self, cfg, false)
  if not s then return nil end
  local id = cfg.checkpoint_id or s.ids[#s.ids]
  if not id then return nil end
  return tuple(cfg, s, id)
end

function saver:list(cfg, opts)
  common.check_cfg(cfg, "list")
  local limit, before = common.list_opts(opts)
  local out = {}
  local s = space(self, cfg, false)
  if not s then return out end
  for i = #s.ids, 1, -1 do
    local id = s.ids[i]
    if before == nil or id < before then
      out[#out + 1] = tuple(cfg, s, id)
      if limit and #out >= limit then break end
    end
  end
  return out
end

function saver:delete_thread(thread_id)
  if thread_id == nil then
    error("bad argument #1 to 'delete_thread': thread id expected", 2)
  end
  self.threads[tostring(thread_id)] = nil
  return true
end

return _M
