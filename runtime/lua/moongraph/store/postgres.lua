--[[
moongraph.store.postgres — the Store on PostgreSQL (LangGraph's PostgresStore),
shared by every process that opens the same database.

  mg.store.postgres("postgresql://user@host/db", { pool_size = 4, index =, ttl = })
  mg.store.postgres(db_or_pool [, opts])      -- a moongraph.pg connection or pool

One table, created by versioned migrations (see `migrations`):

  moongraph_store   namespace text[], key, value jsonb, created_at, updated_at,
                    ttl_minutes, expires_at, embedding float8[]
                    (primary key (namespace, key), byte order: COLLATE "C")

A namespace is a text array, so any label (dots, slashes, quotes, any
UTF-8 but NUL) is stored as it is, and a prefix search is a range of the
primary key. An item's vectors live in its own row, written by the same
statement as its value: a reader never sees one writer's value with
another's vectors.

Every batch, whatever it holds, is ONE statement: its writes (deduplicated,
last wins), gets, searches, namespace listings, the TTL refresh of what it
read and, when due, a sweep of expired items are parts of a single WITH
query built with $n parameters only. One round trip, atomic; its reads see
the database as it was when the statement began (as LangGraph's batch:
reads before writes).

s:with(tx) is the store on a caller's transaction (moongraph.pg): its
statements are tx's, and its update holds the item's advisory lock until
tx ends.

A patch (s:patch) is one upsert computing the new value from the old in
SQL, after the item's advisory lock: no read, and on a transaction both
statements are sent ahead.

Migrations run once per store object, on first use, in one transaction
under the advisory lock of moongraph.migrations (scope "store"), so any
number of processes may start at once on an empty database.
]]

local type, error, tostring, pairs, ipairs, setmetatable =
  type, error, tostring, pairs, ipairs, setmetatable
local format, concat, sort = string.format, table.concat, table.sort

local schema = require "moongraph.migrations"
local json = require "moongraph.json"
local base = require "moongraph.store.base"
local index_mod = require "moongraph.store.index"
local SQLNULL = require("moongraph.pg").null

local _M = {}
local store = {}
for k, v in pairs(base.methods) do store[k] = v end
local mt = { __index = store, __name = "moongraph.store.postgres" }

-- the scope of the Store's migrations in moongraph.migrations
_M.SCOPE = "store"

_M.migrations = {
  {
    version = 1,
    name = "store items",
    sql = [[
      CREATE TABLE moongraph_store (
        namespace   text[] COLLATE "C" NOT NULL,
        key         text COLLATE "C" NOT NULL,
        value       jsonb NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        updated_at  timestamptz NOT NULL DEFAULT now(),
        ttl_minutes float8,
        expires_at  timestamptz,
        embedding   float8[],
        PRIMARY KEY (namespace, key)
      );
      CREATE INDEX moongraph_store_expires ON moongraph_store (expires_at)
        WHERE expires_at IS NOT NULL;
    ]],
  },
  {
    version = 2,
    name = "patch refusals",
    -- raised by a patch's statement (s:patch) where its value is not what
    -- an addition needs; `witness` gives the type the expression expects
    sql = [[
      CREATE FUNCTION moongraph_store_refused(what text, path text[], witness anyelement)
      RETURNS anyelement LANGUAGE plpgsql VOLATILE AS $$
      BEGIN
        RAISE EXCEPTION 'moongraph store patch: % %', array_to_string(path, '.'), what;
      END $$;
    ]],
  },
}

--[[ migrate(db [, migrations]) -> number applied | nil, err: the scope
"store" of moongraph.migrations ]]
function _M.migrate(db, migrations)
  local applied, err = schema.migrate(db, { { scope = _M.SCOPE, list = migrations or _M.migrations } })
  if not applied then return nil, err end
  return #applied
end

-- Run the migrations once; callers arriving meanwhile wait for that run.
local function ready(self)
  while not self.ready do
    local q = self.migrating
    if not q then break end
    q:get()
  end
  if self.ready then return true end
  local q = require("moongraph").queue()
  self.migrating = q
  local guard <close> = setmetatable({}, { __close = function()
    self.migrating = nil
    q:close()
  end })
  local n, err = _M.migrate(self.db)
  if not n then return nil, "store schema: " .. tostring(err) end
  self.ready = true
  return true
end

---------------------------------------------------------------- statement building

-- A statement under construction: SQL parts and their $n parameters.
local function stmt()
  local params = { n = 0 }
  return {
    params = params,
    p = function(v)
      params.n = params.n + 1
      params[params.n] = v
      return "$" .. params.n
    end,
  }
end

local function jstr(s) return json.encode(s) end

local function jlabels(labels)
  local parts = {}
  for i, l in ipairs(labels) do parts[i] = jstr(l) end
  return "[" .. concat(parts, ",") .. "]"
end

-- a float8[] literal of numbers (sent as a parameter, never spliced)
local function farray(list)
  local parts = {}
  for i, x in ipairs(list) do parts[i] = format("%.17g", x) end
  return "{" .. concat(parts, ",") .. "}"
end

local LIVE = "(s.expires_at IS NULL OR s.expires_at > now())"

-- a text[] literal of labels: each quoted, \ and " escaped (a parameter's
-- text, never spliced into SQL)
local function pg_array(labels)
  local parts = {}
  for i, l in ipairs(labels) do parts[i] = '"' .. l:gsub('[\\"]', "\\%0") .. '"' end
  return "{" .. concat(parts, ",") .. "}"
