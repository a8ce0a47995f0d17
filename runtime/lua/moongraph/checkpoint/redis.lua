--[[
moongraph.checkpoint.redis — a checkpoint saver on Redis.

  mg.checkpoint.redis("redis://127.0.0.1:6379/0", { ttl = 3600, prefix = "moongraph:cp" })
  mg.checkpoint.redis(conn_or_pool, opts)   -- a moongraph.redis connection or pool

Keys of one thread share a hash tag, so they live together in a cluster:

  <prefix>:{<thread>}:ns                    set of the thread's namespaces
  <prefix>:{<thread>}:<ns>:ids              sorted set of checkpoint ids (lexical)
  <prefix>:{<thread>}:<ns>:cp:<id>          hash: cp, md, parent (JSON, JSON, id)
  <prefix>:{<thread>}:<ns>:w:<id>           hash: task id -> JSON list of {channel, value}

Thread ids and namespaces are percent-encoded in key names. Each put,
put_writes and put_batch is one MULTI/EXEC, or with a checkpoint in it one
script that first checks that each namespace's latest checkpoint is the one
the write extends (optimistic concurrency, checkpoint/common.lua). A saver
with `cache_only` set (the cached saver's Redis) skips that check: it copies
what Postgres already took. With `ttl` (seconds) every key written expires
that long after its last write: Redis then serves as a cache, not a store.
Durability is Redis' own: run it with appendonly (and appendfsync always for
no loss on a crash) when these checkpoints must survive a restart.

Implements the saver interface of docs/checkpoints.md: put, put_writes, get,
list, delete_thread; runtime failures return nil, err.
]]

local type, error, tostring, setmetatable, ipairs, pairs, getmetatable =
  type, error, tostring, setmetatable, ipairs, pairs, getmetatable
local format, gsub, byte = string.format, string.gsub, string.byte
local sort, concat = table.sort, table.concat

local errors = require "moongraph.errors"
local json = require "moongraph.json"
local common = require "moongraph.checkpoint.common"

local _M = {}
local saver = {}
local mt = { __index = saver, __name = "moongraph.checkpoint.redis" }

local function enc_char(c) return format("%%%02X", byte(c)) end
local function enc(s) return (gsub(s, "[%%:{}%s]", enc_char)) end

