--[[
moongraph.checkpoint.file — the embedded durable checkpoint saver.

One directory per thread, one per namespace inside it, readable JSON files:

  <dir>/<thread>/<ns>/<checkpoint_id>.json                checkpoint + metadata + parent
  <dir>/<thread>/<ns>/<checkpoint_id>.<task>.writes.json  pending writes of one task

The root namespace is the directory `root`; other names (thread ids,
subgraph namespaces, task ids) are percent-encoded to stay single, safe path
components. Every file is written atomically (temp file, fsync, rename, fsync
of the directory) by the C store (moongraph.core.store), whose work runs on
libuv's thread pool: the calling task yields, other tasks go on. A crash
leaves either the old file or the new one, never a torn one.

Implements the saver interface described in docs/checkpoints.md.
]]

local type, pairs, ipairs, pcall, error, tostring, tonumber, setmetatable =
  type, pairs, ipairs, pcall, error, tostring, tonumber, setmetatable
local string_format, string_gsub, string_byte, string_sub, string_match =
  string.format, string.gsub, string.byte, string.sub, string.match
local table_sort = table.sort

local json = require "moongraph.json"
local common = require "moongraph.checkpoint.common"

local _M = {}
local saver = {}
local mt = { __index = saver, __name = "moongraph.checkpoint.file" }

local store
local function S()
  if not store then
    local ok, core = pcall(require, "moongraph.core")
    if not ok or not core.store then
      error("the file checkpointer needs the C module moongraph.core (build it with make)", 3)
    end
    store = core.store
  end
  return store
end

local function enc_char(c)
  return string_format("%%%02X", string_byte(c))
end

-- a string -> one safe path component
local function component(s)
  s = string_gsub(s, "[^%w_%-]", enc_char)
  return s
