--[[
moongraph.store.memory — the Store in this process's memory (LangGraph's
InMemoryStore): for tests, single-process tools and caches. Nothing
persists past the process.

  local s = mg.store.memory{ index = {embed =, dims =, fields =}, ttl = {default_ttl =,
    refresh_on_read = true, sweep_interval_minutes = 5}, clock = fn }

Items are kept as private copies: a value is copied on put and again for
every caller that reads it, so nobody can change a stored item behind the
store's back. A batch runs with no yield between its reads and its writes
(only the embed function, called first, may yield), so it is atomic among
the tasks of the process: of two writers the later one wins.

TTLs are minutes, counted on `clock` (seconds; by default the wall clock).
Expired items are invisible at once and removed lazily: when touched, and
by a sweep of the whole store every `sweep_interval_minutes` (run by the
first operation after that time) or on s:sweep().
]]

local type, pairs, ipairs, tostring = type, pairs, ipairs, tostring
local sort, concat = table.sort, table.concat

local json = require "moongraph.json"
local base = require "moongraph.store.base"
local index_mod = require "moongraph.store.index"
local mono = require("moongraph.tasks").now

local null, is_array, array = json.null, json.is_array, json.array

local _M = {}
local store = {}
for k, v in pairs(base.methods) do store[k] = v end
local mt = { __index = store, __name = "moongraph.store.memory" }

-- seconds since the epoch, with sub-second steps from the monotonic clock
local wall0, mono0 = os.time(), mono()
local function wall() return wall0 + (mono() - mono0) end

local getmetatable, setmetatable = getmetatable, setmetatable

-- stored values hold only JSON data (base.copy_value made them): a table's
-- metatable, if any, is json.array's or json.null's own
local function copy(v)
  if type(v) ~= "table" or v == null then return v end
  local out = {}
  for k, x in pairs(v) do
    if type(x) == "table" and x ~= null then out[k] = copy(x) else out[k] = x end
  end
  local m = getmetatable(v)
  if m then setmetatable(out, m) end
  return out
end

local function copy_list(t)
  local out = {}
  for i = 1, #t do out[i] = t[i] end
  return out
end

---------------------------------------------------------------- filters

