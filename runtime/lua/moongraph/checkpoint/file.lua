--[[
moongraph.checkpoint.file — the embedded durable checkpoint saver.

One directory per thread, one per namespace inside it, and in each an
append-only log of readable JSON records, one per line:

  <dir>/<thread>/<ns>/checkpoints.log
    {"type":"log","format":1,"log":"<token>"}
    <bytes> {"type":"checkpoint","id":...,"parent":...,"checkpoint":{...},"metadata":{...}}
    <bytes> {"type":"writes","id":<checkpoint id>,"task_id":...,"writes":[...]}

Each record line starts with the length of its JSON, so a record torn by a
crash (a put that never returned) is recognised and skipped. A put is one
append and one fdatasync under an exclusive flock of the log, by the C
store (moongraph.core.files) on libuv's thread pool: the calling task
yields, other tasks go on. A batch is one append. The later of two records
of one task's writes of one checkpoint wins.

The root namespace is the directory `root`; other names (thread ids,
subgraph namespaces) are percent-encoded to stay single, safe path
components. Directories written by earlier versions, one file per
checkpoint (<checkpoint_id>.json) and per task's writes
(<checkpoint_id>.<task>.writes.json), stay readable: their checkpoints are
read beside the log's, and a thread goes on from them.

Implements the saver interface described in docs/checkpoints.md.
]]

local type, pairs, ipairs, pcall, error, tostring, tonumber, setmetatable =
  type, pairs, ipairs, pcall, error, tostring, tonumber, setmetatable
local string_gsub, string_sub, string_match, string_find = string.gsub, string.sub, string.match, string.find
local table_sort, table_concat = table.sort, table.concat

local json = require "moongraph.json"
local ids = require "moongraph.ids"
local common = require "moongraph.checkpoint.common"
local paths = require "moongraph.paths"

local _M = {}
local saver = {}
local mt = { __index = saver, __name = "moongraph.checkpoint.file" }

local store
local function S()
  if not store then
    local ok, core = pcall(require, "moongraph.core")
    if not ok or not core.files then
      error("the file checkpointer needs the C module moongraph.core (build it with make)", 3)
    end
    store = core.files
  end
  return store
end

-- a string -> one safe path component, and back
local component, decode_component = paths.component, paths.decode_component

function _M.new(dir)
  if type(dir) ~= "string" or dir == "" then
    error("bad argument #1 to 'file': directory path expected, got " .. type(dir), 2)
  end
  dir = string_gsub(dir, "/+$", "")
  if dir == "" then dir = "/" end
  -- heads: namespace directory -> {size = bytes of its log read, latest = id}
  return setmetatable({ dir = dir, made = {}, heads = {} }, mt)
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

local LOG = "checkpoints.log"
-- A log's first line. Its `log` token, drawn when the log is made, tells a
-- saver that still knows the log by its size that another process removed
-- it and wrote a new one (earlier logs have none: their first line is
-- '{"type":"log","format":1}').
local function new_header()
  return '{"type":"log","format":1,"log":"' .. ids.unique() .. '"}\n'
end

-- The first line of log text when it is a log's header, else nil.
local function header_of(text)
  return text and string_match(text, '^({"type":"log"[^\n]*\n)') or nil
end

-- One record line: the length of its JSON, a space, the JSON.
local function record(text)
  return #text .. " " .. text .. "\n"
end

local function checkpoint_record(id, parent, cp, md)
  return record('{"type":"checkpoint","id":' .. json.encode(id) ..
    (parent and (',"parent":' .. json.encode(parent)) or "") ..
    ',"checkpoint":' .. cp .. ',"metadata":' .. md .. "}")
end

local function writes_record(cp_id, task_id, list)
  return record('{"type":"writes","id":' .. json.encode(cp_id) .. ',"task_id":' ..
    json.encode(task_id) .. ',"writes":' .. list .. "}")
end