end
local function decode_component(s)
  return (string_gsub(s, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

function _M.new(dir)
  if type(dir) ~= "string" or dir == "" then
    error("bad argument #1 to 'file': directory path expected, got " .. type(dir), 2)
  end
  dir = string_gsub(dir, "/+$", "")
  if dir == "" then dir = "/" end
  -- the engine may have this many writes in flight (libuv's pool has 4 threads)
  return setmetatable({ dir = dir, made = {}, concurrent_writes = 4 }, mt)
end

local function thread_dir(self, thread_id)
  return self.dir .. "/" .. component(thread_id)
end

local function ns_dir(self, cfg)
  local ns = cfg.checkpoint_ns or ""
  return thread_dir(self, cfg.thread_id) .. "/" .. (ns == "" and "root" or component(ns))
end

local function mkdir(self, path)
  if self.made[path] then return true end
  local ok, err = S().mkdir(path)
  if not ok then return nil, err end
  self.made[path] = true
  return true
end

local function write(self, dirpath, name, data)
  local ok, err = mkdir(self, dirpath)
  if not ok then return nil, err end
  return S().write(dirpath .. "/" .. name, data)
end

-- A namespace directory -> sorted checkpoint ids, and the names of the
-- pending-write files of each checkpoint (sorted: by task id). Temporary
-- files of interrupted writes do not end in .json and are skipped.
local function scan(dir)
  local names, err, code = S().list(dir)
  if not names then
    if code == "ENOENT" then return {}, {} end
    return nil, err
  end
  local out, writes = {}, {}
  for _, n in ipairs(names) do
    local id, rest = string_match(n, "^([^.]+)%.(.*)$")
    if rest == "json" then
      out[#out + 1] = decode_component(id)
    elseif rest and string_match(rest, "^[^.]+%.writes%.json$") then
      id = decode_component(id)
      local l = writes[id]
      if not l then l = {}; writes[id] = l end
      l[#l + 1] = n
    end
  end
  table_sort(out)
  return out, writes
end

-- Write one checkpoint; `check`: compare the namespace's latest first.
local function put_one(self, cfg, checkpoint, metadata, check)
  local cp, md = common.encode_checkpoint(checkpoint, metadata, true)
  if not cp then return nil, md end   -- md is the error
  -- optimistic concurrency (checkpoint/common.lua): checked against the
  -- directory, so a second writer in this or another process that has
  -- moved on is seen; two processes writing in the same instant are not
  local dir = ns_dir(self, cfg)
  if check then
    local ids, serr = scan(dir)
    if not ids then return nil, serr end
    local latest, want = ids[#ids], common.expected(cfg)
    if latest ~= nil and latest ~= want and latest ~= checkpoint.id then
      return nil, common.conflict_error(cfg.thread_id, cfg.checkpoint_ns or "", want, latest)
    end
  end
  local data = '{\n"checkpoint": ' .. cp .. ',\n"metadata": ' .. md ..
    (cfg.checkpoint_id and (',\n"parent_checkpoint_id": ' .. json.encode(cfg.checkpoint_id)) or "") .. "\n}\n"
  local ok, err = write(self, dir, component(checkpoint.id) .. ".json", data)
  if not ok then return nil, err end
  return { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "", checkpoint_id = checkpoint.id }
end

function saver:put(cfg, checkpoint, metadata)
  common.check_put(cfg, checkpoint)
  return put_one(self, cfg, checkpoint, metadata, true)
end

local function put_writes_one(self, cfg, task_id, writes)
  local list, err = common.encode_writes(task_id, writes, true)
  if not list then return nil, err end
  local data = '{\n"task_id": ' .. json.encode(task_id) .. ',\n"writes": ' .. list .. "\n}\n"
  local ok
  ok, err = write(self, ns_dir(self, cfg),
    component(cfg.checkpoint_id) .. "." .. component(task_id) .. ".writes.json", data)
  if not ok then return nil, err end
  return true
end

function saver:put_writes(cfg, task_id, writes)
  common.check_put_writes(cfg, task_id)
  return put_writes_one(self, cfg, task_id, writes)
end

--[[ put_batch(list) -> true | nil, err: the writes of list ({op =, a =,
b =, c =}) one after the other, in order; a namespace's latest checkpoint
is checked before the batch's first checkpoint in it (the later ones extend
that one). A failure stops the batch: what was written stays (each file is
whole), what follows is not written. ]]
function saver:put_batch(list)
  local checked = {}
  for i, o in ipairs(list) do
    local ok, err
    if o.op == "put" then
      common.check_put(o.a, o.b)
      local ns = o.a.checkpoint_ns or ""
      ok, err = put_one(self, o.a, o.b, o.c, not checked[ns])
      checked[ns] = true
    elseif o.op == "put_writes" then
      common.check_put_writes(o.a, o.b)
      ok, err = put_writes_one(self, o.a, o.b, o.c)
    else
      error("bad argument #1 to 'put_batch': write " .. i .. " has an unknown op '" .. tostring(o.op) .. "'", 2)
    end
    if not ok then return nil, err end
  end
  return true
end

local function read_json(path)
  local data, err, code = S().read(path)
  if not data then return nil, err, code end
  local v, derr = json.decode(data)
  if v == nil then return nil, path .. ": " .. derr end
  return v
end

local function tuple(self, cfg, id, write_files)
  local dir = ns_dir(self, cfg)
  local file, err, code = read_json(dir .. "/" .. component(id) .. ".json")
  if not file then
    if code == "ENOENT" then return nil end
    return nil, err
  end
  local pending = {}
  if write_files then
    table_sort(write_files)
    for _, n in ipairs(write_files) do
      local w, werr = read_json(dir .. "/" .. n)
      if not w then return nil, werr end
      for _, pair in ipairs(w.writes or {}) do
        pending[#pending + 1] = { w.task_id, pair[1], pair[2] }
      end
    end
  end
  local ns = cfg.checkpoint_ns or ""
  return {
    config = { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = id },
    checkpoint = file.checkpoint,
    metadata = file.metadata or {},
    parent_config = file.parent_checkpoint_id and
      { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = file.parent_checkpoint_id } or nil,
    pending_writes = pending,
  }
end

function saver:get(cfg)
  common.check_cfg(cfg, "get")
  local list, writes = scan(ns_dir(self, cfg))
  if not list then return nil, writes end
  local id = cfg.checkpoint_id or list[#list]
  if not id then return nil end
  return tuple(self, cfg, id, writes[id])
end

function saver:list(cfg, opts)
  common.check_cfg(cfg, "list")
  local limit, before = common.list_opts(opts)
  local list, writes = scan(ns_dir(self, cfg))
  if not list then return nil, writes end
  local out = {}
  for i = #list, 1, -1 do
    local id = list[i]
    if before == nil or id < before then
      local t, terr = tuple(self, cfg, id, writes[id])
      if terr then return nil, terr end
      if t then out[#out + 1] = t end
      if limit and #out >= limit then break end
    end
  end
  return out
end

function saver:delete_thread(thread_id)
  if thread_id == nil then
    error("bad argument #1 to 'delete_thread': thread id expected", 2)
  end
  local path = thread_dir(self, tostring(thread_id))
  local ok, err = S().remove(path)
  if not ok then return nil, err end
  for p in pairs(self.made) do
    if string_sub(p, 1, #path + 1) == path .. "/" then self.made[p] = nil end
  end
  return true
end

return _M
