--[[
moongraph.checkpoint.postgres — the durable checkpoint saver on PostgreSQL.

  mg.checkpoint.postgres("postgresql://user@host/db", { pool_size = 4 })
  mg.checkpoint.postgres(db_or_pool)      -- a moongraph.pg connection or pool

Tables (created by versioned migrations, see `migrations` below):

  moongraph_schema              the migrations applied (scope "checkpoint";
                                moongraph.migrations)
  moongraph_checkpoints         one row per checkpoint: the checkpoint without
                                its state values, metadata, parent, and
                                channel_versions (state key -> blob version)
  moongraph_checkpoint_blobs    one row per (thread, namespace, state key,
                                version): the value as JSON
  moongraph_checkpoint_writes   pending writes, one row per task
  moongraph_checkpoint_heads    the latest checkpoint of each thread and
                                namespace: a put must extend it (optimistic
                                concurrency, see checkpoint/common.lua)

A state value is written only when it changed: the saver remembers the
value and the JSON of every key it last wrote or read for a thread (and
namespace), and an unchanged key points at the blob version already stored,
so a large value that stays the same is stored once however many steps
follow. A value is encoded and its JSON compared; a batch entry marked
`owned` (the async writer's copies, which nobody changes) skips that for a
key that holds the very same table as last time. A blob's
version is the id of the checkpoint that first held the value. A checkpoint and its new blobs go in
one statement, so they are saved together or not at all.

Migrations run once per saver, on first use, inside one transaction holding
a PostgreSQL advisory lock: any number of workers may start at once against
an empty database and exactly one of them creates the schema.

Implements the saver interface of docs/checkpoints.md: put, put_writes, get,
list, delete_thread; runtime failures return nil, err. Also put_batch, head
and delete_thread_in (the delete inside a caller's transaction).
]]

local type, error, tostring, setmetatable, ipairs, pairs, next, rawequal =
  type, error, tostring, setmetatable, ipairs, pairs, next, rawequal
local format = string.format
local sort, concat, remove = table.sort, table.concat, table.remove

local schema = require "moongraph.migrations"
local errors = require "moongraph.errors"
local json = require "moongraph.json"
local common = require "moongraph.checkpoint.common"
local SQLNULL = require("moongraph.pg").null

local _M = {}
local saver = {}
local mt = { __index = saver, __name = "moongraph.checkpoint.postgres" }

-- the scope of this saver's migrations in moongraph.migrations
_M.SCOPE = "checkpoint"

-- The SQLSTATE moongraph_checkpoint_conflict raises (class MG: ours).
local CONFLICT_STATE = "MGC01"

_M.migrations = {
  {
    version = 1,
    name = "checkpoints, channel blobs and pending writes",
    sql = [[
      CREATE TABLE moongraph_checkpoints (
        thread_id        text COLLATE "C" NOT NULL,
        checkpoint_ns    text COLLATE "C" NOT NULL,
        checkpoint_id    text COLLATE "C" NOT NULL,
        parent_id        text COLLATE "C",
        checkpoint       json NOT NULL,
        channel_versions json NOT NULL,
        metadata         json NOT NULL,
        created_at       timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
      );
      CREATE TABLE moongraph_checkpoint_blobs (
        thread_id     text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL,
        channel       text COLLATE "C" NOT NULL,
        version       text COLLATE "C" NOT NULL,
        value         json NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
      );
      CREATE TABLE moongraph_checkpoint_writes (
        thread_id     text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL,
        checkpoint_id text COLLATE "C" NOT NULL,
        task_id       text COLLATE "C" NOT NULL,
        writes        json NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id)
      );
    ]],
  },
  {
    version = 2,
    name = "index checkpoints by creation time",
    sql = [[CREATE INDEX moongraph_checkpoints_created ON moongraph_checkpoints (created_at);]],
  },
  {
    version = 3,
    name = "the latest checkpoint of each namespace, for optimistic concurrency",
    sql = [[
      CREATE TABLE moongraph_checkpoint_heads (
        thread_id     text COLLATE "C" NOT NULL,
        checkpoint_ns text COLLATE "C" NOT NULL,
        checkpoint_id text COLLATE "C" NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns)
      );
      INSERT INTO moongraph_checkpoint_heads (thread_id, checkpoint_ns, checkpoint_id)
        SELECT DISTINCT ON (thread_id, checkpoint_ns) thread_id, checkpoint_ns, checkpoint_id
        FROM moongraph_checkpoints ORDER BY thread_id, checkpoint_ns, checkpoint_id DESC;
      CREATE FUNCTION moongraph_checkpoint_conflict(detail text) RETURNS integer
        LANGUAGE plpgsql AS $f$
        BEGIN
          RAISE EXCEPTION 'moongraph checkpoint conflict: %', detail USING ERRCODE = '40001';
        END $f$;
    ]],
  },
  {
    version = 4,
    name = "a checkpoint conflict has its own SQLSTATE",
    sql = [[
      CREATE OR REPLACE FUNCTION moongraph_checkpoint_conflict(detail text) RETURNS integer
        LANGUAGE plpgsql AS $f$
        BEGIN
          RAISE EXCEPTION 'moongraph checkpoint conflict: %', detail USING ERRCODE = ']] .. CONFLICT_STATE .. [[';
        END $f$;
    ]],
  },
}