end
_M.pg_array = pg_array

-- An op's namespace as a text[] literal (.array) and as a JSON list
-- (.json), remembered per namespace (op.nskey; up to NS_SEEN of them): a
-- profile's namespace is written out a few times per turn.
local NS_SEEN = 4096
local ns_forms, ns_n = {}, 0
local function ns_form(op)
  local f = ns_forms[op.nskey]
  if not f then
    if ns_n >= NS_SEEN then ns_forms, ns_n = {}, 0 end
    f = { array = pg_array(op.ns), json = jlabels(op.ns) }
    ns_forms[op.nskey], ns_n = f, ns_n + 1
  end
  return f
end

local function ns_array(st, labels)
  return st.p(pg_array(labels)) .. "::text[]"
end

-- WHERE conditions of a search's namespace prefix: a range of the key
local function prefix_range(st, prefix)
  if #prefix == 0 then return "TRUE" end
  local upper = {}
  for i, l in ipairs(prefix) do upper[i] = l end
  upper[#upper] = upper[#upper] .. "\1"     -- the least text after every label == last
  return format('s.namespace >= %s COLLATE "C" AND s.namespace < %s COLLATE "C"',
    ns_array(st, prefix), ns_array(st, upper))
end

local function filter_sql(st, filter)
  if not filter then return "" end
  local out = {}
  for _, c in ipairs(filter) do
    local f = st.p(c.field)
    if c.op == "$eq" then
      out[#out + 1] = format("s.value -> %s = %s::jsonb", f, st.p(c.text))
    elseif c.op == "$ne" then
      out[#out + 1] = format("(s.value -> %s) IS DISTINCT FROM %s::jsonb", f, st.p(c.text))
    else
      local sqlop = ({ ["$gt"] = ">", ["$gte"] = ">=", ["$lt"] = "<", ["$lte"] = "<=" })[c.op]
      if type(c.value) == "number" then
        out[#out + 1] = format("jsonb_typeof(s.value -> %s) = 'number' AND (s.value -> %s) %s %s::jsonb",
          f, f, sqlop, st.p(c.text))
      else
        out[#out + 1] = format([[jsonb_typeof(s.value -> %s) = 'string' AND (s.value ->> %s) COLLATE "C" %s %s]],
          f, f, sqlop, st.p(c.value))
      end
    end
  end
  return " AND " .. concat(out, " AND ")
end

local ITEM_COLS = "s.namespace, s.key, s.value, s.created_at, s.updated_at, s.ttl_minutes"

-- The SELECT of one search (ordered, one page), and its order on the
-- page's columns (prefixed with `c.`)
local function search_select(st, i, op, dims)
  local score, from = "NULL::float8", "moongraph_store s"
  local order = "updated_at DESC, namespace, key"
  if op.qvec then
    local d = st.p(dims)
    score = format([[CASE WHEN cardinality(s.embedding) %% %s::int = 0 THEN
      (SELECT max(t.d) FROM (SELECT sum(u.e * q.v[((u.o - 1) %% %s::int) + 1]) AS d
        FROM unnest(s.embedding) WITH ORDINALITY AS u(e, o) GROUP BY (u.o - 1) / %s::int) t)
      END]], d, d, d)
    order = "score DESC NULLS LAST, " .. order
    from = format("moongraph_store s CROSS JOIN (SELECT %s::float8[] AS v) q", st.p(farray(op.qvec)))
  end
  local sql = format([[SELECT %d AS i, %s AS r, %s, %s AS score
      FROM %s
      WHERE %s AND %s%s
      ORDER BY %s LIMIT %s OFFSET %s]],
    i, op.refresh and "TRUE" or "FALSE", ITEM_COLS, score, from,
    LIVE, prefix_range(st, op.prefix), filter_sql(st, op.filter),
    order, st.p(op.limit), st.p(op.offset))
  local c_order = order:gsub("(%a[%w_]*)( ?)", function(w, sp)
    if w == "DESC" or w == "NULLS" or w == "LAST" then return w .. sp end
    return "c." .. w .. sp
  end)
  return sql, c_order
end

local function search_cte(st, i, op, dims)
  local sql, c_order = search_select(st, i, op, dims)
  -- rank the page only (a few rows) to give each its position
  return format("s%d AS (SELECT c.*, row_number() OVER (ORDER BY %s) AS pos FROM (%s) c)", i, c_order, sql)
end

local function list_cte(st, i, op)
  local conds = { LIVE }
  local np, ns = #op.prefix, #op.suffix
  if np > 0 or ns > 0 then
    conds[#conds + 1] = format("cardinality(s.namespace) >= %s::int", st.p(math.max(np, ns)))
  end
  for k, l in ipairs(op.prefix) do
    if l ~= "*" then conds[#conds + 1] = format("s.namespace[%d] = %s", k, st.p(l)) end
  end
  for k, l in ipairs(op.suffix) do
    if l ~= "*" then
      conds[#conds + 1] = format("s.namespace[cardinality(s.namespace) - %d] = %s", ns - k, st.p(l))
    end
  end
  local cut = "s.namespace"
  if op.max_depth then cut = format("s.namespace[1:%s::int]", st.p(op.max_depth)) end
  return format([[l%d AS (
    SELECT %d AS i, t.ns, row_number() OVER (ORDER BY t.ns) AS pos FROM (
      SELECT DISTINCT %s AS ns FROM moongraph_store s WHERE %s
      ORDER BY 1 LIMIT %s OFFSET %s) t)]],
    i, i, cut, concat(conds, " AND "), st.p(op.limit), st.p(op.offset))
end

-- the JSON rows of a batch's writes
local function writes_json(writes)
  local rows = {}
  for i, op in ipairs(writes) do
    if op.kind == "delete" then
      rows[i] = format('{"ns":%s,"k":%s,"del":true}', jlabels(op.ns), jstr(op.key))
    else
      local emb = "null"
      if op.vectors and #op.vectors > 0 then
        local flat = {}
        for _, v in ipairs(op.vectors) do
          for _, x in ipairs(v) do flat[#flat + 1] = format("%.17g", x) end
        end
        emb = "[" .. concat(flat, ",") .. "]"
      end
      rows[i] = format('{"ns":%s,"k":%s,"del":false,"v":%s,"ttl":%s,"e":%s}', jlabels(op.ns),
        jstr(op.key), json.encode(op.value), op.ttl and format("%.17g", op.ttl) or "null", emb)
    end
  end
  return "[" .. concat(rows, ",") .. "]"
end

--[[ build(self, ops, writes, sweep) -> sql, params
The one statement of a batch. ]]
local function build(self, ops, writes, sweep)
  local st = stmt()
  local ctes, selects = {}, {}
  local NOT_WRITTEN = ""
  if #writes > 0 then
    ctes[#ctes + 1] = format([[w AS (SELECT * FROM jsonb_to_recordset(%s::jsonb)
      AS x(ns text[], k text, del boolean, v jsonb, ttl float8, e float8[]))]], st.p(writes_json(writes)))
    ctes[#ctes + 1] = [[del AS (DELETE FROM moongraph_store s USING w
      WHERE w.del AND s.namespace = w.ns AND s.key = w.k)]]
    ctes[#ctes + 1] = [[ins AS (INSERT INTO moongraph_store AS s
        (namespace, key, value, created_at, updated_at, ttl_minutes, expires_at, embedding)
      SELECT w.ns, w.k, w.v, now(), now(), w.ttl, now() + w.ttl * interval '1 minute', w.e
      FROM w WHERE NOT w.del
      ON CONFLICT (namespace, key) DO UPDATE SET
        value = EXCLUDED.value, updated_at = EXCLUDED.updated_at,
        created_at = CASE WHEN s.expires_at <= now() THEN EXCLUDED.created_at ELSE s.created_at END,
        ttl_minutes = EXCLUDED.ttl_minutes, expires_at = EXCLUDED.expires_at,
        embedding = EXCLUDED.embedding)]]
    NOT_WRITTEN = " AND NOT EXISTS (SELECT 1 FROM w WHERE w.ns = s.namespace AND w.k = s.key)"
  end
  local gets, refreshed = {}, {}
  for i, op in ipairs(ops) do
    if op.kind == "get" then
      gets[#gets + 1] = format('{"i":%d,"ns":%s,"k":%s,"r":%s}', i, jlabels(op.ns), jstr(op.key),
        op.refresh and "true" or "false")
    end
  end
  if #gets > 0 then
    ctes[#ctes + 1] = format([[g AS (SELECT x.i, x.r, %s, NULL::float8 AS score, 0::bigint AS pos
      FROM jsonb_to_recordset(%s::jsonb) AS x(i int, ns text[], k text, r boolean)
      JOIN moongraph_store s ON s.namespace = x.ns AND s.key = x.k WHERE %s)]],
      ITEM_COLS, st.p("[" .. concat(gets, ",") .. "]"), LIVE)
    selects[#selects + 1] = "g"
    refreshed[#refreshed + 1] = "g"
  end
  local lists = {}
  for i, op in ipairs(ops) do
    if op.kind == "search" then
      ctes[#ctes + 1] = search_cte(st, i, op, self.index and self.index.dims)
      selects[#selects + 1] = "s" .. i
      refreshed[#refreshed + 1] = "s" .. i
    elseif op.kind == "list" then
      ctes[#ctes + 1] = list_cte(st, i, op)
      lists[#lists + 1] = "l" .. i
    end
  end
  if #refreshed > 0 and self.ttl_seen then
    local from = {}
    for k, name in ipairs(refreshed) do
      from[k] = format("SELECT namespace, key FROM %s WHERE r", name)
    end
    ctes[#ctes + 1] = format([[ref AS (UPDATE moongraph_store s
      SET expires_at = now() + s.ttl_minutes * interval '1 minute'
      FROM (%s) x WHERE s.namespace = x.namespace AND s.key = x.key
        AND s.ttl_minutes IS NOT NULL AND s.expires_at > now()%s)]], concat(from, " UNION "), NOT_WRITTEN)
  end
  if sweep then
    ctes[#ctes + 1] = format([[sw AS (DELETE FROM moongraph_store s
      WHERE s.ctid = ANY(ARRAY(SELECT ctid FROM moongraph_store
        WHERE expires_at <= now() LIMIT %s))
      AND s.expires_at <= now()%s RETURNING 1)]], st.p(sweep), NOT_WRITTEN)
  end
  local parts = {}
  for _, name in ipairs(selects) do
    parts[#parts + 1] = format([[SELECT i, to_json(namespace) AS ns, key, value::text AS value,
      extract(epoch FROM created_at)::float8 AS created_at,
      extract(epoch FROM updated_at)::float8 AS updated_at, score, pos, r, ttl_minutes FROM %s]], name)
  end
  for _, name in ipairs(lists) do
    parts[#parts + 1] = format([[SELECT i, to_json(ns) AS ns, NULL AS key, NULL AS value,
      NULL::float8 AS created_at, NULL::float8 AS updated_at, NULL::float8 AS score, pos,
      NULL::boolean AS r, NULL::float8 AS ttl_minutes FROM %s]], name)
  end
  if sweep then
    parts[#parts + 1] = [[SELECT 0 AS i, NULL::json AS ns, NULL AS key, NULL AS value,
      NULL::float8 AS created_at, NULL::float8 AS updated_at, count(*)::float8 AS score,
      0::bigint AS pos, NULL::boolean AS r, NULL::float8 AS ttl_minutes FROM sw]]
  end
  if #parts == 0 then parts[1] = "SELECT NULL::int AS i WHERE FALSE" end
  local sql = (#ctes > 0 and ("WITH " .. concat(ctes, ",\n") .. "\n") or "") .. concat(parts, "\nUNION ALL ")
  return sql, st.params
end

---------------------------------------------------------------- one-op statements

-- A batch of one get, put or delete is a plain statement on the primary
-- key: the same effect as the general form, less for the server to plan.
local GET_SQL = [[
SELECT s.value::text AS value, extract(epoch FROM s.created_at)::float8 AS created_at,
  extract(epoch FROM s.updated_at)::float8 AS updated_at, s.ttl_minutes
FROM moongraph_store s WHERE s.namespace = $1::text[] AND s.key = $2 AND ]] .. LIVE

local GET_REFRESH_SQL = [[
WITH ref AS (UPDATE moongraph_store s SET expires_at = now() + s.ttl_minutes * interval '1 minute'
  WHERE s.namespace = $1::text[] AND s.key = $2 AND s.ttl_minutes IS NOT NULL AND s.expires_at > now())
]] .. GET_SQL

local PUT_SQL = [[
INSERT INTO moongraph_store AS s
  (namespace, key, value, created_at, updated_at, ttl_minutes, expires_at, embedding)
VALUES ($1::text[], $2, $3::jsonb, now(), now(), $4::float8, now() + $4::float8 * interval '1 minute',
  $5::float8[])
ON CONFLICT (namespace, key) DO UPDATE SET
  value = EXCLUDED.value, updated_at = EXCLUDED.updated_at,
  created_at = CASE WHEN s.expires_at <= now() THEN EXCLUDED.created_at ELSE s.created_at END,
  ttl_minutes = EXCLUDED.ttl_minutes, expires_at = EXCLUDED.expires_at, embedding = EXCLUDED.embedding]]

-- the refresh of items read by a statement that did not refresh them
local REFRESH_SQL = [[
UPDATE moongraph_store s SET expires_at = now() + s.ttl_minutes * interval '1 minute'
FROM jsonb_to_recordset($1::jsonb) AS x(ns text[], k text)
WHERE s.namespace = x.ns AND s.key = x.k AND s.ttl_minutes IS NOT NULL AND s.expires_at > now()]]

-- Items with a TTL were read while the store did not know there were any:
-- from now on its statements refresh TTLs themselves; these it does now.
local function refresh_after(self, items)
  self.ttl_seen = true
  local rows = {}
  for i, it in ipairs(items) do
    rows[i] = format('{"ns":%s,"k":%s}', jlabels(it.namespace), jstr(it.key))
  end
  local ok, err = self.db:query(REFRESH_SQL, { "[" .. concat(rows, ",") .. "]" })
  if not ok then return nil, "store: " .. tostring(err) end
  return true
end

local DELETE_SQL = "DELETE FROM moongraph_store WHERE namespace = $1::text[] AND key = $2"

local OUT_COLS = [[to_json(c.namespace) AS ns, c.key, c.value::text AS value,
  extract(epoch FROM c.created_at)::float8 AS created_at,
  extract(epoch FROM c.updated_at)::float8 AS updated_at, c.score, c.ttl_minutes]]

-- one search alone: its SELECT, and the refresh of its page when TTLs are about
local function single_search(self, op)
  local st = stmt()
  local sql, c_order = search_select(st, 1, op, self.index and self.index.dims)
  local refreshing = op.refresh and self.ttl_seen
  if refreshing then
    sql = format([[WITH c AS (%s),
      ref AS (UPDATE moongraph_store s SET expires_at = now() + s.ttl_minutes * interval '1 minute'
        FROM c WHERE s.namespace = c.namespace AND s.key = c.key
          AND s.ttl_minutes IS NOT NULL AND s.expires_at > now())
      SELECT %s FROM c ORDER BY %s]], sql, OUT_COLS, c_order)
  else
    sql = format("SELECT %s FROM (%s) c ORDER BY %s", OUT_COLS, sql, c_order)
  end
  local rows, err = self.db:query(sql, st.params)
  if not rows then return nil, "store: " .. tostring(err) end
  local list, unrefreshed = {}, nil
  for k, r in ipairs(rows) do
    local value, derr = json.decode(r.value)
    if value == nil then return nil, "store: stored value is corrupt: " .. tostring(derr) end
    local it = { namespace = r.ns, key = r.key, value = value, created_at = r.created_at,
      updated_at = r.updated_at, score = r.score ~= SQLNULL and r.score or nil }
    list[k] = it
    if op.refresh and not refreshing and r.ttl_minutes ~= SQLNULL then
      unrefreshed = unrefreshed or {}
      unrefreshed[#unrefreshed + 1] = it
    end
  end
  if unrefreshed then
    local ok
    ok, err = refresh_after(self, unrefreshed)
    if not ok then return nil, err end
  end
  return { n = 1, list }
end

local function single(self, op)
  local kind = op.kind
  if kind == "search" then return single_search(self, op) end
  if kind == "get" then
    local refreshing = op.refresh and self.ttl_seen
    local rows, err = self.db:query(refreshing and GET_REFRESH_SQL or GET_SQL, { ns_form(op).array, op.key })
    if not rows then return nil, "store: " .. tostring(err) end
    local r = rows[1]
    if not r then return { n = 1 } end
    local value, derr = json.decode(r.value)
    if value == nil then return nil, "store: stored value is corrupt: " .. tostring(derr) end
    local it = { namespace = op.ns, key = op.key, value = value,
      created_at = r.created_at, updated_at = r.updated_at }
    if op.refresh and not refreshing and r.ttl_minutes ~= SQLNULL then
      local ok
      ok, err = refresh_after(self, { it })
      if not ok then return nil, err end
    end
    return { n = 1, it }
  end
  -- on a transaction a write needs no result: it goes with the transaction's
  -- next statement or its commit, which report its failure
  local db = self.db
  local write = db.send or db.query
  local ok, err
  if kind == "put" then
    local emb = SQLNULL
    if op.vectors and #op.vectors > 0 then
      local flat = {}
      for _, v in ipairs(op.vectors) do
        for _, x in ipairs(v) do flat[#flat + 1] = x end
      end
      emb = farray(flat)
    end
    if op.ttl then self.ttl_seen = true end
    ok, err = write(db, PUT_SQL, { ns_form(op).array, op.key, json.encode(op.value),
      op.ttl and op.ttl + 0.0 or SQLNULL, emb, n = 5 })
  else
    ok, err = write(db, DELETE_SQL, { ns_form(op).array, op.key })
  end
  if not ok then return nil, "store: " .. tostring(err) end
  return { n = 1, true }
end

---------------------------------------------------------------- the batch

local SWEEP_LIMIT = 10000

function store:_batch(ops)
  local ok, err = ready(self)
  if not ok then return nil, err end
  local writes = base.last_writes(ops)
  local searches = {}
  for _, op in ipairs(ops) do
    if op.kind == "search" then searches[#searches + 1] = op end
  end
  local texts, attach = index_mod.plan(self.index, writes, searches)
  if #texts > 0 then
    local vecs
    vecs, err = index_mod.embed(self.index, texts)
    if not vecs then return nil, err end
    attach(vecs)
  end
  local now = require("moongraph.tasks").now()
  local sweep
  if now >= self.next_sweep then
    sweep = SWEEP_LIMIT
    self.next_sweep = now + self.ttl_config.sweep_interval_minutes * 60
  end
  local kind = #ops == 1 and ops[1].kind
  if not sweep and (kind == "get" or kind == "put" or kind == "delete" or kind == "search") then
    return single(self, ops[1])
  end
  for _, op in ipairs(writes) do
    if op.ttl then self.ttl_seen = true end
  end
  local refreshing = self.ttl_seen
  local sql, params = build(self, ops, writes, sweep)
  local rows
  rows, err = self.db:query(sql, params)
  if not rows then
    if sweep then self.next_sweep = now end
    return nil, "store: " .. tostring(err)
  end
  local results = { n = #ops }
  for i, op in ipairs(ops) do
    if op.kind == "search" or op.kind == "list" then results[i] = {}
    elseif op.kind ~= "get" then results[i] = true end
  end
  sort(rows, function(a, b)
    if a.i ~= b.i then return a.i < b.i end
    return a.pos < b.pos
  end)
  local unrefreshed
  for _, r in ipairs(rows) do
    local i = r.i
    if i == 0 then
      -- the sweep hit its limit: more are waiting, sweep again next time
      if r.score >= SWEEP_LIMIT then self.next_sweep = now end
    else
      local op = ops[i]
      if op.kind == "list" then
        local list = results[i]
        list[#list + 1] = r.ns
      else
        local value, derr = json.decode(r.value)
        if value == nil then return nil, "store: stored value is corrupt: " .. tostring(derr) end
        local it = { namespace = r.ns, key = r.key, value = value,
          created_at = r.created_at, updated_at = r.updated_at,
          score = r.score ~= SQLNULL and r.score or nil }
        if op.kind == "get" then results[i] = it
        else
          local list = results[i]
          list[#list + 1] = it
        end
        if not refreshing and r.r and r.ttl_minutes ~= SQLNULL then
          unrefreshed = unrefreshed or {}
          unrefreshed[#unrefreshed + 1] = it
        end
      end
    end
  end
  if unrefreshed then
    -- not those this batch wrote: their writes set their expiry
    local _, written = base.last_writes(ops)
    local list = {}
    for _, it in ipairs(unrefreshed) do
      if not written[base.write_id(concat(it.namespace, "\0"), it.key)] then list[#list + 1] = it end
    end
    if #list > 0 then
      local ok
      ok, err = refresh_after(self, list)
      if not ok then return nil, err end
    end
  end
  return results
end

---------------------------------------------------------------- transactions

-- "mgstitem" as a big-endian int8: the seed of the items' advisory locks
local ITEM_LOCK_SEED = string.unpack(">i8", "mgstitem")

-- Has every migration been applied (and committed) already? -> bool | nil, err
local function schema_current(db)
  return schema.applied_all(db, _M.SCOPE, _M.migrations)
end

-- A view of store `s` whose statements run on `tx`: it shares s's
-- configuration and leaves sweeping to s (a caller's transaction should
-- hold its own writes only).
local function view(s, tx)
  return setmetatable({ db = tx, in_tx = true, ready = true, next_sweep = math.huge, parent = s,
    ttl_seen = s.ttl_seen, ttl_config = s.ttl_config, index = s.index, _index_mod = s._index_mod }, mt)
end

--[[ s:with(tx) -> view | nil, err
The store on the caller's transaction (or connection): the view's reads
and writes are statements of tx, committed or rolled back with it, so an
item can be written atomically with the caller's own rows. ]]
function store:with(tx)
  if type(tx) ~= "table" or type(tx.query) ~= "function" or type(tx.transaction) ~= "function" then
    base.bad("with", 1, "moongraph.pg transaction or connection expected, got " .. type(tx), 3)
  end
  local s = self.parent or self
  if not s.ready then
    -- asked on tx itself: the caller may hold the pool's last connection
    local current, err = schema_current(tx)
    if current == nil then return nil, "store schema: " .. tostring(err) end
    if current then
      s.ready = true
    else
      -- created in tx (a savepoint): other users of the store wait for tx to end
      local n
      n, err = _M.migrate(tx)
      if not n then return nil, "store schema: " .. tostring(err) end
    end
  end
  return view(s, tx)
end

-- The item's transaction-scoped advisory lock, taken by updates and
-- patches (keyed by a hash of its namespace and key; a collision only
-- makes two items wait for each other). The lock rather than SELECT ...
-- FOR UPDATE because the item may not exist yet, and two first writers
-- must not both start from nothing. In a transaction it is sent ahead,
-- with what follows it (one round trip): its result is not needed.
local function lock_item(db, op)
  return (db.send or db.query)(db, "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
    { ns_form(op).json .. jstr(op.key), ITEM_LOCK_SEED })
end

-- The item's lock, then read, change, write: all on the view's transaction.
local function locked_update(v, get, fn, opts)
  local ok, err = lock_item(v.db, get)
  if not ok then return nil, "store: " .. tostring(err) end
  local res
  res, err = v:_batch({ get })
  if not res then return nil, err end
  local put, value = base.update_write(v, get, fn, res[1], opts)
  if not put then return put, value end
  res, err = v:_batch({ put })
  if not res then return nil, err end
  return value
end

-- The statement of a patch and the text[] literals of its paths, by the
-- patch's add paths (up to PATCH_SEEN of them): an upsert of the value the
-- patch makes of no item (computed here, as the memory store does), whose
-- update of a live item applies the patch to the item's value in SQL: the
-- sets merged in, then the adds, parents made first; a value an addition
-- cannot take calls moongraph_store_refused. $1 namespace, $2 key, $3
-- sets, $4 ttl, $5 the value of a new item, then per parent object its
-- path, per add its path and amount (paths are parameters, never spliced).
local PATCH_SEEN = 256
local patch_forms, patch_n = {}, 0

local function patch_form(op)
  -- the id: each path's labels, each with its length (names may hold any
  -- byte but NUL)
  local id_parts = {}
  for _, a in ipairs(op.adds) do
    for _, l in ipairs(a.path) do id_parts[#id_parts + 1] = #l .. ":" .. l end
    id_parts[#id_parts + 1] = "/"
  end
  if op.repair then id_parts[#id_parts + 1] = "repair" end
  local id = concat(id_parts)
  local f = patch_forms[id]
  if f then return f end
  -- steps: "parent" or "add", in order; pid_of[i]: a parent step's path id;
  -- up[i]: the path ids of step i's parent objects
  local paths, steps, pid_of, up, made = {}, {}, {}, {}, {}
  for _, a in ipairs(op.adds) do
    local parents = {}
    for d = 1, #a.path - 1 do
      local pid = concat(a.path, "\0", 1, d)
      if not made[pid] then
        made[pid] = true
        paths[#paths + 1] = pg_array({ table.unpack(a.path, 1, d) })
        steps[#steps + 1] = "parent"
        pid_of[#steps], up[#steps] = pid, { table.unpack(parents) }
      end
      parents[#parents + 1] = pid
    end
    paths[#paths + 1] = pg_array(a.path)
    steps[#steps + 1] = "add"
    up[#steps] = parents
  end
  local acc, n = "(s.value || $3::jsonb)", 5
  local param_of = {}   -- a parent's path id -> the number of its path parameter
  for i, step in ipairs(steps) do
    n = n + 1
    if step == "parent" then param_of[pid_of[i]] = n end
    local at = format("(s.value #> $%d::text[])", n)
    if op.repair and up[i][1] then
      -- what is under a parent that is not an object counts as absent
      local conds = {}
      for j, pid in ipairs(up[i]) do
        conds[j] = format("COALESCE(jsonb_typeof(s.value #> $%d::text[]), 'object') = 'object'", param_of[pid])
      end
      at = format("(CASE WHEN %s THEN s.value #> $%d::text[] END)", concat(conds, " AND "), n)
    end
    if step == "parent" then
      local bad = op.repair and "'{}'::jsonb" or
        format("moongraph_store_refused('is not an object', $%d::text[], NULL::jsonb)", n)
      acc = format([[jsonb_set(%s, $%d::text[], CASE WHEN %s IS NULL THEN '{}'::jsonb
        WHEN jsonb_typeof(%s) = 'object' THEN %s
        ELSE %s END)]], acc, n, at, at, at, bad)
    else
      -- in numeric, so that a sum past 64 bits is refused naming the field
      local bad = op.repair and "0::numeric" or
        format("moongraph_store_refused('is not an integer', $%d::text[], NULL::numeric)", n)
      local sum = format([[(CASE WHEN %s IS NULL THEN 0::numeric
        WHEN jsonb_typeof(%s) = 'number' AND %s::text !~ '[.eE]' THEN %s::text::numeric
        ELSE %s END + $%d::numeric)]],
        at, at, at, at, bad, n + 1)
      acc = format([[jsonb_set(%s, $%d::text[], to_jsonb(CASE
        WHEN %s BETWEEN -9223372036854775808 AND 9223372036854775807 THEN %s
        ELSE moongraph_store_refused('is out of the integer range', $%d::text[], NULL::numeric) END))]],
        acc, n, sum, sum, n)
      n = n + 1
    end
  end
  f = { steps = steps, paths = paths, sql = format([[
INSERT INTO moongraph_store AS s
  (namespace, key, value, created_at, updated_at, ttl_minutes, expires_at, embedding)
VALUES ($1::text[], $2, $5::jsonb, now(), now(), $4::float8, now() + $4::float8 * interval '1 minute', NULL)
ON CONFLICT (namespace, key) DO UPDATE SET
  value = CASE WHEN s.expires_at <= now() THEN EXCLUDED.value ELSE %s END,
  updated_at = EXCLUDED.updated_at,
  created_at = CASE WHEN s.expires_at <= now() THEN EXCLUDED.created_at ELSE s.created_at END,
  ttl_minutes = EXCLUDED.ttl_minutes, expires_at = EXCLUDED.expires_at, embedding = NULL]], acc) }
  if patch_n >= PATCH_SEEN then patch_forms, patch_n = {}, 0 end
  patch_forms[id], patch_n = f, patch_n + 1
  return f
end

local function patch_params(op, f)
  local params = { ns_form(op).array, op.key, op.set and json.encode(op.set) or "{}", op.ttl or SQLNULL,
    json.encode(base.apply_patch(nil, op)) }
  local k, adds = 0, op.adds
  for i, step in ipairs(f.steps) do
    params[#params + 1] = f.paths[i]
    if step == "add" then
      k = k + 1
      params[#params + 1] = adds[k].n
    end
  end
  return params
end

-- The item's lock, then the patch: sent ahead on a transaction (a refusal
-- fails the transaction), else in a transaction of their own.
local function patch_on(db, op)
  local ok, err = lock_item(db, op)
  if not ok then return nil, err end
  local f = patch_form(op)
  return (db.send or db.query)(db, f.sql, patch_params(op, f))
end

function store:_patch(op)
  if op.ttl then self.ttl_seen = true end
  if self.in_tx then
    local ok, err = patch_on(self.db, op)
    if not ok then return nil, "store: " .. tostring(err) end
    return true
  end
  local ok, err = ready(self)
  if not ok then return nil, err end
  -- (both sent: they go with the COMMIT, one round trip)
  ok, err = self.db:transaction(function(tx)
    local r, perr = patch_on(tx, op)
    if not r then error(perr, 0) end
    return true
  end)
  if not ok then return nil, "store: " .. tostring(err) end
  return true
end

function store:_update(get, fn, opts)
  if self.in_tx then return locked_update(self, get, fn, opts) end
  local ok, err = ready(self)
  if not ok then return nil, err end
  return self.db:transaction(function(tx)
    local r, uerr = locked_update(view(self, tx), get, fn, opts)
    if r == nil then error(uerr, 0) end
    return r
  end)
end

--[[ s:sweep() -> number of expired items deleted | nil, err ]]
function store:sweep()
  local ok, err = ready(self)
  if not ok then return nil, err end
  local _, n = self.db:query("DELETE FROM moongraph_store WHERE expires_at <= now()")
  if not _ then return nil, "store: " .. tostring(n) end
  return n
end

function mt.__tostring(self)
  if self.in_tx then return "moongraph.store.postgres (on " .. tostring(self.db) .. ")" end
  return "moongraph.store.postgres (" .. tostring(self.db) .. ")"
end

--[[ postgres(url | db | pool [, {pool_size =, index =, ttl =}]) -> store ]]
function _M.new(target, opts)
  if opts ~= nil and type(opts) ~= "table" then
    base.bad("postgres", 2, "options table expected, got " .. type(opts), 3)
  end
  opts = opts or {}
  for k, v in pairs(opts) do
    if k ~= "pool_size" and k ~= "index" and k ~= "ttl" then
      base.bad("postgres", 2, "unknown option '" .. tostring(k) .. "'", 3)
    end
    if k == "pool_size" and (math.type(v) ~= "integer" or v < 1) then
      base.bad("postgres", 2, "pool_size must be a positive integer", 3)
    end
  end
  local db
  if type(target) == "string" then
    db = require("moongraph.pg").pool(target, { size = opts.pool_size or 4 })
  elseif type(target) == "table" and type(target.query) == "function"
      and type(target.transaction) == "function" then
    if opts.pool_size then base.bad("postgres", 2, "pool_size needs a URL, not a pool", 3) end
    db = target
  else
    base.bad("postgres", 1, "PostgreSQL URL, connection or pool expected, got " .. type(target), 3)
  end
  local s = base.new({ db = db, ready = false, next_sweep = 0 }, mt, opts, "postgres", 2, 3)
  -- statements refresh TTLs only once the store knows some item has one
  s.ttl_seen = s.ttl_config.default_ttl ~= nil
  return s
end

_M.store = store
return _M
