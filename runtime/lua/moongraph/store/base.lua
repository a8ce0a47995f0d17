--[[
moongraph.store.base — what every Store backend shares: the argument rules
of LangGraph's BaseStore and the methods built on one `batch`.

A backend supplies `self:_batch(ops)` taking a list of checked operations
(below) and returning their results in order (a list with `n`), or nil,
err; this module checks what callers pass, raises "bad argument ..." for
misuse, and turns put/get/delete/search/list_namespaces into one-op batches.

Checked operations (what a backend receives):

  { kind = "get",    ns =, nskey =, key =, refresh = bool }
  { kind = "put",    ns =, nskey =, key =, value = table, text = json, ttl = minutes|nil,
                     index = nil|false|{paths} }
  { kind = "delete", ns =, nskey =, key = }
  { kind = "search", prefix =, filter = {{field, op, value, text}...}|nil, query = string|nil,
                     limit =, offset =, refresh = bool }
  { kind = "list",   prefix =, suffix =, max_depth =, limit =, offset = }

A backend may also supply `self:_patch(op)` for s:patch (used unless the
item is to be embedded: an index in effect); without it a patch is an
`_update` that applies it in Lua (`apply_patch`). The op:

  { kind = "patch",  ns =, nskey =, key =, set = table|nil,
                     adds = { {path = {field, ...}, n = integer, sort_key =}, ... } (sorted by path),
                     ttl = minutes|nil, index = nil|false|{paths} }

`nskey` is the namespace's labels joined with "\0": labels hold no NUL, so
the join is unique, and byte order of joined keys is the tuple order of
the namespaces (shorter first on a common prefix).
]]

local type, error, tostring, pairs, ipairs, pcall, setmetatable, getmetatable =
  type, error, tostring, pairs, ipairs, pcall, setmetatable, getmetatable
local math_type, format, concat, utf8_len = math.type, string.format, table.concat, utf8.len

local json = require "moongraph.json"

local _M = {}
local methods = {}
_M.methods = methods

local OPERATORS = { ["$eq"] = true, ["$ne"] = true, ["$gt"] = true, ["$gte"] = true,
  ["$lt"] = true, ["$lte"] = true }
_M.OPERATORS = OPERATORS

---------------------------------------------------------------- checks

-- Misuse is raised at the caller's call site: `fname` is the method the
-- user called, `argn` the argument. Every checking function takes `lvl`,
-- the level error() would need inside it to blame the user's line, and
-- passes lvl + 1 to what it calls.
-- While a batch's ops are checked, `op_index` and `op_kind` name the op
-- being checked, for the message ("op 3 (get): ...").
local op_index, op_kind = nil, nil

local function bad(fname, argn, msg, lvl)
  local i = op_index
  op_index = nil
  if i then fname, argn, msg = "batch", 1, format("op %d (%s): %s", i, op_kind, msg) end
  error(format("bad argument #%d to '%s' (%s)", argn, fname, msg), lvl)
end

-- (labels and keys come back call after call: those seen to be good are
-- remembered, up to TEXT_SEEN of them)
local TEXT_SEEN = 4096
local good_text, good_n = {}, 0
local function check_text(s)
  if good_text[s] then return true end
  if type(s) ~= "string" or s:find("\0", 1, true) or utf8_len(s) == nil then return false end
  if good_n >= TEXT_SEEN then good_text, good_n = {}, 0 end
  good_text[s], good_n = true, good_n + 1
  return true
end

-- namespace (non-empty list of non-empty labels, or empty when `empty_ok`),
-- returns labels copy and nskey; `wild` lets "*" stand for any label.
local function check_ns(v, fname, argn, what, lvl, empty_ok)
  if type(v) ~= "table" then
    bad(fname, argn, what .. " must be a list of strings, got " .. type(v), lvl + 1)
  end
  local n = #v
  if n == 0 and not empty_ok then bad(fname, argn, what .. " must not be empty", lvl + 1) end
  local labels = {}
  for i = 1, n do
    local l = v[i]
    if type(l) ~= "string" then
      bad(fname, argn, format("%s label %d must be a string, got %s", what, i, type(l)), lvl + 1)
    end
    if l == "" then bad(fname, argn, format("%s label %d is empty", what, i), lvl + 1) end
    if not check_text(l) then
      bad(fname, argn, format("%s label %d must be UTF-8 text without NUL bytes", what, i), lvl + 1)
    end
    labels[i] = l
  end
  return labels, concat(labels, "\0")