--[[ migrate(db [, migrations]) -> number applied | nil, err
Applies the migrations `db` (a moongraph.pg connection or pool) does not
have yet: the scope "checkpoint" of moongraph.migrations. ]]
function _M.migrate(db, migrations)
  local applied, err = schema.migrate(db, { { scope = _M.SCOPE, list = migrations or _M.migrations } })
  if not applied then return nil, err end
  return #applied
end

function _M.new(target, opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #2 to 'postgres': options table expected, got " .. type(opts), 2)
  end
  opts = opts or {}
  for k, v in pairs(opts) do
    if k ~= "pool_size" and k ~= "cache_threads" then
      error("bad argument #2 to 'postgres': unknown option '" .. tostring(k) .. "'", 2)
    end
    if math.type(v) ~= "integer" or v < 1 then
      error("bad argument #2 to 'postgres': " .. k .. " must be a positive integer", 2)
    end
  end
  local db
  if type(target) == "string" then
    db = require("moongraph.pg").pool(target, { size = opts.pool_size or 4 })
  elseif type(target) == "table" and type(target.query) == "function"
      and type(target.transaction) == "function" then
    db = target
  else
    error("bad argument #1 to 'postgres': PostgreSQL URL, connection or pool expected, got " .. type(target), 2)
  end
  return setmetatable({
    db = db,
    ready = false,
    cache = {},          -- thread\0ns -> { channel -> { text =, version = } }
    cache_order = {},
    cache_threads = opts.cache_threads or 64,
    -- the engine may keep this many writes in flight
    concurrent_writes = opts.pool_size or 4,
  }, mt)
end

-- Run the migrations once; callers arriving meanwhile wait for that run
-- (and try again themselves if it failed or was cancelled).
local function ready(self)
  while not self.ready do
    local q = self.migrating
    if not q then break end
    q:get()                                   -- returns when the queue closes
  end
  if self.ready then return true end
  local q = require("moongraph").queue()
  self.migrating = q
  local guard <close> = setmetatable({}, { __close = function()
    self.migrating = nil
    q:close()
  end })
  local n, err = _M.migrate(self.db)
  if not n then return nil, "checkpoint schema: " .. tostring(err) end
  self.ready = true
  return true
end

---------------------------------------------------------------- the value cache

local function cache_key(thread_id, ns) return thread_id .. "\0" .. ns end

local function cache_get(self, key)
  return self.cache[key]
end

local function cache_set(self, key, t)
  if not self.cache[key] then
    local order = self.cache_order
    order[#order + 1] = key
    if #order > self.cache_threads then
      self.cache[remove(order, 1)] = nil
    end
  end
  self.cache[key] = t
end

local function cache_drop(self, key)
  if self.cache[key] == nil then return end
  self.cache[key] = nil
  local order = self.cache_order
  for i = #order, 1, -1 do
    if order[i] == key then remove(order, i) break end
  end
end

local function cache_drop_thread(self, thread_id)
  local prefix = thread_id .. "\0"
  local order = self.cache_order
  for i = #order, 1, -1 do
    if order[i]:sub(1, #prefix) == prefix then
      self.cache[order[i]] = nil
      remove(order, i)
    end
  end
end

---------------------------------------------------------------- saving

-- One statement saves any number of checkpoints (with their new blobs) and
-- pending writes of one thread: one round trip, one transaction. $5 moves
-- the head of each namespace with a checkpoint in the batch, from the id the
-- batch extends (e; null: none yet) or from the new head itself (a retry)
-- to the new head (x); a namespace that has moved on meanwhile fails the
-- whole statement (row locks make two writers of one head take turns, and
-- the second then sees the first one's head), as does one deleted meanwhile
-- (no head, and e not null: the blobs the batch leaves out as stored may
-- have gone with it). A blob goes as [value], so that a JSON null stays a
-- value.
local SAVE_SQL = [[
WITH x AS (
  SELECT * FROM json_to_recordset($5::json) AS x(n text, e text, x text)
), u AS (
  UPDATE moongraph_checkpoint_heads h SET checkpoint_id = x.x FROM x
  WHERE x.e IS NOT NULL AND h.thread_id = $1 AND h.checkpoint_ns = x.n AND h.checkpoint_id IN (x.e, x.x)
  RETURNING h.checkpoint_ns
), i AS (
  INSERT INTO moongraph_checkpoint_heads AS h (thread_id, checkpoint_ns, checkpoint_id)
  SELECT $1, x.n, x.x FROM x
  WHERE x.e IS NULL
  ON CONFLICT (thread_id, checkpoint_ns) DO UPDATE SET checkpoint_id = EXCLUDED.checkpoint_id
    WHERE h.checkpoint_id = EXCLUDED.checkpoint_id
  RETURNING h.checkpoint_ns
), ok AS (
  SELECT (SELECT count(*) FROM u) + (SELECT count(*) FROM i) = (SELECT count(*) FROM x) AS ok
), b AS (
  INSERT INTO moongraph_checkpoint_blobs (thread_id, checkpoint_ns, channel, version, value)
  SELECT $1, x.n, x.c, x.v, x.b -> 0 FROM json_to_recordset($2::json) AS x(n text, c text, v text, b json)
  WHERE (SELECT ok FROM ok)
  ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET value = EXCLUDED.value
), c AS (
  INSERT INTO moongraph_checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_id, checkpoint, channel_versions, metadata)
  SELECT $1, x.n, x.i, x.p, x.cp, x.cv, x.md
  FROM json_to_recordset($3::json) AS x(n text, i text, p text, cp json, cv json, md json)
  WHERE (SELECT ok FROM ok)
  ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = EXCLUDED.parent_id, checkpoint = EXCLUDED.checkpoint,
    channel_versions = EXCLUDED.channel_versions, metadata = EXCLUDED.metadata
), w AS (
  INSERT INTO moongraph_checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, writes)
  SELECT $1, x.n, x.i, x.t, x.w FROM json_to_recordset($4::json) AS x(n text, i text, t text, w json)
  WHERE (SELECT ok FROM ok)
  ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id) DO UPDATE SET writes = EXCLUDED.writes
)
SELECT CASE WHEN (SELECT ok FROM ok) THEN 1
  ELSE moongraph_checkpoint_conflict($6) END AS ok]]

-- A batch of pending writes only: no head to move, a smaller statement.
local WRITES_SQL = [[
INSERT INTO moongraph_checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, writes)
SELECT $1, x.n, x.i, x.t, x.w FROM json_to_recordset($2::json) AS x(n text, i text, t text, w json)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id) DO UPDATE SET writes = EXCLUDED.writes]]