function _M.new(target, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #2 to 'redis': options table expected, got " .. type(opts), 2)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "ttl" and k ~= "prefix" then
      error("bad argument #2 to 'redis': unknown option '" .. tostring(k) .. "'", 2)
    end
  end
  if opts.ttl ~= nil and (type(opts.ttl) ~= "number" or opts.ttl <= 0) then
    error("bad argument #2 to 'redis': ttl must be a positive number of seconds", 2)
  end
  if opts.prefix ~= nil and (type(opts.prefix) ~= "string" or opts.prefix == "") then
    error("bad argument #2 to 'redis': prefix must be a non-empty string", 2)
  end
  local client
  if type(target) == "string" then
    local redis = require "moongraph.redis"
    local ok, cfg_err = redis.parse_url(target)
    if not ok then error("bad argument #1 to 'redis': " .. cfg_err, 2) end
    client = redis.pool(target, { size = 2 })
  elseif type(target) == "table" and type(target.call) == "function"
      and type(target.pipeline) == "function" then
    client = target
  else
    error("bad argument #1 to 'redis': Redis URL, connection or pool expected, got " .. type(target), 2)
  end
  return setmetatable({
    client = client,
    prefix = opts.prefix or "moongraph:cp",
    ttl_ms = opts.ttl and math.floor(opts.ttl * 1000 + 0.5) or nil,
  }, mt)
end

local function thread_key(self, thread_id)
  return self.prefix .. ":{" .. enc(thread_id) .. "}"
end

local function ns_key(self, thread_id, ns)
  return thread_key(self, thread_id) .. ":" .. enc(ns)
end

-- Run a MULTI/EXEC pipeline; true | nil, err
local function transact(self, cmds)
  local list = { { "MULTI" } }
  for i = 1, #cmds do list[#list + 1] = cmds[i] end
  list[#list + 1] = { "EXEC" }
  local res, err = self.client:pipeline(list)
  if not res then return nil, err end
  for i = 1, #res - 1 do
    local r = res[i]
    if type(r) == "table" and r[1] == false then return nil, "redis: " .. r[2] end
  end
  local exec = res[#res]
  if type(exec) ~= "table" then return nil, "redis: transaction aborted" end
  for i = 1, #exec do
    local r = exec[i]
    if type(r) == "table" and r[1] == false then return nil, "redis: " .. r[2] end
  end
  return true
end

-- The commands of a batch: each key's PEXPIRE and each namespace's SADD
-- once, after the writes; checks: per namespace, the ids key, the id its
-- latest checkpoint must have ("" none) and the batch's last checkpoint.
local function batch_new()
  return { cmds = {}, expire = {}, expire_list = {}, ns = {}, checks = {}, check_of = {} }
end

-- Checks each namespace's latest checkpoint, then runs the commands: all
-- in one script, so nothing comes between (optimistic concurrency).
-- ARGV: n, then n times (ids key, expected id or "", new id), then the
-- commands as (argc, name, args...). A namespace without ids (never
-- written, expired, deleted) has nothing to conflict with.
local SAVE_SCRIPT = [[
local i, n = 2, tonumber(ARGV[1])
for _ = 1, n do
  local ids, want, new = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = i + 3
  local last = redis.call('ZRANGE', ids, -1, -1)[1]
  if last and last ~= want and last ~= new then
    return { 'conflict', ids, last }
  end
end
while i <= #ARGV do
  local argc = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + argc))
  i = i + argc + 1
end
return 1
]]

local function touch(self, b, key)
  if self.ttl_ms and not b.expire[key] then
    b.expire[key] = true
    b.expire_list[#b.expire_list + 1] = key
  end
end

local function add_ns(self, b, thread_id, ns)
  local tkey = thread_key(self, thread_id) .. ":ns"
  local k = tkey .. "\0" .. ns
  if not b.ns[k] then
    b.ns[k] = true
    b.cmds[#b.cmds + 1] = { "SADD", tkey, ns }
  end
  touch(self, b, tkey)
end

local function add_put(self, b, cfg, checkpoint, metadata)
  local cp, md = common.encode_checkpoint(checkpoint, metadata)
  if not cp then return nil, md end   -- md is the error
  local ns = cfg.checkpoint_ns or ""
  local base = ns_key(self, cfg.thread_id, ns)
  local ids, key = base .. ":ids", base .. ":cp:" .. checkpoint.id
  local cmds = b.cmds
  cmds[#cmds + 1] = { "HSET", key, "cp", cp, "md", md, "parent", cfg.checkpoint_id or "" }
  cmds[#cmds + 1] = { "ZADD", ids, 0, checkpoint.id }
  if not self.cache_only then
    local c = b.check_of[ids]
    if not c then
      c = { ids, common.expected(cfg) or "", ns = ns }
      b.check_of[ids] = c
      b.checks[#b.checks + 1] = c
    end
    c[3] = checkpoint.id
  end
  touch(self, b, key)
  touch(self, b, ids)
  add_ns(self, b, cfg.thread_id, ns)
  return true
end

local function add_writes(self, b, cfg, task_id, writes)
  -- (raises on a write that is not a {channel, value} pair)
  local enc_writes, err = common.encode_writes(task_id, writes)
  if not enc_writes then return nil, err end
  local ns = cfg.checkpoint_ns or ""
  local key = ns_key(self, cfg.thread_id, ns) .. ":w:" .. cfg.checkpoint_id
  b.cmds[#b.cmds + 1] = { "HSET", key, task_id, enc_writes }
  touch(self, b, key)
  add_ns(self, b, cfg.thread_id, ns)
  return true
end

local function send(self, b, thread_id)
  local cmds = b.cmds
  for _, key in ipairs(b.expire_list) do cmds[#cmds + 1] = { "PEXPIRE", key, self.ttl_ms } end
  if not b.checks[1] then return transact(self, cmds) end
  -- (the first ids key as the script's key: a cluster routes by its hash tag)
  local args = { "EVAL", SAVE_SCRIPT, 1, b.checks[1][1], #b.checks }
  for _, c in ipairs(b.checks) do
    args[#args + 1], args[#args + 2], args[#args + 3] = c[1], c[2], c[3]
  end
  for _, cmd in ipairs(cmds) do
    args[#args + 1] = #cmd
    for j = 1, #cmd do args[#args + 1] = cmd[j] end
  end
  local r, err = self.client:call(table.unpack(args))
  if r == nil then return nil, err end
  if type(r) == "table" and r[1] == "conflict" then
    local c = b.check_of[r[2]]
    return nil, common.conflict_error(thread_id, c.ns, c[2] ~= "" and c[2] or nil, r[3])
  end
  return true
end

function saver:put(cfg, checkpoint, metadata)
  common.check_put(cfg, checkpoint)
  local b = batch_new()
  local ok, err = add_put(self, b, cfg, checkpoint, metadata)
  if not ok then return nil, err end
  ok, err = send(self, b, cfg.thread_id)
  if not ok then return nil, err end
  return { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "", checkpoint_id = checkpoint.id }
end

function saver:put_writes(cfg, task_id, writes)
  common.check_put_writes(cfg, task_id)
  if type(writes) ~= "table" then
    error("bad argument #3 to 'put_writes': list of {channel, value} expected, got " .. type(writes), 2)
  end
  local b = batch_new()
  local ok, err = add_writes(self, b, cfg, task_id, writes)
  if not ok then return nil, err end
  return send(self, b)
end

--[[ put_batch(list) -> true | nil, err: the writes of list ({op =, a =,
b =, c =}, as the engine's writer makes them) in one MULTI/EXEC. ]]
function saver:put_batch(list)
  if type(list) ~= "table" then
    error("bad argument #1 to 'put_batch': list of writes expected, got " .. type(list), 2)
  end
  local b = batch_new()
  for i, o in ipairs(list) do
    local ok, err
    if o.op == "put" then
      common.check_put(o.a, o.b)
      ok, err = add_put(self, b, o.a, o.b, o.c)
    elseif o.op == "put_writes" then
      common.check_put_writes(o.a, o.b)
      if type(o.c) ~= "table" then
        error("bad argument #1 to 'put_batch': write " .. i .. " has no list of {channel, value}", 2)
      end
      ok, err = add_writes(self, b, o.a, o.b, o.c)
    else
      error("bad argument #1 to 'put_batch': write " .. i .. " has an unknown op '" .. tostring(o.op) .. "'", 2)
    end
    if not ok then return nil, err end
  end
  if not b.cmds[1] then return true end
  return send(self, b, list[1].a.thread_id)
end

local function pairs_of(flat)
  local t = {}
  if type(flat) ~= "table" then return t end
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- HGETALL replies of a checkpoint and its writes -> tuple | nil, err
local function tuple(cfg, ns, id, cp_flat, w_flat)
  local h = pairs_of(cp_flat)
  if not h.cp then return nil end
  local checkpoint, err = json.decode(h.cp)
  if checkpoint == nil then
    return nil, format("checkpoint %s of thread %s is corrupt: %s", id, cfg.thread_id, err)
  end
  local metadata = json.decode(h.md or "{}") or {}
  local writes = pairs_of(w_flat)
  local tasks = {}
  for task_id in pairs(writes) do tasks[#tasks + 1] = task_id end
  sort(tasks)
  local pending = {}
  for _, task_id in ipairs(tasks) do
    local list, werr = json.decode(writes[task_id])
    if list == nil then
      return nil, format("writes of task %s in checkpoint %s are corrupt: %s", task_id, id, werr)
    end
    for _, pair in ipairs(list) do
      pending[#pending + 1] = { task_id, pair[1], pair[2] }
    end
  end
  local parent = h.parent ~= nil and h.parent ~= "" and h.parent or nil
  return {
    config = { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = id },
    checkpoint = checkpoint,
    metadata = metadata,
    parent_config = parent and { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = parent } or nil,
    pending_writes = pending,
  }
end

-- Fetch the tuples of `ids` (in that order), skipping expired ones.
local function fetch(self, cfg, ns, ids)
  if #ids == 0 then return {} end
  local base = ns_key(self, cfg.thread_id, ns)
  local cmds = {}
  for _, id in ipairs(ids) do
    cmds[#cmds + 1] = { "HGETALL", base .. ":cp:" .. id }
    cmds[#cmds + 1] = { "HGETALL", base .. ":w:" .. id }
  end
  local res, err = self.client:pipeline(cmds)
  if not res then return nil, err end
  local out = {}
  for i, id in ipairs(ids) do
    local a, b = res[2 * i - 1], res[2 * i]
    if type(a) == "table" and a[1] == false then return nil, errors.wrap(a[2], nil, "redis: " .. a[2]) end
    if type(b) == "table" and b[1] == false then return nil, errors.wrap(b[2], nil, "redis: " .. b[2]) end
    local t, terr = tuple(cfg, ns, id, a, b)
    if terr then return nil, terr end
    if t then out[#out + 1] = t end
  end
  return out
end

function saver:get(cfg)
  common.check_cfg(cfg, "get")
  local ns = cfg.checkpoint_ns or ""
  local id = cfg.checkpoint_id
  if not id then
    local last, err = self.client:call("ZRANGE", ns_key(self, cfg.thread_id, ns) .. ":ids", -1, -1)
    if not last then return nil, err end
    id = last[1]
    if not id then return nil end
  end
  local list, err = fetch(self, cfg, ns, { id })
  if not list then return nil, err end
  return list[1]
end

function saver:list(cfg, opts)
  common.check_cfg(cfg, "list")
  local limit, before = common.list_opts(opts)
  local ns = cfg.checkpoint_ns or ""
  local args = { "ZREVRANGEBYLEX", ns_key(self, cfg.thread_id, ns) .. ":ids",
    before and ("(" .. before) or "+", "-" }
  if limit then
    args[#args + 1] = "LIMIT"
    args[#args + 1] = 0
    args[#args + 1] = math.floor(limit)
  end
  local ids, err = self.client:call(table.unpack(args))
  if not ids then return nil, err end
  return fetch(self, cfg, ns, ids)
end

function saver:delete_thread(thread_id)
  if thread_id == nil then
    error("bad argument #1 to 'delete_thread': thread id expected", 2)
  end
  thread_id = tostring(thread_id)
  local tkey = thread_key(self, thread_id) .. ":ns"
  local namespaces, err = self.client:call("SMEMBERS", tkey)
  if not namespaces then return nil, err end
  local keys = { tkey }
  for _, ns in ipairs(namespaces) do
    local base = ns_key(self, thread_id, ns)
    local ids
    ids, err = self.client:call("ZRANGE", base .. ":ids", 0, -1)
    if not ids then return nil, err end
    keys[#keys + 1] = base .. ":ids"
    for _, id in ipairs(ids) do
      keys[#keys + 1] = base .. ":cp:" .. id
      keys[#keys + 1] = base .. ":w:" .. id
    end
  end
  -- in batches, so one command never carries an unbounded argument list
  for i = 1, #keys, 500 do
    local batch = { "UNLINK" }
    for j = i, math.min(i + 499, #keys) do batch[#batch + 1] = keys[j] end
    local ok
    ok, err = self.client:call(table.unpack(batch))
    if not ok then return nil, err end
  end
  return true
end

_M.saver = saver
return _M