--[[ The records of log text, added to idx:
  idx.ids      checkpoint ids, in the order first seen (sort before use)
  idx.cp       id -> its record's JSON text (or {file = old file name})
  idx.writes   id -> task id -> JSON text (or {file = ...}), the last wins
Lines whose length does not match (torn by a crash), and the header, are
skipped. Returns the bytes consumed: up to the last newline. ]]
local function index_text(text, idx)
  local pos, size = 1, #text
  while pos <= size do
    local nl = string_find(text, "\n", pos, true)
    if not nl then break end
    local len, start = string_match(text, "^(%d+) ()", pos)
    len = tonumber(len)
    if len and start + len == nl then
      local kind, id, after = string_match(text, '^{"type":"(%l+)","id":"([%w_%-%.:]*)"()', start)
      local task
      if kind == "writes" then
        task = string_match(text, '^,"task_id":"([%w_%-%.:#]*)"', after)
      end
      if not kind or (kind == "writes" and not task) then
        -- ids with characters a pattern cannot take as they are
        local rec = json.decode(string_sub(text, start, nl - 1))
        if type(rec) == "table" then kind, id, task = rec.type, rec.id, rec.task_id end
      end
      if kind == "checkpoint" and type(id) == "string" then
        if not idx.cp[id] then idx.ids[#idx.ids + 1] = id end
        idx.cp[id] = string_sub(text, start, nl - 1)
      elseif kind == "writes" and type(id) == "string" and type(task) == "string" then
        local w = idx.writes[id]
        if not w then w = {}; idx.writes[id] = w end
        w[task] = string_sub(text, start, nl - 1)
      end
    end
    pos = nl + 1
  end
  return pos - 1
end

local function new_index()
  return { ids = {}, cp = {}, writes = {} }
end

-- The checkpoints of files an earlier version wrote one per checkpoint.
local function index_old_files(dir, idx)
  local names, err, code = S().list(dir)
  if not names then
    if code == "ENOENT" then return true end
    return nil, err
  end
  for _, n in ipairs(names) do
    local id, rest = string_match(n, "^([^.]+)%.(.*)$")
    if rest == "json" then
      id = decode_component(id)
      if not idx.cp[id] then
        idx.ids[#idx.ids + 1] = id
        idx.cp[id] = { file = n }
      end
    elseif rest then
      local task = string_match(rest, "^([^.]+)%.writes%.json$")
      if task then
        id = decode_component(id)
        local w = idx.writes[id]
        if not w then w = {}; idx.writes[id] = w end
        task = decode_component(task)
        if not w[task] then w[task] = { file = n } end
      end
    end
  end
  return true
end

-- The whole namespace: its log and any files of the earlier layout ->
-- idx (ids sorted), bytes of the log read, the log's header | nil, err.
local function read_namespace(dir)
  local idx = new_index()
  local ok, err = index_old_files(dir, idx)
  if not ok then return nil, err end
  local text, rerr, code = S().read(dir .. "/" .. LOG)
  local size = 0
  if text then
    size = index_text(text, idx)
  elseif code ~= "ENOENT" then
    return nil, rerr
  end
  table_sort(idx.ids)
  return idx, size, header_of(text)
end

local function latest_of(ids, latest)
  for _, id in ipairs(ids) do
    if latest == nil or id > latest then latest = id end
  end
  return latest
end

-- The namespace's head as this saver last saw it (read once per process).
local function head(self, dir)
  local h = self.heads[dir]
  if h then return h end
  local idx, size, header = read_namespace(dir)
  if not idx then return nil, size end
  h = { size = size, latest = idx.ids[#idx.ids], header = header }
  self.heads[dir] = h
  return h
end

-- Conflict check of a put of `checkpoint` under cfg against the head.
local function check_head(h, cfg, checkpoint)
  local latest, want = h.latest, common.expected(cfg)
  if latest ~= nil and latest ~= want and latest ~= checkpoint.id then
    return nil, common.conflict_error(cfg.thread_id, cfg.checkpoint_ns or "", want, latest)
  end
  return true
end

--[[ Appends data (whole records) to the namespace's log. When another
writer appended first, its records are read (under the log's lock, so they
are whole), the head moves on, and `recheck(h)` (if given) decides again
before the next try. ]]
local function append(self, dir, data, recheck)
  local h, herr = head(self, dir)
  if not h then return nil, herr end
  if recheck then
    local ok, err = recheck(h)
    if not ok then return nil, err end
  end
  local ok, merr = mkdir(self, dir)
  if not ok then return nil, merr end
  local path = dir .. "/" .. LOG
  while true do
    local header = h.size == 0 and new_header() or nil
    local size, now, tail = S().append(path, header and (header .. data) or data, h.size, h.header)
    if size then
      h.size = size
      if header then h.header = header end
      return h
    end
    if size == nil then return nil, now end
    -- another writer got there first. A log that was removed and written
    -- again (shorter than we knew, or with another header) comes whole,
    -- from its header: what we knew of the old one is gone
    local whole = header_of(tail)
    if whole or now < h.size then
      h.latest = nil
      h.header = whole
    end
    local idx = new_index()
    index_text(tail, idx)
    h.size = now
    h.latest = latest_of(idx.ids, h.latest)
    if recheck then
      local cok, cerr = recheck(h)
      if not cok then return nil, cerr end
    end
  end
end

-- The record of one checkpoint, or nil, err.
local function encode_put(cfg, checkpoint, metadata)
  local cp, md = common.encode_checkpoint(checkpoint, metadata)
  if not cp then return nil, md end   -- md is the error
  return checkpoint_record(checkpoint.id, cfg.checkpoint_id, cp, md)
end

local function encode_put_writes(cfg, task_id, writes)
  local list, err = common.encode_writes(task_id, writes)
  if not list then return nil, err end
  return writes_record(cfg.checkpoint_id, task_id, list)
end

local function saved(cfg, checkpoint)
  return { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "", checkpoint_id = checkpoint.id }
end

-- optimistic concurrency (checkpoint/common.lua): decided under the log's
-- lock, so a second writer in this or another process is always seen
function saver:put(cfg, checkpoint, metadata)
  common.check_put(cfg, checkpoint)
  local data, err = encode_put(cfg, checkpoint, metadata)
  if not data then return nil, err end
  local h
  h, err = append(self, ns_dir(self, cfg), data, function(hd) return check_head(hd, cfg, checkpoint) end)
  if not h then return nil, err end
  h.latest = latest_of({ checkpoint.id }, h.latest)
  return saved(cfg, checkpoint)
end

function saver:put_writes(cfg, task_id, writes)
  common.check_put_writes(cfg, task_id)
  local data, err = encode_put_writes(cfg, task_id, writes)
  if not data then return nil, err end
  local ok
  ok, err = append(self, ns_dir(self, cfg), data)
  if not ok then return nil, err end
  return true
end

--[[ put_batch(list) -> true | nil, err: the writes of list ({op =, a =,
b =, c =}) in order, in one append per namespace: all of a namespace's or
none of them. A namespace's latest checkpoint is checked against the
batch's first checkpoint in it (the later ones extend that one). ]]
function saver:put_batch(list)
  local order, by_dir = {}, {}
  for i, o in ipairs(list) do
    local data, err
    if o.op == "put" then
      common.check_put(o.a, o.b)
      data, err = encode_put(o.a, o.b, o.c)
    elseif o.op == "put_writes" then
      common.check_put_writes(o.a, o.b)
      data, err = encode_put_writes(o.a, o.b, o.c)
    else
      error("bad argument #1 to 'put_batch': write " .. i .. " has an unknown op '" .. tostring(o.op) .. "'", 2)
    end
    if not data then return nil, err end
    local dir = ns_dir(self, o.a)
    local b = by_dir[dir]
    if not b then
      b = { parts = {} }
      by_dir[dir] = b
      order[#order + 1] = dir
    end
    b.parts[#b.parts + 1] = data
    if o.op == "put" then
      if not b.first then b.first = o end
      b.last = o.b.id
    end
  end
  for _, dir in ipairs(order) do
    local b = by_dir[dir]
    local first = b.first
    local h, err = append(self, dir, table_concat(b.parts),
      first and function(hd) return check_head(hd, first.a, first.b) end)
    if not h then return nil, err end
    if b.last then h.latest = latest_of({ b.last }, h.latest) end
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

-- A record (log text or an old file) decoded.
local function decode_record(dir, rec)
  if type(rec) == "table" then return read_json(dir .. "/" .. rec.file) end
  local v, err = json.decode(rec)
  if v == nil then return nil, dir .. "/" .. LOG .. ": " .. tostring(err) end
  return v
end

local function tuple(dir, idx, cfg, id)
  local rec = idx.cp[id]
  if not rec then return nil end
  local file, err = decode_record(dir, rec)
  if not file then return nil, err end
  local pending = {}
  local w = idx.writes[id]
  if w then
    -- by task id, as the earlier layout's file names sort
    local tasks = {}
    for task in pairs(w) do tasks[#tasks + 1] = task end
    table_sort(tasks, function(x, y) return component(x) < component(y) end)
    for _, task in ipairs(tasks) do
      local wr, werr = decode_record(dir, w[task])
      if not wr then return nil, werr end
      for _, pair in ipairs(wr.writes or {}) do
        pending[#pending + 1] = { wr.task_id, pair[1], pair[2] }
      end
    end
  end
  local ns = cfg.checkpoint_ns or ""
  local parent = file.parent or file.parent_checkpoint_id
  return {
    config = { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = id },
    checkpoint = file.checkpoint,
    metadata = file.metadata or {},
    parent_config = parent and { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = parent } or nil,
    pending_writes = pending,
  }
end

function saver:get(cfg)
  common.check_cfg(cfg, "get")
  local dir = ns_dir(self, cfg)
  local idx, err = read_namespace(dir)
  if not idx then return nil, err end
  local id = cfg.checkpoint_id or idx.ids[#idx.ids]
  if not id then return nil end
  return tuple(dir, idx, cfg, id)
end

function saver:list(cfg, opts)
  common.check_cfg(cfg, "list")
  local limit, before = common.list_opts(opts)
  local dir = ns_dir(self, cfg)
  local idx, err = read_namespace(dir)
  if not idx then return nil, err end
  local out = {}
  for i = #idx.ids, 1, -1 do
    local id = idx.ids[i]
    if before == nil or id < before then
      local t, terr = tuple(dir, idx, cfg, id)
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
  for p in pairs(self.heads) do
    if string_sub(p, 1, #path + 1) == path .. "/" then self.heads[p] = nil end
  end
  return true
end

return _M