end

local function check_key(k, fname, argn, lvl)
  if type(k) ~= "string" then bad(fname, argn, "key must be a string, got " .. type(k), lvl + 1) end
  if not check_text(k) then bad(fname, argn, "key must be UTF-8 text without NUL bytes", lvl + 1) end
  return k
end

local NO_OPTS = setmetatable({}, { __newindex = function() error("store: options are read-only", 2) end })

local function check_opts(opts, fname, argn, allowed, lvl)
  if opts == nil then return NO_OPTS end
  if type(opts) ~= "table" then bad(fname, argn, "options table expected, got " .. type(opts), lvl + 1) end
  for k in pairs(opts) do
    if not allowed[k] then bad(fname, argn, "unknown option '" .. tostring(k) .. "'", lvl + 1) end
  end
  return opts
end

local function check_count(v, default, fname, argn, name, lvl, min)
  if v == nil then return default end
  if math_type(v) ~= "integer" or v < (min or 0) then
    bad(fname, argn, format("%s must be an integer >= %d", name, min or 0), lvl + 1)
  end
  return v
end

local function check_bool(v, default, fname, argn, name, lvl)
  if v == nil then return default end
  if type(v) ~= "boolean" then bad(fname, argn, name .. " must be a boolean", lvl + 1) end
  return v
end

-- ttl: nil -> the store's default; false -> none; a positive number of minutes.
local function check_ttl(store, v, fname, argn, lvl)
  if v == nil then return store.ttl_config.default_ttl end
  if v == false then return nil end
  if type(v) ~= "number" or v ~= v or v <= 0 or v == math.huge then
    bad(fname, argn, "ttl must be a positive number of minutes or false", lvl + 1)
  end
  return v
end

local function check_index(store, v, fname, argn, lvl)
  if v == nil or v == false then return v end
  if type(v) ~= "table" or #v == 0 then
    bad(fname, argn, "index must be false or a non-empty list of field paths", lvl + 1)
  end
  local paths = {}
  for i, p in ipairs(v) do
    local tokens, err = store._index_mod.tokenize(p)
    if not tokens then bad(fname, argn, "index path " .. i .. ": " .. err, lvl + 1) end
    paths[i] = { path = p, tokens = tokens }
  end
  return paths
end

-- A JSON value's private copy, checked on the way: strings of UTF-8, finite
-- numbers, booleans, json.null, lists and tables of string keys, no cycles.
-- copy_in(v, seen) -> the copy | nil, where, what: the path below v to what
-- is wrong ("" for v itself, then ".key" and "[i]" steps) and why; the path
-- is made only for a failure.
local null, is_array, array = json.null, json.is_array, json.array
local function copy_in(v, seen)
  local tv = type(v)
  if tv == "string" then
    if not utf8_len(v) then return nil, "", " is not UTF-8 text" end
    return v
  elseif tv == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return nil, "", " is not a finite number" end
    return v
  elseif tv == "boolean" or v == null then
    return v
  elseif tv ~= "table" then
    return nil, "", " is a " .. tv .. ", which JSON cannot hold"
  end
  local mt = getmetatable(v)
  if mt ~= nil and not is_array(v) then return nil, "", " is a table with a metatable" end
  if seen[v] then return nil, "", " is a table that contains itself" end
  seen[v] = true
  local out, n = {}, #v
  local strings = false
  for k, x in pairs(v) do
    if type(k) == "string" then
      strings = true
      if not utf8_len(k) then return nil, "", " has a key that is not UTF-8 text" end
    elseif not (math_type(k) == "integer" and k >= 1 and k <= n) then
      return nil, "", " has a key of type " .. type(k) .. "; only string keys or a list 1..n can be saved"
    end
    local c, where, what = copy_in(x, seen)
    if c == nil then
      return nil, (type(k) == "string" and "." .. k or "[" .. k .. "]") .. where, what
    end
    out[k] = c
  end
  seen[v] = nil
  if strings and n > 0 then
    return nil, "", " mixes list items and string keys"
  end
  if mt ~= nil or (n > 0 and not strings) then array(out) end
  return out
