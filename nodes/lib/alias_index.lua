-- An index of normalised aliases (item names and their other names) by
-- exact text and by character bigram, kept as one string so that it can be
-- stored in a file (moongraph.filecache) and opened without rebuilding: a
-- process reads only the parts of it that its queries touch.
--
--   local bytes = alias_index.encode{ {entry = 3, text = "페트병"}, ... }
--   local ix = assert(alias_index.open(bytes))
--   ix:with_text("페트병")  -> { alias, ... } | nil   (in alias order)
--   ix:with_gram("페트")    -> { {alias, count}, ... } | nil (count: times
--                              the bigram occurs in the alias)
--   ix:alias(i)            -> alias
--   ix.count               -> number of aliases
--
-- alias = { id, entry, text, len (characters), ngrams (bigrams), stop (the
-- text is a stop word), ascii (no byte above 127) }. What the lookups
-- return is shared between callers: read it, do not change it.
--
-- Bigrams are korean.bigrams' (a one-character text is its own bigram).
-- An alias is decoded once and kept (the index's own records, never what
-- was asked); a lookup reads the hash table each time, so what a process
-- has been asked before makes no difference to what a lookup costs.
local korean = require "nodes.lib.korean"

local byte, pack, unpack, concat = string.byte, string.pack, string.unpack, table.concat
local type, ipairs, error, setmetatable, pcall, tostring = type, ipairs, error, setmetatable, pcall, tostring

local _M = {}

local MAGIC = "moongraph alias index 1\n"

-- FNV-1a (32 bits) of a string: the hash of the lookup tables.
local function fnv1a(s)
  local h = 0x811c9dc5
  for i = 1, #s do
    h = ((h ~ byte(s, i)) * 0x01000193) & 0xffffffff
  end
  return h
end

local function bits_for(n)
  local bits = 2
  while (1 << bits) < 2 * n do bits = bits + 1 end
  return bits
end

-- An open-addressing table (linear probing) of `keys` -> offsets, as
-- 2^bits I4 slots (0: empty). offset_of(key) is the key's entry.
local function hash_table(keys, bits, offset_of)
  local size = 1 << bits
  local slots = {}
  for _, k in ipairs(keys) do
    local i = fnv1a(k) & (size - 1)
    while slots[i] do i = (i + 1) & (size - 1) end
    slots[i] = offset_of[k]
  end
  local out = {}
  for i = 0, size - 1 do out[i + 1] = pack("<I4", slots[i] or 0) end
  return concat(out)
end

