--[[
moongraph.store.index — semantic search for the Store: which texts of an
item are embedded, calling the embed function, and cosine scores.

  index = { embed = fn(texts) -> list of vectors, dims = n, fields = {"text", ...} }

Field paths follow LangGraph's: "$" is the whole value as JSON (the
default), "a.b" a nested field, "a[0]" / "a[-1]" one list element,
"a[*]" each element (one vector each), "*" each field of an object. A
string is embedded as it is; a number or boolean as its text; a table as
its JSON. A path that finds nothing gives no vector, so an item without
the indexed fields is simply not vectorised.

Vectors are stored unit length, so a cosine similarity is a dot product;
an item's score is the best of its vectors' (LangGraph's max pooling).
]]

local type, error, tostring, ipairs, pairs, pcall, getmetatable, tonumber, math_type =
  type, error, tostring, ipairs, pairs, pcall, getmetatable, tonumber, math.type
local format, sqrt, tointeger = string.format, math.sqrt, math.tointeger

local json = require "moongraph.json"

local _M = {}

--[[ tokenize(path) -> list of tokens | nil, err
Tokens: {field = name} | {index = n} | {all = true} (list [*] or "*"). ]]
function _M.tokenize(path)
  if type(path) ~= "string" or path == "" then return nil, "a field path must be a non-empty string" end
  if path == "$" then return { whole = true } end
  local tokens, pos, n = {}, 1, #path
  while pos <= n do
    local c = path:sub(pos, pos)
    if c == "[" then
      local close = path:find("]", pos, true)
      if not close then return nil, format("unclosed [ in field path %q", path) end
      local inner = path:sub(pos + 1, close - 1)
      if inner == "*" then
        tokens[#tokens + 1] = { all = true }
      else
        local i = tointeger(tonumber(inner))
        if not i or not inner:find("^%-?%d+$") then
          return nil, format("list index must be an integer or * in field path %q", path)
        end
        tokens[#tokens + 1] = { index = i }
      end
      pos = close + 1
      if path:sub(pos, pos) == "." then pos = pos + 1 end
    else
      local stop = path:find("[%.%[]", pos) or n + 1
      local name = path:sub(pos, stop - 1)
      if name == "" then return nil, format("empty field name in field path %q", path) end
      tokens[#tokens + 1] = name == "*" and { all = true } or { field = name }
      pos = stop
      if path:sub(pos, pos) == "." then
        pos = pos + 1
        if pos > n then return nil, format("field path %q ends with a dot", path) end
      end
    end
  end
  return tokens
end

local function is_list(t) return json.is_array(t) or (#t > 0 and t[1] ~= nil) end

local function leaf_text(v, out)
  local tv = type(v)
  if tv == "string" then
    out[#out + 1] = v
  elseif tv == "number" or tv == "boolean" then
    out[#out + 1] = tostring(v)
  elseif tv == "table" and v ~= json.null then
    out[#out + 1] = json.encode(v, { valid_utf8 = true })
  end
end

local function walk(v, tokens, i, out)
  local t = tokens[i]
  if not t then return leaf_text(v, out) end
  if type(v) ~= "table" then return end
  if t.field then
    if not is_list(v) and v[t.field] ~= nil then walk(v[t.field], tokens, i + 1, out) end
  elseif t.index then
    if is_list(v) then
      local k = t.index >= 0 and t.index + 1 or #v + t.index + 1
      if v[k] ~= nil then walk(v[k], tokens, i + 1, out) end
    end
  elseif is_list(v) then
    for _, x in ipairs(v) do walk(x, tokens, i + 1, out) end
  else
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do walk(v[k], tokens, i + 1, out) end
  end
end

--[[ texts(value, paths) -> list of texts to embed for one item ]]
function _M.texts(value, paths)
  local out = {}
  for _, p in ipairs(paths) do
    if p.tokens.whole then
      out[#out + 1] = json.encode(value, { valid_utf8 = true })
    else
      walk(value, p.tokens, 1, out)
    end
  end
  return out
end

--[[ config(t, fname, argn, lvl) -> checked index configuration (raises on misuse) ]]
function _M.config(t, fname, argn, lvl)
  local function bad(msg)
    error(format("bad argument #%d to '%s' (index.%s)", argn, fname, msg), lvl + 1)
  end
  if type(t) ~= "table" then bad("must be a table {embed=, dims=, fields=}") end
  for k in pairs(t) do
    if k ~= "embed" and k ~= "dims" and k ~= "fields" then bad("has an unknown option '" .. tostring(k) .. "'") end
  end
  local embed = t.embed
  if type(embed) ~= "function" and not (type(embed) == "table" and getmetatable(embed)
      and getmetatable(embed).__call) then
    bad("embed must be a function(texts) -> list of vectors")
  end
  if math_type(t.dims) ~= "integer" or t.dims < 1 then bad("dims must be a positive integer") end
  local fields = t.fields or { "$" }
  if type(fields) ~= "table" or #fields == 0 then bad("fields must be a non-empty list of field paths") end
  local paths = {}
  for i, p in ipairs(fields) do
    local tokens, err = _M.tokenize(p)
    if not tokens then bad(format("fields[%d]: %s", i, err)) end
    paths[i] = { path = p, tokens = tokens }
  end
  return { embed = embed, dims = t.dims, paths = paths }
end

-- unit-length copy of a vector (a zero vector stays zero: it scores 0)
local function normalise(v, dims)
  local s = 0.0
  for i = 1, dims do s = s + v[i] * v[i] end
  local out = {}
  if s == 0 then
    for i = 1, dims do out[i] = 0.0 end
    return out
  end
  local inv = 1 / sqrt(s)
  for i = 1, dims do out[i] = v[i] * inv end
  return out
end

--[[ embed(index, texts) -> list of unit vectors | nil, err
Calls the configured function once for all texts; its failure (an error
raised, or nil, err returned) and a malformed answer come back as nil, err. ]]
function _M.embed(index, texts)
  if #texts == 0 then return {} end
  local ok, vecs, err = pcall(index.embed, texts)
  if not ok then return nil, "store: embed failed: " .. tostring(vecs) end
  if vecs == nil then return nil, "store: embed failed: " .. tostring(err or "it returned nothing") end
  if type(vecs) ~= "table" or #vecs ~= #texts then
    return nil, format("store: embed returned %s for %d texts (expected a list of %d vectors)",
      type(vecs) == "table" and (#vecs .. " vectors") or type(vecs), #texts, #texts)
  end
  local dims = index.dims
  local out = {}
  for i = 1, #texts do
    local v = vecs[i]
    if type(v) ~= "table" or #v ~= dims then
      return nil, format("store: embed returned a vector of %s numbers for text %d (index.dims is %d)",
        type(v) == "table" and #v or type(v), i, dims)
    end
    for j = 1, dims do
      local x = v[j]
      if type(x) ~= "number" or x ~= x or x == math.huge or x == -math.huge then
        return nil, format("store: embed returned a non-finite or non-number component in vector %d", i)
      end
    end
    out[i] = normalise(v, dims)
  end
  return out
end

-- dot product of two unit vectors = their cosine similarity
function _M.dot(a, b, dims)
  local s = 0.0
  for i = 1, dims do s = s + a[i] * b[i] end
  return s
end

--[[ plan(index, ops) -> texts, puts_texts, queries
Which texts a batch needs embedded: for each put (in `puts`, deduplicated)
the range of its texts, and for each search with a query the position of
its query text. Returns the list of texts and a function that, given the
vectors, attaches `vectors` to each put and `qvec` to each search. ]]
function _M.plan(index, puts, searches)
  local texts, ranges, qpos = {}, {}, {}
  if not index then return texts, function() end end
  for i, op in ipairs(puts) do
    if op.kind == "put" and op.index ~= false then
      local t = _M.texts(op.value, op.index or index.paths)
      ranges[i] = { #texts + 1, #texts + #t }
      for _, x in ipairs(t) do texts[#texts + 1] = x end
    end
  end
  for i, op in ipairs(searches) do
    if op.query then
      texts[#texts + 1] = op.query
      qpos[i] = #texts
    end
  end
  return texts, function(vecs)
    for i, r in pairs(ranges) do
      local list = {}
      for j = r[1], r[2] do list[#list + 1] = vecs[j] end
      puts[i].vectors = list
    end
    for i, p in pairs(qpos) do searches[i].qvec = vecs[p] end
  end
end

return _M