-- A list of rows keyed for dedup: a later row of the same key replaces the
-- earlier one (one statement may not touch a row twice).
local function rows_new() return { list = {}, at = {} } end
local function rows_add(r, key, text)
  local i = r.at[key]
  if i then r.list[i] = text return end
  i = #r.list + 1
  r.list[i] = text
  r.at[key] = i
end
local function rows_json(r) return "[" .. concat(r.list, ",") .. "]" end

local function jstr(s) return json.encode(s) end

-- Channel names as JSON strings: a graph has few, written at every step.
local names_json, names_n = {}, 0
local function name_json(name)
  local j = names_json[name]
  if j then return j end
  if names_n >= 4096 then names_json, names_n = {}, 0 end
  j = jstr(name)
  names_json[name], names_n = j, names_n + 1
  return j
end

-- Add checkpoint `cp` (parent cfg.checkpoint_id) to the batch; returns the
-- value-cache entries to mark stored once the batch is in | nil, err.
-- owned: its values are copies nobody changes, so a value that is the very
-- table the cache holds is unchanged. Another caller's tables may have been
-- changed in place since (a node that appends to a list it read and
-- returns it): each is encoded.
local function add_put(self, b, cfg, checkpoint, metadata, owned)
  local ns = cfg.checkpoint_ns or ""
  local id = checkpoint.id
  local body = {}
  for k, v in pairs(checkpoint) do
    if k ~= "values" then body[k] = v end
  end
  local values = checkpoint.values or {}
  local key = cache_key(cfg.thread_id, ns)
  -- (a namespace the put starts: whatever the cache held of a thread by
  -- that id may have been deleted since, by another process)
  local known = b.known[key] or (common.expected(cfg) and cache_get(self, key)) or {}
  local now, versions = {}, {}
  local nsj = jstr(ns)
  for channel, value in pairs(values) do
    if type(channel) ~= "string" then
      return nil, "checkpoint.values has a non-string key " .. tostring(channel)
    end
    local k = known[channel]
    local text
    if owned and k and rawequal(k.value, value) then
      text = k.text
    else
      local eerr
      text, eerr = json.encode(value, { name = "checkpoint.values." .. channel })
      if not text then return nil, eerr end
      if k and k.text == text then
        k = { text = text, version = k.version, stored = k.stored, value = value }
      else
        k = { text = text, version = id, value = value }
      end
    end
    now[channel] = k
    versions[channel] = k.version
    -- A value is left out only when a finished put stored it. One still in
    -- flight (async durability keeps several) may yet fail, so it is sent
    -- again under the same version: the same row, the same content.
    -- (once per batch: the checkpoints of a batch share unchanged values)
    if not k.stored and k.queued ~= b then
      k.queued = b
      rows_add(b.blobs, ns .. "\0" .. channel .. "\0" .. k.version,
        '{"n":' .. nsj .. ',"c":' .. name_json(channel) .. ',"v":' .. jstr(k.version) .. ',"b":[' .. text .. "]}")
    end
  end
  local bodyj, mdj, err
  bodyj, err = json.encode(body, { name = "checkpoint" })
  if not bodyj then return nil, err end
  mdj, err = json.encode(metadata or {}, { name = "metadata" })
  if not mdj then return nil, err end
  local verj = next(versions) and json.encode(versions) or "{}"
  b.known[key] = now
  local h = b.heads[ns]
  if not h then
    h = { e = common.expected(cfg) }
    b.heads[ns] = h
    b.head_order[#b.head_order + 1] = ns
  end
  h.x = id
  rows_add(b.cps, ns .. "\0" .. id, '{"n":' .. nsj .. ',"i":' .. jstr(id) .. ',"p":' ..
    (cfg.checkpoint_id and jstr(cfg.checkpoint_id) or "null") ..
    ',"cp":' .. bodyj .. ',"cv":' .. verj .. ',"md":' .. mdj .. "}")
  b.marks[#b.marks + 1] = now
  return true
end

local function add_writes(b, cfg, task_id, writes)
  -- (raises on a write that is not a {channel, value} pair)
  local text, err = common.encode_writes(task_id, writes)
  if not text then return nil, err end
  local ns = cfg.checkpoint_ns or ""
  rows_add(b.writes, ns .. "\0" .. cfg.checkpoint_id .. "\0" .. task_id,
    '{"n":' .. jstr(ns) .. ',"i":' .. jstr(cfg.checkpoint_id) .. ',"t":' .. jstr(task_id) ..
    ',"w":' .. text .. "}")
  return true
end

local function new_batch()
  return { blobs = rows_new(), cps = rows_new(), writes = rows_new(), known = {}, marks = {},
    heads = {}, head_order = {} }
end

local function send(self, thread_id, b)
  if not b.cps.list[1] then
    local ok, err = self.db:query(WRITES_SQL, { thread_id, rows_json(b.writes) })
    if not ok then return nil, err end
    return true
  end
  local heads, detail = {}, nil
  for i, ns in ipairs(b.head_order) do
    local h = b.heads[ns]
    heads[i] = '{"n":' .. jstr(ns) .. ',"e":' .. (h.e and jstr(h.e) or "null") .. ',"x":' .. jstr(h.x) .. "}"
    detail = detail or { ns, h.e }
  end
  local ok, err = self.db:query(SAVE_SQL, {
    thread_id, rows_json(b.blobs), rows_json(b.cps), rows_json(b.writes),
    "[" .. concat(heads, ",") .. "]", thread_id,
  })
  if not ok then
    if errors.has(err, "pg:" .. CONFLICT_STATE) then
      -- what the namespace is at now, for the message
      local ns, e = detail[1], detail[2]
      local rows = self.db:query([[SELECT checkpoint_id FROM moongraph_checkpoint_heads
        WHERE thread_id = $1 AND checkpoint_ns = $2]], { thread_id, ns })
      local latest = rows and rows[1] and rows[1].checkpoint_id or nil
      -- the value cache may hold values of the failed batch
      cache_drop_thread(self, thread_id)
      return nil, common.conflict_error(thread_id, ns, e, latest)
    end
    return nil, err
  end
  for key, now in pairs(b.known) do cache_set(self, key, now) end
  for _, now in ipairs(b.marks) do
    for _, k in pairs(now) do k.stored = true end
  end
  return true
end

function saver:put(cfg, checkpoint, metadata)
  common.check_put(cfg, checkpoint)
  local ok, err = ready(self)
  if not ok then return nil, err end
  local b = new_batch()
  ok, err = add_put(self, b, cfg, checkpoint, metadata)
  if not ok then return nil, err end
  ok, err = send(self, cfg.thread_id, b)
  if not ok then return nil, err end
  return { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "", checkpoint_id = checkpoint.id }
end

function saver:put_writes(cfg, task_id, writes)
  common.check_put_writes(cfg, task_id)
  if type(writes) ~= "table" then
    error("bad argument #3 to 'put_writes': list of {channel, value} expected, got " .. type(writes), 2)
  end
  local ok, err = ready(self)
  if not ok then return nil, err end
  local b = new_batch()
  ok, err = add_writes(b, cfg, task_id, writes)
  if not ok then return nil, err end
  return send(self, cfg.thread_id, b)
end

--[[ put_batch(list) -> true | nil, err
list: { {op = "put", a = cfg, b = checkpoint, c = metadata [, owned = true]} |
        {op = "put_writes", a = cfg, b = task_id, c = writes}, ... }, all of
one thread, in order: saved together in one statement, or none of them.
owned: the checkpoint's values are copies nobody changes (the engine's
async writer). ]]
function saver:put_batch(list)
  if type(list) ~= "table" then
    error("bad argument #1 to 'put_batch': list of writes expected, got " .. type(list), 2)
  end
  local thread_id
  for i, o in ipairs(list) do
    if o.op == "put" then
      common.check_put(o.a, o.b)
    elseif o.op == "put_writes" then
      common.check_put_writes(o.a, o.b)
      if type(o.c) ~= "table" then
        error("bad argument #1 to 'put_batch': write " .. i .. " has no list of {channel, value}", 2)
      end
    else
      error("bad argument #1 to 'put_batch': write " .. i .. " has an unknown op '" .. tostring(o.op) .. "'", 2)
    end
    if thread_id == nil then thread_id = o.a.thread_id end
    if o.a.thread_id ~= thread_id then
      error("bad argument #1 to 'put_batch': all writes must be of one thread", 2)
    end
  end
  if thread_id == nil then return true end
  local ok, err = ready(self)
  if not ok then return nil, err end
  local b = new_batch()
  for _, o in ipairs(list) do
    if o.op == "put" then
      ok, err = add_put(self, b, o.a, o.b, o.c, o.owned == true)
    else
      ok, err = add_writes(b, o.a, o.b, o.c)
    end
    if not ok then return nil, err end
  end
  return send(self, thread_id, b)
end

---------------------------------------------------------------- reading

-- The pending writes of checkpoint row c, as [[task_id, writes], ...]
-- (SQL NULL: none): a column of the reads (pending_of decodes it).
local WRITES_OF_C = [[(SELECT json_agg(json_build_array(w.task_id, w.writes))::text
     FROM moongraph_checkpoint_writes w
    WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
      AND w.checkpoint_id = c.checkpoint_id) AS writes]]

local SELECT_SQL = [[
SELECT c.checkpoint_id, c.parent_id, c.checkpoint::text AS cp, c.channel_versions::text AS cv,
  c.metadata::text AS md, ]] .. WRITES_OF_C .. [[

FROM moongraph_checkpoints c
WHERE c.thread_id = $1 AND c.checkpoint_ns = $2 %s
ORDER BY c.checkpoint_id DESC
%s]]

local BLOBS_SQL = [[
SELECT b.channel, b.version, b.value::text AS value
FROM moongraph_checkpoint_blobs b
JOIN json_to_recordset($3::json) AS x(c text, v text) ON b.channel = x.c AND b.version = x.v
WHERE b.thread_id = $1 AND b.checkpoint_ns = $2]]

local function decode(text, what)
  local v, err = json.decode(text)
  if v == nil then return nil, what .. " is corrupt: " .. tostring(err) end
  return v
end

-- The pending writes of checkpoint `id` from the rows' JSON
-- ([[task_id, [[channel, value], ...]], ...] or SQL NULL), task by task in
-- task id order -> { {task_id, channel, value}, ... } | nil, err
local function pending_of(text, id)
  local pending = {}
  if text == SQLNULL then return pending end
  local groups, err = decode(text, "pending writes of checkpoint " .. id)
  if groups == nil then return nil, err end
  sort(groups, function(a, b) return a[1] < b[1] end)
  for _, g in ipairs(groups) do
    for _, pair in ipairs(g[2]) do pending[#pending + 1] = { g[1], pair[1], pair[2] } end
  end
  return pending
end

-- rows of SELECT_SQL -> list of tuples | nil, err. `seed` fills the value
-- cache with what the first (latest) row holds.
local function tuples(self, cfg, ns, rows, seed)
  local out, wanted, pairs_list = {}, {}, {}
  for _, r in ipairs(rows) do
    local cv, err = decode(r.cv, "channel versions of checkpoint " .. r.checkpoint_id)
    if cv == nil then return nil, err end
    r.versions = cv
    for ch, v in pairs(cv) do
      local k = ch .. "\0" .. v
      if not wanted[k] then
        wanted[k] = true
        pairs_list[#pairs_list + 1] = '{"c":' .. json.encode(ch) .. ',"v":' .. json.encode(v) .. "}"
      end
    end
  end
  local blobs = {}
  if #pairs_list > 0 then
    local brows, err = self.db:query(BLOBS_SQL, { cfg.thread_id, ns, "[" .. concat(pairs_list, ",") .. "]" })
    if not brows then return nil, err end
    for _, b in ipairs(brows) do blobs[b.channel .. "\0" .. b.version] = b.value end
  end
  for i, r in ipairs(rows) do
    local id = r.checkpoint_id
    local checkpoint, err = decode(r.cp, "checkpoint " .. id)
    if checkpoint == nil then return nil, err end
    local values, seeded = {}, {}
    for ch, v in pairs(r.versions) do
      local text = blobs[ch .. "\0" .. v]
      if not text then
        return nil, format("checkpoint %s of thread %s refers to a missing value of '%s' (version %s)",
          id, cfg.thread_id, ch, v)
      end
      local val
      val, err = decode(text, format("value of '%s' in checkpoint %s", ch, id))
      if val == nil then return nil, err end
      values[ch] = val
      seeded[ch] = { text = text, version = v, stored = true, value = val }
    end
    checkpoint.values = values
    if i == 1 and seed then cache_set(self, cache_key(cfg.thread_id, ns), seeded) end
    local metadata = decode(r.md, "metadata of checkpoint " .. id) or {}
    local pending
    pending, err = pending_of(r.writes, id)
    if not pending then return nil, err end
    local parent = r.parent_id ~= SQLNULL and r.parent_id or nil
    out[#out + 1] = {
      config = { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = id },
      checkpoint = checkpoint,
      metadata = metadata,
      parent_config = parent and { thread_id = cfg.thread_id, checkpoint_ns = ns, checkpoint_id = parent } or nil,
      pending_writes = pending,
    }
  end
  return out
end

function saver:get(cfg)
  common.check_cfg(cfg, "get")
  local ok, err = ready(self)
  if not ok then return nil, err end
  local ns = cfg.checkpoint_ns or ""
  local rows
  if cfg.checkpoint_id then
    rows, err = self.db:query(format(SELECT_SQL, "AND c.checkpoint_id = $3", ""),
      { cfg.thread_id, ns, cfg.checkpoint_id })
  else
    rows, err = self.db:query(format(SELECT_SQL, "", "LIMIT 1"), { cfg.thread_id, ns })
  end
  if not rows then return nil, err end
  if #rows == 0 then
    -- (none: what the cache holds of the thread was deleted)
    if not cfg.checkpoint_id then cache_drop(self, cache_key(cfg.thread_id, ns)) end
    return nil
  end
  local list
  list, err = tuples(self, cfg, ns, rows, cfg.checkpoint_id == nil)
  if not list then return nil, err end
  return list[1]
end

function saver:list(cfg, opts)
  common.check_cfg(cfg, "list")
  local limit, before = common.list_opts(opts)
  local ok, err = ready(self)
  if not ok then return nil, err end
  local ns = cfg.checkpoint_ns or ""
  local params = { cfg.thread_id, ns }
  local where, lim = "", ""
  if before then
    params[3] = before
    where = "AND c.checkpoint_id < $3"
  end
  if limit then
    params[#params + 1] = math.floor(limit)
    lim = "LIMIT $" .. #params
  end
  local rows
  rows, err = self.db:query(format(SELECT_SQL, where, lim), params)
  if not rows then return nil, err end
  return tuples(self, cfg, ns, rows, false)
end

--[[ head(cfg) -> { checkpoint_id =, pending_writes = (as get gives them) } | nil | nil, err
The latest (or the given) checkpoint's id and its pending writes, without
its state values: what the cached saver takes with its copy of the
checkpoint (a task's writes may change under a checkpoint: a resumed task's
replace its earlier ones). ]]
function saver:head(cfg)
  common.check_cfg(cfg, "head")
  local ok, err = ready(self)
  if not ok then return nil, err end
  local ns = cfg.checkpoint_ns or ""
  local params, where = { cfg.thread_id, ns }, ""
  if cfg.checkpoint_id then
    params[3] = cfg.checkpoint_id
    where = "AND c.checkpoint_id = $3"
  end
  local rows
  rows, err = self.db:query(format([[
    SELECT c.checkpoint_id, ]] .. WRITES_OF_C .. [[

    FROM moongraph_checkpoints c WHERE c.thread_id = $1 AND c.checkpoint_ns = $2 %s
    ORDER BY c.checkpoint_id DESC LIMIT 1]], where), params)
  if not rows then return nil, err end
  local r = rows[1]
  if not r then return nil end
  local pending
  pending, err = pending_of(r.writes, r.checkpoint_id)
  if not pending then return nil, err end
  return { checkpoint_id = r.checkpoint_id, pending_writes = pending }
end

local DELETE_SQL = [[
    WITH w AS (DELETE FROM moongraph_checkpoint_writes WHERE thread_id = $1),
         b AS (DELETE FROM moongraph_checkpoint_blobs WHERE thread_id = $1),
         h AS (DELETE FROM moongraph_checkpoint_heads WHERE thread_id = $1)
    DELETE FROM moongraph_checkpoints WHERE thread_id = $1]]

function saver:delete_thread(thread_id)
  if thread_id == nil then
    error("bad argument #1 to 'delete_thread': thread id expected", 2)
  end
  thread_id = tostring(thread_id)
  local ok, err = ready(self)
  if not ok then return nil, err end
  cache_drop_thread(self, thread_id)
  ok, err = self.db:query(DELETE_SQL, { thread_id })
  if not ok then return nil, err end
  return true
end

--[[ delete_thread_in(tx, thread_id) -> true | nil, err
delete_thread as one statement of the caller's transaction `tx` (a
moongraph.pg transaction on this saver's database): the thread goes when,
and only when, that transaction commits — e.g. with the row that makes its
checkpoints useless. ]]
function saver:delete_thread_in(tx, thread_id)
  if type(tx) ~= "table" or type(tx.query) ~= "function" then
    error("bad argument #1 to 'delete_thread_in': transaction expected, got " .. type(tx), 2)
  end
  if thread_id == nil then
    error("bad argument #2 to 'delete_thread_in': thread id expected", 2)
  end
  thread_id = tostring(thread_id)
  local ok, err = ready(self)
  if not ok then return nil, err end
  cache_drop_thread(self, thread_id)
  -- no result needed: it goes with the transaction's next statement
  ok, err = (tx.send or tx.query)(tx, DELETE_SQL, { thread_id })
  if not ok then return nil, err end
  return true
end

_M.saver = saver
return _M