-- encode(list) -> bytes. list: { {entry = n, text = s}, ... } in alias
-- order (entry: a positive integer the caller gives meaning to).
function _M.encode(list)
  if type(list) ~= "table" then
    error("bad argument #1 to 'encode': list of {entry, text} expected", 2)
  end
  local records, by_text, by_gram, texts, grams = {}, {}, {}, {}, {}
  for i, a in ipairs(list) do
    local t = a.text
    if type(t) ~= "string" or type(a.entry) ~= "number" then
      error("bad argument #1 to 'encode': alias " .. i .. " needs a numeric entry and a text", 2)
    end
    local counts, n, order = {}, 0, {}
    for _, g in ipairs(korean.bigrams(t)) do
      if not counts[g] then order[#order + 1] = g end
      counts[g] = (counts[g] or 0) + 1
      n = n + 1
    end
    local flags = (korean.stopwords[t] and 1 or 0) | (t:find("[\128-\255]") and 0 or 2)
    records[i] = pack("<I4I4I4Bs4", a.entry, korean.len(t), n, flags, t)
    if by_text[t] then
      local l = by_text[t]
      l[#l + 1] = i
    else
      by_text[t] = { i }
      texts[#texts + 1] = t
    end
    for _, g in ipairs(order) do
      if by_gram[g] then
        local l = by_gram[g]
        l[#l + 1] = i
        l[#l + 1] = counts[g]
      else
        by_gram[g] = { i, counts[g] }
        grams[#grams + 1] = g
      end
    end
  end
  local A = #records
  local tbits, gbits = bits_for(#texts), bits_for(#grams)
  -- layout: header, alias offsets, alias records, text table, text
  -- entries, gram table, gram entries; every offset is a position in bytes
  local head_len = #MAGIC + 4 * 3 + 2 + 4 * 2
  local pos = head_len + 4 * A + 1
  local alias_at = {}
  for i, r in ipairs(records) do alias_at[i] = pack("<I4", pos); pos = pos + #r end
  local text_table = pos
  pos = pos + 4 * (1 << tbits)
  local text_at, text_entries = {}, {}
  for k, t in ipairs(texts) do
    local ids = by_text[t]
    local e = { pack("<s4I4", t, #ids) }
    for _, id in ipairs(ids) do e[#e + 1] = pack("<I4", id) end
    text_entries[k] = concat(e)
    text_at[t] = pos
    pos = pos + #text_entries[k]
  end
  local gram_table = pos
  pos = pos + 4 * (1 << gbits)
  local gram_at, gram_entries = {}, {}
  for k, g in ipairs(grams) do
    local l = by_gram[g]
    local e = { pack("<s4I4", g, #l // 2) }
    for j = 1, #l, 2 do e[#e + 1] = pack("<I4I4", l[j], l[j + 1]) end
    gram_entries[k] = concat(e)
    gram_at[g] = pos
    pos = pos + #gram_entries[k]
  end
  local out = concat {
    MAGIC, pack("<I4I4I4BBI4I4", A, #texts, #grams, tbits, gbits, text_table, gram_table),
    concat(alias_at), concat(records),
    hash_table(texts, tbits, text_at), concat(text_entries),
    hash_table(grams, gbits, gram_at), concat(gram_entries),
  }
  if #out ~= pos - 1 then error("alias_index: internal layout error", 0) end
  return out
end

local ix_mt = {}
ix_mt.__index = ix_mt

-- open(bytes) -> index | nil, err
function _M.open(bytes)
  if type(bytes) ~= "string" or bytes:sub(1, #MAGIC) ~= MAGIC then
    return nil, "not an alias index"
  end
  local ok, ix = pcall(function()
    local A, _, _, tbits, gbits, text_table, gram_table, pos =
      unpack("<I4I4I4BBI4I4", bytes, #MAGIC + 1)
    local aliases_at = pos
    if text_table < aliases_at + 4 * A or gram_table + 4 * (1 << gbits) > #bytes + 1 then
      error("truncated", 0)
    end
    return setmetatable({
      bytes = bytes, count = A, aliases_at = aliases_at,
      text_table = text_table, tbits = tbits, gram_table = gram_table, gbits = gbits,
      aliases = {},
    }, ix_mt)
  end)
  if not ok then return nil, "damaged alias index: " .. tostring(ix) end
  return ix
end

function ix_mt:alias(i)
  local al = self.aliases[i]
  if al then return al end
  if type(i) ~= "number" or i < 1 or i > self.count then return nil end
  local bytes = self.bytes
  local at = unpack("<I4", bytes, self.aliases_at + 4 * (i - 1))
  local entry, len, ngrams, flags, text = unpack("<I4I4I4Bs4", bytes, at)
  al = { id = i, entry = entry, text = text, len = len, ngrams = ngrams,
         stop = flags & 1 == 1, ascii = flags & 2 == 2 }
  self.aliases[i] = al
  return al
end

-- The entry position of key in a table of 2^bits slots at `table`, or nil.
local function find_entry(bytes, tbl, bits, key)
  local size = 1 << bits
  local i = fnv1a(key) & (size - 1)
  for _ = 1, size do
    local at = unpack("<I4", bytes, tbl + 4 * i)
    if at == 0 then return nil end
    local k, n, p = unpack("<s4I4", bytes, at)
    if k == key then return n, p end
    i = (i + 1) & (size - 1)
  end
  return nil
end

function ix_mt:with_text(t)
  local n, p = find_entry(self.bytes, self.text_table, self.tbits, t)
  if not n then return nil end
  local out = {}
  for k = 1, n do out[k] = self:alias((unpack("<I4", self.bytes, p + 4 * (k - 1)))) end
  return out
end

function ix_mt:with_gram(g)
  local n, p = find_entry(self.bytes, self.gram_table, self.gbits, g)
  if not n then return nil end
  local out = {}
  for k = 1, n do
    local id, count = unpack("<I4I4", self.bytes, p + 8 * (k - 1))
    out[k] = { self:alias(id), count }
  end
  return out
end

return _M