end

-- copy_value(v, path, seen) -> the copy | nil, reason (naming the path to
-- what is wrong, from `path`)
local function copy_value(v, path, seen)
  local c, where, what = copy_in(v, seen)
  if c == nil then return nil, path .. where .. what end
  return c
end
_M.copy_value = copy_value

local function check_value(v, fname, argn, lvl)
  if type(v) ~= "table" or getmetatable(v) ~= nil then
    bad(fname, argn, "value must be a table of fields, got " .. (type(v) == "table" and "a list" or type(v)), lvl + 1)
  end
  if #v > 0 then bad(fname, argn, "value must be a table of fields, not a list", lvl + 1) end
  local copy, err = copy_value(v, "value", {})
  if copy == nil then bad(fname, argn, err, lvl + 1) end
  if getmetatable(copy) ~= nil then bad(fname, argn, "value must be a table of fields, not a list", lvl + 1) end
  return copy
end

local function is_operator_table(v)
  if type(v) ~= "table" or json.is_array(v) then return false end
  local any_op, any_field = false, false
  for k in pairs(v) do
    if type(k) == "string" and k:sub(1, 1) == "$" then any_op = true else any_field = true end
  end
  return any_op, any_op and any_field
end

-- filter {field = value | {["$op"] = value, ...}} -> list of {field, op, value, text}
local function check_filter(f, fname, argn, lvl)
  if f == nil then return nil end
  if type(f) ~= "table" then bad(fname, argn, "filter must be a table, got " .. type(f), lvl + 1) end
  local out = {}
  local fields = {}
  for k in pairs(f) do
    if type(k) ~= "string" then bad(fname, argn, "filter keys must be field names (strings)", lvl + 1) end
    fields[#fields + 1] = k
  end
  table.sort(fields)
  for _, field in ipairs(fields) do
    local v = f[field]
    local ops, mixed = is_operator_table(v)
    if mixed then
      bad(fname, argn, "filter on '" .. field .. "' mixes operators and fields", lvl + 1)
    end
    local conds = ops and v or { ["$eq"] = v }
    local names = {}
    for op in pairs(conds) do
      if not OPERATORS[op] then
        bad(fname, argn, "unknown filter operator '" .. op .. "' (expected $eq, $ne, $gt, $gte, $lt, $lte)", lvl + 1)
      end
      names[#names + 1] = op
    end
    table.sort(names)
    for _, op in ipairs(names) do
      local val = conds[op]
      if op ~= "$eq" and op ~= "$ne" and type(val) ~= "number" and type(val) ~= "string" then
        bad(fname, argn, format("filter %s on '%s' needs a number or a string", op, field), lvl + 1)
      end
      local text, err = json.encode(val, { name = "filter." .. field })
      if not text then bad(fname, argn, err, lvl + 1) end
      out[#out + 1] = { field = field, op = op, value = val, text = text }
    end
  end
  return out
end

---------------------------------------------------------------- ops

local GET_OPTS = { refresh_ttl = true }
local PUT_OPTS = { ttl = true, index = true }
local PATCH_OPTS = { ttl = true, index = true, repair = true }
local SEARCH_OPTS = { filter = true, query = true, limit = true, offset = true, refresh_ttl = true }
local LIST_OPTS = { prefix = true, suffix = true, max_depth = true, limit = true, offset = true }

local function refresh_default(store) return store.ttl_config.refresh_on_read ~= false end

local function get_op(store, ns, key, opts, fname, a, lvl)
  local labels, nskey = check_ns(ns, fname, a, "namespace", lvl + 1)
  check_key(key, fname, a + 1, lvl + 1)
  opts = check_opts(opts, fname, a + 2, GET_OPTS, lvl + 1)
  return { kind = "get", ns = labels, nskey = nskey, key = key,
    refresh = check_bool(opts.refresh_ttl, refresh_default(store), fname, a + 2, "refresh_ttl", lvl + 1) }
end

local function put_op(store, ns, key, value, opts, fname, a, lvl)
  local labels, nskey = check_ns(ns, fname, a, "namespace", lvl + 1)
  check_key(key, fname, a + 1, lvl + 1)
  opts = check_opts(opts, fname, a + 3, PUT_OPTS, lvl + 1)
  if value == nil then
    return { kind = "delete", ns = labels, nskey = nskey, key = key }
  end
  return { kind = "put", ns = labels, nskey = nskey, key = key, value = check_value(value, fname, a + 2, lvl + 1),
    ttl = check_ttl(store, opts.ttl, fname, a + 3, lvl + 1),
    index = check_index(store, opts.index, fname, a + 3, lvl + 1) }
end

local function search_op(store, prefix, opts, fname, a, lvl)
  local labels, nskey = check_ns(prefix == nil and {} or prefix, fname, a, "namespace prefix", lvl + 1, true)
  opts = check_opts(opts, fname, a + 1, SEARCH_OPTS, lvl + 1)
  local q = opts.query
  if q ~= nil and (type(q) ~= "string" or q == "") then
    bad(fname, a + 1, "query must be a non-empty string", lvl + 1)
  end
  return { kind = "search", prefix = labels, nskey = nskey,
    filter = check_filter(opts.filter, fname, a + 1, lvl + 1),
    query = q,
    limit = check_count(opts.limit, 10, fname, a + 1, "limit", lvl + 1),
    offset = check_count(opts.offset, 0, fname, a + 1, "offset", lvl + 1),
    refresh = check_bool(opts.refresh_ttl, refresh_default(store), fname, a + 1, "refresh_ttl", lvl + 1) }
end

local function list_op(_, opts, fname, a, lvl)
  opts = check_opts(opts, fname, a, LIST_OPTS, lvl + 1)
  local prefix = opts.prefix and check_ns(opts.prefix, fname, a, "prefix", lvl + 1, true) or {}
  local suffix = opts.suffix and check_ns(opts.suffix, fname, a, "suffix", lvl + 1, true) or {}
  return { kind = "list", prefix = prefix, suffix = suffix,
    max_depth = check_count(opts.max_depth, nil, fname, a, "max_depth", lvl + 1, 1),
    limit = check_count(opts.limit, 100, fname, a, "limit", lvl + 1),
    offset = check_count(opts.offset, 0, fname, a, "offset", lvl + 1) }
end

---------------------------------------------------------------- batch op tables

local BATCH_FIELDS = {
  get = { op = true, namespace = true, key = true, refresh_ttl = true },
  put = { op = true, namespace = true, key = true, value = true, ttl = true, index = true },
  delete = { op = true, namespace = true, key = true },
  search = { op = true, namespace_prefix = true, filter = true, query = true, limit = true,
    offset = true, refresh_ttl = true },
  list_namespaces = { op = true, prefix = true, suffix = true, max_depth = true, limit = true,
    offset = true },
}

local function batch_op(store, t, i, lvl)
  local fname = "batch"
  if type(t) ~= "table" then bad(fname, 1, format("op %d must be a table, got %s", i, type(t)), lvl + 1) end
  local kind = t.op
  local fields = BATCH_FIELDS[kind]
  if not fields then
    bad(fname, 1, format("op %d: op must be get, put, delete, search or list_namespaces, got %s",
      i, tostring(kind)), lvl + 1)
  end
  for k in pairs(t) do
    if not fields[k] then bad(fname, 1, format("op %d (%s): unknown field '%s'", i, kind, tostring(k)), lvl + 1) end
  end
  op_index, op_kind = i, kind
  local op
  if kind == "get" then
    op = get_op(store, t.namespace, t.key, { refresh_ttl = t.refresh_ttl }, fname, 1, lvl + 1)
  elseif kind == "put" then
    op = put_op(store, t.namespace, t.key, t.value, { ttl = t.ttl, index = t.index }, fname, 1, lvl + 1)
  elseif kind == "delete" then
    op = put_op(store, t.namespace, t.key, nil, nil, fname, 1, lvl + 1)
  elseif kind == "search" then
    op = search_op(store, t.namespace_prefix, { filter = t.filter, query = t.query,
      limit = t.limit, offset = t.offset, refresh_ttl = t.refresh_ttl }, fname, 1, lvl + 1)
  else
    op = list_op(store, { prefix = t.prefix, suffix = t.suffix, max_depth = t.max_depth,
      limit = t.limit, offset = t.offset }, fname, 1, lvl + 1)
  end
  op_index = nil
  return op
end

---------------------------------------------------------------- patches

-- "intents.waste": a field path for messages
local function path_label(path, upto)
  return concat(path, ".", 1, upto or #path)
end

-- the most integers one patch adds
local PATCH_ADDS = 100
_M.PATCH_ADDS = PATCH_ADDS

-- The integer additions of patch.add, flattened: {path =, n =, sort_key =}
-- per leaf (sort_key: the path joined with NUL, which no field name holds).
local function flatten_adds(t, prefix, out, seen, fname, argn, lvl)
  local function where() return "patch.add" .. (#prefix > 0 and "." .. path_label(prefix) or "") end
  if type(t) ~= "table" or getmetatable(t) ~= nil or #t > 0 then
    bad(fname, argn, where() .. " must be a table of fields, got " ..
      (type(t) == "table" and "a list" or type(t)), lvl + 1)
  end
  if seen[t] then bad(fname, argn, where() .. " is a table that contains itself", lvl + 1) end
  seen[t] = true
  for k, v in pairs(t) do
    if type(k) ~= "string" then bad(fname, argn, where() .. " has a " .. type(k) .. " key; fields are strings", lvl + 1) end
    if not check_text(k) then bad(fname, argn, where() .. " has a field name that is not UTF-8 text without NUL", lvl + 1) end
    local path = {}
    for i = 1, #prefix do path[i] = prefix[i] end
    path[#path + 1] = k
    if math_type(v) == "integer" then
      if #out >= PATCH_ADDS then bad(fname, argn, "patch.add holds more than " .. PATCH_ADDS .. " integers", lvl + 1) end
      out[#out + 1] = { path = path, n = v, sort_key = concat(path, "\0") }
    elseif type(v) == "table" and getmetatable(v) == nil then
      flatten_adds(v, path, out, seen, fname, argn, lvl + 1)
    else
      bad(fname, argn, where() .. "." .. k .. " must be an integer or a table of them, got " ..
        (math_type(v) == "float" and "a float" or type(v)), lvl + 1)
    end
  end
  return out
end

local PATCH_PARTS = { set = true, add = true }

local function by_sort_key(x, y) return x.sort_key < y.sort_key end

local function patch_op(store, ns, key, p, opts, fname, a, lvl)
  local labels, nskey = check_ns(ns, fname, a, "namespace", lvl + 1)
  check_key(key, fname, a + 1, lvl + 1)
  if type(p) ~= "table" or getmetatable(p) ~= nil then
    bad(fname, a + 2, "patch table {set =, add =} expected, got " .. type(p), lvl + 1)
  end
  for k in pairs(p) do
    if not PATCH_PARTS[k] then bad(fname, a + 2, "unknown patch part '" .. tostring(k) .. "' (set or add)", lvl + 1) end
  end
  opts = check_opts(opts, fname, a + 3, PATCH_OPTS, lvl + 1)
  local repair = check_bool(opts.repair, false, fname, a + 3, "repair", lvl + 1)
  local set = nil
  if p.set ~= nil then
    if type(p.set) ~= "table" or getmetatable(p.set) ~= nil or #p.set > 0 then
      bad(fname, a + 2, "patch.set must be a table of fields", lvl + 1)
    end
    local err
    set, err = copy_value(p.set, "patch.set", {})
    if set == nil then bad(fname, a + 2, err, lvl + 1) end
  end
  local adds = p.add ~= nil and flatten_adds(p.add, {}, {}, {}, fname, a + 2, lvl + 1) or {}
  for _, x in ipairs(adds) do
    if set and set[x.path[1]] ~= nil then
      bad(fname, a + 2, "field '" .. x.path[1] .. "' is both in patch.set and in patch.add", lvl + 1)
    end
  end
  if adds[2] then table.sort(adds, by_sort_key) end
  return { kind = "patch", ns = labels, nskey = nskey, key = key, set = set, adds = adds, repair = repair,
    ttl = check_ttl(store, opts.ttl, fname, a + 3, lvl + 1),
    index = check_index(store, opts.index, fname, a + 3, lvl + 1) }
end

-- a table that JSON writes as an object (not a list, not null)
local function is_object(v)
  return type(v) == "table" and v ~= null and not is_array(v) and v[1] == nil
end

--[[ apply_patch(value, op) -> the new value | nil, err: what s:patch makes
of an item's value (nil: no item). value is left as it is. ]]
function _M.apply_patch(value, op)
  local v = {}
  if value then for k, x in pairs(value) do v[k] = x end end
  if op.set then for k, x in pairs(op.set) do v[k] = x end end
  local made = {}   -- the objects on the adds' paths, made or copied here
  for _, a in ipairs(op.adds) do
    local path, t = a.path, v
    for d = 1, #path - 1 do
      local k = path[d]
      local c = t[k]
      if not made[c] then
        if c == nil or (op.repair and not is_object(c)) then
          c = {}
        elseif is_object(c) then
          local copy = {}
          for kk, x in pairs(c) do copy[kk] = x end
          c = copy
        else
          return nil, "patch: " .. path_label(path, d) .. " is not an object"
        end
        made[c] = true
        t[k] = c
      end
      t = c
    end
    local k = path[#path]
    local cur = t[k]
    if cur == nil or (op.repair and math_type(cur) ~= "integer") then cur = 0 end
    if math_type(cur) ~= "integer" then return nil, "patch: " .. path_label(path) .. " is not an integer" end
    local sum = cur + a.n
    if (a.n > 0 and sum < cur) or (a.n < 0 and sum > cur) then
      return nil, "patch: " .. path_label(path) .. " is out of the integer range"
    end
    t[k] = sum
  end
  return v
end

---------------------------------------------------------------- methods

local function check_self(self, fname)
  if type(self) ~= "table" or type(self._batch) ~= "function" then
    error(format("bad self to '%s' (store expected; call it as s:%s(...))", fname, fname), 3)
  end
end

--[[ s:put(namespace, key, value [, {ttl =, index =}]) -> true | nil, err
value nil deletes. ttl: minutes (nil: the store's default_ttl; false: never
expires). index: false (not vectorised) or a list of field paths. ]]
function methods:put(namespace, key, value, opts)
  check_self(self, "put")
  local res, err = self:_batch({ put_op(self, namespace, key, value, opts, "put", 1, 3) })
  if not res then return nil, err end
  return true
end

--[[ s:get(namespace, key [, {refresh_ttl =}]) -> item | nil (absent) | nil, err ]]
function methods:get(namespace, key, opts)
  check_self(self, "get")
  local op = get_op(self, namespace, key, opts, "get", 1, 3)
  -- a backend may answer a lone get without a batch (the memory store)
  if self._get then return self:_get(op) end
  local res, err = self:_batch({ op })
  if not res then return nil, err end
  return res[1]
end

--[[ s:delete(namespace, key) -> true | nil, err ]]
function methods:delete(namespace, key)
  check_self(self, "delete")
  local res, err = self:_batch({ put_op(self, namespace, key, nil, nil, "delete", 1, 3) })
  if not res then return nil, err end
  return true
end

--[[ s:search(namespace_prefix [, {filter=, query=, limit=10, offset=0, refresh_ttl=}])
-> list of items (each with `score` when a query ranked it) | nil, err ]]
function methods:search(prefix, opts)
  check_self(self, "search")
  local res, err = self:_batch({ search_op(self, prefix, opts, "search", 1, 3) })
  if not res then return nil, err end
  return res[1]
end

--[[ s:list_namespaces{prefix=, suffix=, max_depth=, limit=100, offset=0}
-> sorted list of namespaces | nil, err ]]
function methods:list_namespaces(opts)
  check_self(self, "list_namespaces")
  local res, err = self:_batch({ list_op(self, opts, "list_namespaces", 1, 3) })
  if not res then return nil, err end
  return res[1]
end

--[[ s:batch(ops) -> results (a list with n: nil for a get that found
nothing and true for a put or delete) | nil, err. The reads see the store
as it was before the batch; of several writes to one key the last wins. ]]
function methods:batch(ops)
  check_self(self, "batch")
  if type(ops) ~= "table" then bad("batch", 1, "list of operations expected, got " .. type(ops), 3) end
  local list = {}
  for i = 1, #ops do list[i] = batch_op(self, ops[i], i, 3) end
  if #list == 0 then return { n = 0 } end
  return self:_batch(list)
end

--[[ s:update(namespace, key, fn [, {ttl =, index =}]) -> value | false | nil, err
Read, change and write one item: fn(value or nil) returns the item's new
value (put, as with s:put) or nil to leave it as it is (update returns
false). Updates of one item are serialized, in this process and (on
PostgreSQL) across processes: two updates never both read the same value.
A plain put meanwhile is not waited for. fn may yield; an error it raises,
or a value the store cannot keep, is returned as nil, err with nothing
written. ]]
function methods:update(namespace, key, fn, opts)
  check_self(self, "update")
  local get = get_op(self, namespace, key, { refresh_ttl = false }, "update", 1, 3)
  if type(fn) ~= "function" then bad("update", 3, "function expected, got " .. type(fn), 3) end
  put_op(self, namespace, key, {}, opts, "update", 1, 3)     -- the options, checked now
  return self:_update(get, fn, opts)
end

--[[ s:patch(namespace, key, {set =, add =} [, {ttl =, index =, repair =}]) -> true | nil, err
Change one item without reading it: each field of `set` replaces the
value's field of that name; each integer in `add` is added to the integer
at that field (absent: 0), and a table in `add` adds into the object at
that field (absent: made). No item: it starts from {}. Patches and updates
of one item never lose each other's changes. Adding to something that is
not an integer (or into something that is not an object) is an error, and
nothing is written; with repair = true such a field is replaced instead
(counted from 0, or made a new object). ]]
function methods:patch(namespace, key, p, opts)
  check_self(self, "patch")
  local op = patch_op(self, namespace, key, p, opts, "patch", 1, 3)
  -- a vectorised item is embedded from its new value: read, change, write
  if self._patch and not (self.index and op.index ~= false) then return self:_patch(op) end
  local get = { kind = "get", ns = op.ns, nskey = op.nskey, key = key, refresh = false }
  local v, err = self:_update(get, function(value)
    local nv, perr = _M.apply_patch(value, op)
    if not nv then error(perr, 0) end
    return nv
  end, opts and { ttl = opts.ttl, index = opts.index })
  if v == nil then return nil, (tostring(err):gsub("^update: ", "", 1)) end
  return true
end

---------------------------------------------------------------- for backends

-- update_write(store, get, fn, item, opts) -> checked put op, value | false | nil, err:
-- what fn makes of the item an update read.
function _M.update_write(store, get, fn, item, opts)
  local ok, v = pcall(fn, item and item.value or nil)
  if not ok then return nil, "update: " .. tostring(v) end
  if v == nil then return false end
  local pok, op = pcall(put_op, store, get.ns, get.key, v, opts, "update", 1, 1)
  if not pok then
    return nil, "update: the new value cannot be stored: " .. tostring(op):gsub("^[^\n]-:%d+: ", "")
  end
  return op, v
end

-- key_lock(locks, id) -> guard: a mutex per id among this process's tasks,
-- released when the guard goes out of scope (a <close> variable).
function _M.key_lock(locks, id)
  local l = locks[id]
  if not l then
    l = { q = require("moongraph.tasks").queue(), n = 0 }
    l.q:put(true)
    locks[id] = l
  end
  l.n = l.n + 1
  local function leave()
    l.n = l.n - 1
    if l.n == 0 and locks[id] == l then locks[id] = nil end
  end
  local ok, got = pcall(l.q.get, l.q)
  if not ok or not got then
    leave()
    error(ok and "store: lock wait ended: closed" or got, 0)
  end
  return setmetatable({}, { __close = function()
    l.q:put(true)
    leave()
  end })
end

-- Writes of a batch, deduplicated: the last put or delete of each key.
function _M.last_writes(ops)
  local last, order = {}, {}
  for _, op in ipairs(ops) do
    if op.kind == "put" or op.kind == "delete" then
      local id = op.nskey .. "\0\0" .. op.key
      if not last[id] then order[#order + 1] = id end
      last[id] = op
    end
  end
  local out = {}
  for i, id in ipairs(order) do out[i] = last[id] end
  return out, last
end

function _M.write_id(nskey, key) return nskey .. "\0\0" .. key end

-- does namespace `ns` match the prefix / suffix patterns ("*" = any label)?
function _M.matches(ns, prefix, suffix)
  local n = #ns
  if #prefix > n or #suffix > n then return false end
  for i = 1, #prefix do
    if prefix[i] ~= "*" and prefix[i] ~= ns[i] then return false end
  end
  local off = n - #suffix
  for i = 1, #suffix do
    if suffix[i] ~= "*" and suffix[i] ~= ns[off + i] then return false end
  end
  return true
end

-- TTL configuration {default_ttl =, refresh_on_read =, sweep_interval_minutes =}
function _M.check_ttl_config(t, fname, argn, lvl)
  if t == nil then return { refresh_on_read = true, sweep_interval_minutes = 5 } end
  if type(t) ~= "table" then
    bad(fname, argn, "ttl must be a table {default_ttl=, refresh_on_read=, sweep_interval_minutes=}", lvl + 1)
  end
  for k, v in pairs(t) do
    if k == "default_ttl" or k == "sweep_interval_minutes" then
      if v ~= nil and (type(v) ~= "number" or v ~= v or v <= 0 or v == math.huge) then
        bad(fname, argn, "ttl." .. k .. " must be a positive number of minutes", lvl + 1)
      end
    elseif k == "refresh_on_read" then
      if type(v) ~= "boolean" then bad(fname, argn, "ttl.refresh_on_read must be a boolean", lvl + 1) end
    else
      bad(fname, argn, "unknown ttl option '" .. tostring(k) .. "'", lvl + 1)
    end
  end
  return { default_ttl = t.default_ttl, refresh_on_read = t.refresh_on_read ~= false,
    sweep_interval_minutes = t.sweep_interval_minutes or 5 }
end

-- A new store object: backend fields plus the shared configuration.
-- `lvl`: the error level inside new() that blames the user's line.
function _M.new(fields, mt, opts, fname, argn, lvl)
  fields.ttl_config = _M.check_ttl_config(opts.ttl, fname, argn, lvl + 1)
  fields._index_mod = require "moongraph.store.index"
  fields.index = opts.index and fields._index_mod.config(opts.index, fname, argn, lvl + 1) or nil
  return setmetatable(fields, mt)
end

_M.bad = bad
return _M