-- JSON equality: numbers by value (1 == 1.0), tables deep
local function equal(a, b)
  if type(a) ~= "table" or type(b) ~= "table" or a == null or b == null then return a == b end
  local la, lb = is_array(a) or #a > 0, is_array(b) or #b > 0
  if la ~= lb then return false end
  for k, x in pairs(a) do
    if not equal(x, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

local function compare(v, op, want)
  if op == "$eq" then
    if type(want) ~= "table" then return v == want end
    return v ~= nil and equal(v, want)
  end
  if op == "$ne" then return v == nil or not equal(v, want) end
  local tv = type(v)
  if tv ~= type(want) or (tv ~= "number" and tv ~= "string") then return false end
  if op == "$gt" then return v > want end
  if op == "$gte" then return v >= want end
  if op == "$lt" then return v < want end
  return v <= want
end

local function passes(value, filter)
  if not filter then return true end
  for _, c in ipairs(filter) do
    if not compare(value[c.field], c.op, c.value) then return false end
  end
  return true
end

---------------------------------------------------------------- internals

local function live(rec, now)
  return not rec.expires_at or rec.expires_at > now
end

local function remove(self, nskey, key)
  local ns = self.data[nskey]
  if ns and ns.items[key] then
    ns.items[key] = nil
    ns.count = ns.count - 1
    if ns.count == 0 then self.data[nskey] = nil end
    return true
  end
  return false
end

local function item(ns, key, rec, score)
  return { namespace = copy_list(ns), key = key, value = copy(rec.value),
    created_at = rec.created_at, updated_at = rec.updated_at, score = score }
end

local function refresh(rec, now)
  if rec.ttl then rec.expires_at = now + rec.ttl * 60 end
end

local function sweep(self, now)
  local n = 0
  for nskey, ns in pairs(self.data) do
    for key, rec in pairs(ns.items) do
      if not live(rec, now) then
        remove(self, nskey, key)
        n = n + 1
      end
    end
  end
  return n
end

local function prefix_match(ns, prefix)
  if #prefix > #ns then return false end
  for i = 1, #prefix do
    if ns[i] ~= prefix[i] then return false end
  end
  return true
end

-- search order: best score first (unscored last), then newest, then by
-- namespace and key
local function before(a, b, scores)
  if scores then
    local sa, sb = scores[a], scores[b]
    if sa ~= sb then
      if sa == nil then return false end
      if sb == nil then return true end
      return sa > sb
    end
  end
  if a.updated_at ~= b.updated_at then return a.updated_at > b.updated_at end
  if a.nskey ~= b.nskey then return a.nskey < b.nskey end
  return a.key < b.key
end

local function do_search(self, op, now, written)
  local index = self.index
  local qvec = index and op.qvec
  local scores = qvec and {} or nil
  local want = op.offset + op.limit
  -- the best `want` matches, kept in order (a page is usually small next
  -- to the matches: this beats sorting them all)
  local best, n = {}, 0
  local filter = op.filter
  for _, ns in pairs(self.data) do
    if prefix_match(ns.ns, op.prefix) then
      for _, rec in pairs(ns.items) do
        if live(rec, now) and passes(rec.value, filter) then
          if scores and rec.vectors then
            local score
            for _, v in ipairs(rec.vectors) do
              local d = index_mod.dot(v, qvec, index.dims)
              if not score or d > score then score = d end
            end
            scores[rec] = score
          end
          if want > 0 and (n < want or before(rec, best[n], scores)) then
            local pos = n < want and n + 1 or n
            while pos > 1 and before(rec, best[pos - 1], scores) do
              best[pos] = best[pos - 1]
              pos = pos - 1
            end
            best[pos] = rec
            if n < want then n = n + 1 end
          end
        end
      end
    end
  end
  local out = {}
  for i = op.offset + 1, n do
    local rec = best[i]
    if op.refresh and rec.ttl and not written[base.write_id(rec.nskey, rec.key)] then refresh(rec, now) end
    out[#out + 1] = item(rec.ns, rec.key, rec, scores and scores[rec])
  end
  return out
end

local function do_list(self, op, now)
  local seen, keys = {}, {}
  for _, ns in pairs(self.data) do
    local labels = ns.ns
    if base.matches(labels, op.prefix, op.suffix) then
      local any = false
      for _, rec in pairs(ns.items) do
        if live(rec, now) then any = true break end
      end
      if any then
        local cut = labels
        if op.max_depth and #labels > op.max_depth then
          cut = { table.unpack(labels, 1, op.max_depth) }
        end
        local k = concat(cut, "\0")
        if not seen[k] then
          seen[k] = cut
          keys[#keys + 1] = k
        end
      end
    end
  end
  sort(keys)
  local out = {}
  for i = op.offset + 1, math.min(#keys, op.offset + op.limit) do
    out[#out + 1] = copy(seen[keys[i]])
  end
  return out
end

local NONE = {}

-- The clock, after a sweep of expired items when one is due.
local function tick(self)
  local now = self.clock()
  if self.ttl_used and now >= self.next_sweep then
    sweep(self, now)
    self.next_sweep = now + self.ttl_config.sweep_interval_minutes * 60
  end
  return now
end

-- A get op's item, or nil; its TTL refreshed when asked and `may_refresh`.
local function read(self, op, now, may_refresh)
  local ns = self.data[op.nskey]
  local rec = ns and ns.items[op.key]
  if rec and not live(rec, now) then
    remove(self, op.nskey, op.key)
    return nil
  end
  if not rec then return nil end
  if may_refresh and op.refresh and rec.ttl then refresh(rec, now) end
  return item(ns.ns, op.key, rec)
end

-- One get, without a batch's lists (the common call, from nodes and the API).
function store:_get(op)
  return read(self, op, tick(self), true)
end

function store:_batch(ops)
  local any_write, searches = false, nil
  for _, op in ipairs(ops) do
    local kind = op.kind
    if kind == "put" or kind == "delete" then any_write = true
    elseif kind == "search" then
      searches = searches or {}
      searches[#searches + 1] = op
    end
  end
  local writes, written = NONE, NONE
  if any_write then writes, written = base.last_writes(ops) end
  -- embed first: the only step that may yield
  if self.index then
    local texts, attach = index_mod.plan(self.index, writes, searches or NONE)
    if #texts > 0 then
      local vecs, err = index_mod.embed(self.index, texts)
      if not vecs then return nil, err end
      attach(vecs)
    end
  end
  local now = tick(self)
  local results = { n = #ops }
  for i, op in ipairs(ops) do
    local kind = op.kind
    if kind == "get" then
      -- a key the batch writes keeps the TTL the write gives it
      results[i] = read(self, op, now, not (any_write and written[base.write_id(op.nskey, op.key)]))
    elseif kind == "search" then
      results[i] = do_search(self, op, now, written)
    elseif kind == "list" then
      results[i] = do_list(self, op, now)
    else
      results[i] = true
    end
  end
  for _, op in ipairs(writes) do
    if op.kind == "delete" then
      remove(self, op.nskey, op.key)
    else
      local ns = self.data[op.nskey]
      if not ns then
        ns = { ns = op.ns, items = {}, count = 0 }
        self.data[op.nskey] = ns
      end
      local old = ns.items[op.key]
      if old and not live(old, now) then old = nil end
      if not ns.items[op.key] then ns.count = ns.count + 1 end
      local vectors = op.vectors
      if vectors and #vectors == 0 then vectors = nil end
      ns.items[op.key] = {
        ns = ns.ns, nskey = op.nskey, key = op.key,
        value = op.value,                 -- the private copy the checks made
        created_at = old and old.created_at or now,
        updated_at = now,
        ttl = op.ttl,
        expires_at = op.ttl and now + op.ttl * 60 or nil,
        vectors = vectors,
      }
      if op.ttl then self.ttl_used = true end
    end
  end
  return results
end

-- An update holds the item's lock from its read to its write, so it may
-- yield between them (fn, an embed call) without losing another update.
function store:_update(get, fn, opts)
  local guard <close> = base.key_lock(self.locks, base.write_id(get.nskey, get.key))
  local res, err = self:_batch({ get })
  if not res then return nil, err end
  local put, v = base.update_write(self, get, fn, res[1], opts)
  if not put then return put, v end
  res, err = self:_batch({ put })
  if not res then return nil, err end
  return v
end

--[[ s:sweep() -> number of expired items removed ]]
function store:sweep()
  local now = self.clock()
  self.next_sweep = now + self.ttl_config.sweep_interval_minutes * 60
  return sweep(self, now)
end

function store:__tostring()
  local n = 0
  for _, ns in pairs(self.data) do n = n + ns.count end
  return "moongraph.store.memory (" .. n .. " items)"
end
mt.__tostring = store.__tostring

--[[ memory([opts]) -> store ]]
function _M.new(opts)
  if opts ~= nil and type(opts) ~= "table" then
    base.bad("memory", 1, "options table expected, got " .. type(opts), 3)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "index" and k ~= "ttl" and k ~= "clock" then
      base.bad("memory", 1, "unknown option '" .. tostring(k) .. "'", 3)
    end
  end
  if opts.clock ~= nil and type(opts.clock) ~= "function" then
    base.bad("memory", 1, "clock must be a function returning seconds", 3)
  end
  local s = base.new({ data = {}, locks = {}, clock = opts.clock or wall, next_sweep = -math.huge },
    mt, opts, "memory", 1, 3)
  s.ttl_used = s.ttl_config.default_ttl ~= nil
  return s
end

_M.store = store
_M.equal = equal
return _M
