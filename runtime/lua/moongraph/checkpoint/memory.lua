--[[
moongraph.checkpoint.memory — an in-process checkpoint saver.

Keeps checkpoints and pending writes in Lua tables for the life of the
process. What is stored is a copy that no caller ever holds: put copies
what it is given and get hands out copies of its own. The copies are those
the JSON codec would give back (moongraph.json copy: integers and floats
kept apart, empty arrays marked, unsavable values refused with their path),
so a graph that works with this saver works with the file, Redis and
Postgres savers too.
Implements the saver interface described in docs/checkpoints.md.
]]

local type, pairs, ipairs, error, tostring, setmetatable = type, pairs, ipairs, error, tostring, setmetatable
local table_sort = table.sort

local json = require "moongraph.json"
local common = require "moongraph.checkpoint.common"

local copy = json.copy

local _M = {}
local saver = {}
local mt = { __index = saver, __name = "moongraph.checkpoint.memory" }

-- its calls never yield: the engine calls it inline (engine/writer.lua)
saver.yields = false

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
    s = { ids = {}, items = {}, writes = {} }
    thread[ns] = s
  end
  return s
end

function saver:put(cfg, checkpoint, metadata)
  common.check_put(cfg, checkpoint)
  local cp, md = common.copy_checkpoint(checkpoint, metadata)
  if not cp then return nil, md end   -- md is the error
  local s = space(self, cfg, true)
  local id = checkpoint.id
  local latest = s.ids[#s.ids]
  local want = common.expected(cfg)
  if latest ~= nil and latest ~= want and latest ~= id then
    return nil, common.conflict_error(cfg.thread_id, cfg.checkpoint_ns or "", want, latest)
  end
  if not s.items[id] then
    local ids = s.ids
    ids[#ids + 1] = id
    if ids[#ids - 1] and ids[#ids - 1] > id then table_sort(ids) end
  end
  s.items[id] = { cp = cp, md = md, parent = cfg.checkpoint_id }
  return { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "", checkpoint_id = id }
end

function saver:put_writes(cfg, task_id, writes)
  common.check_put_writes(cfg, task_id)
  local enc, err = common.copy_writes(task_id, writes)
  if not enc then return nil, err end
  local s = space(self, cfg, true)
  local w = s.writes[cfg.checkpoint_id]
  if not w then
    w = {}
    s.writes[cfg.checkpoint_id] = w
  end
  w[task_id] = enc
  return true
end

local function tuple(cfg, s, id)
  local item = s.items[id]
  if not item then return nil end
  local ns = cfg.checkpoint_ns or ""
  local pending = {}
  local w = s.writes[id]
  if w then
    local tasks = {}
    for task_id in pairs(w) do tasks[#tasks + 1] = task_id end
    table_sort(tasks)
    for _, task_id in ipairs(tasks) do
      for _, pair in ipairs(w[task_id]) do
        pending[#pending + 1] = { task_id, pair[1], copy(pair[2]) }
      end
    end
  end
  return {
    config = { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = id },
    checkpoint = copy(item.cp),
    metadata = copy(item.md),
    parent_config = item.parent and
      { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = item.parent } or nil,
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
