-- The offline intent model of the Eco² chat pipeline's intent node.
--
-- A multinomial naive Bayes model over binary features of a message: the
-- character 1-, 2- and 3-grams of every word, the word padded with
-- boundary marks (so "냉장고를" and "냉장고" share "<냉", "<냉장" and
-- "냉장고", and a one-syllable word "팔" is the trigram "<팔>"). It is
-- trained when it is loaded, from the labelled lines of data/intents.jsonl,
-- and returns per-class probabilities.
--
-- Calibration: raw naive Bayes posteriors are far too sure of themselves,
-- because overlapping n-grams count the same evidence several times. At load
-- the model scores training lines with each line left out (exact for naive
-- Bayes: subtract its own counts), then picks the softmax temperature that
-- minimises the log loss of those held-out scores. Probabilities are
-- softmax(log-joint / T), so a reported 0.8 is right about 80% of the time on
-- data like the training set.
--
-- An n-gram is kept as one integer (21 bits per code point, "<" = 1,
-- ">" = 2), which keeps training to a few milliseconds; feature_name()
-- turns one back into text.

local cjson = require "cjson"
local paths = require "moongraph.paths"
local filecache = require "moongraph.filecache"
local word_ngrams = require("moongraph.core").codepoints.word_ngrams

local uchar = utf8.char
local concat, sort = table.concat, table.sort
local log, exp, huge = math.log, math.exp, math.huge
local type, pairs, ipairs, error, setmetatable = type, pairs, ipairs, error, setmetatable

local _M = {}
local mt = { __index = _M }

-- The nine intents, in the order reports list them.
_M.INTENTS = {
  "waste", "character", "location", "bulk_waste", "recyclable_price",
  "collection_point", "web_search", "image_generation", "general",
}

local DEFAULTS = {
  alpha = 0.25,               -- additive smoothing of the feature counts
  char_ngrams = 3,            -- longest character n-gram
  char_min = 1,               -- shortest one
  calibration_sample = 400,   -- examples scored leave-one-out to fit the temperature
}

local SHIFT = 2097152         -- 2^21: room for any code point
local BEGIN, END = 1, 2       -- word boundary marks inside n-gram keys (as in C)

-- Code points that separate words besides ASCII other than letters and
-- digits: common full-width and typographic punctuation.
local SEPARATORS = concat {
  "？", "！", "，", "．", "。", "、", "…", "～", "〜", "·", "•", "—", "–",
  "“", "”", "‘", "’", "「", "」", "『", "』", "《", "》", "〈", "〉",
  "（", "）", "：", "；", "♡", "♥", "★", "☆", "\u{3000}",
}

-- The feature keys of a text, as an array without duplicates, in order of
-- first occurrence (the order scores add them in). Bytes that are not
-- valid UTF-8 separate words. One pass in C (runtime/codepoints.c).
local function features(text, nmin, nmax)
  return word_ngrams(text, nmin, nmax, SEPARATORS)
end

-- The feature keys of a text (see feature_name), for inspection.
function _M.features(text, opts)
  if type(text) ~= "string" then
    error("bad argument #1 to 'features': expected a string, got " .. type(text), 2)
  end
  local o = setmetatable(opts or {}, { __index = DEFAULTS })
  return features(text, o.char_min, o.char_ngrams)
end

-- The text of a feature key: "<냉장", "고>", "팔".
function _M.feature_name(key)
  local parts = {}
  while key > 0 do
    local c = key % SHIFT
    parts[#parts + 1] = c == BEGIN and "<" or c == END and ">" or uchar(c)
    key = key // SHIFT
  end
  local out = {}
  for i = #parts, 1, -1 do out[#out + 1] = parts[i] end
  return concat(out)
end

-- Labelled lines {message, intent, additional_intents?} of JSONL text read
-- from `path` (named in errors). -> list of decoded objects | nil, err
local function parse_jsonl(text, path)
  local out, n = {}, 0
  for line in (text .. "\n"):gmatch("(.-)\n") do
    n = n + 1
    if line:match("%S") then
      local ok, obj = pcall(cjson.decode, line)
      if not ok or type(obj) ~= "table" then
        return nil, path .. ":" .. n .. ": not a JSON object"
      end
      if type(obj.message) ~= "string" or type(obj.intent) ~= "string" then
        return nil, path .. ":" .. n .. ": needs string fields \"message\" and \"intent\""
      end
      obj.line = n
      out[#out + 1] = obj
    end
  end
  return out
end

-- The whole file (its size first: one allocation) | nil, err
local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local size, serr = f:seek("end")
  local text = size and f:seek("set") and (size == 0 and "" or f:read(size))
  f:close()
  if not text then return nil, path .. ": " .. tostring(serr or "cannot read") end
  return text
end

-- Read labelled lines {message, intent, additional_intents?} from a JSONL
-- file. Returns the list of decoded objects, or nil, err naming the line.
function _M.read_jsonl(path)
  local text, err = read_file(path)
  if not text then return nil, err end
  return parse_jsonl(text, path)
end

-- Lines that teach the classifier: single-intent ones. A line with
-- additional intents mixes two requests and would blur both classes.
local function training_examples(lines)
  local ex = {}
  for _, o in ipairs(lines) do
    local adds = o.additional_intents
    if type(adds) ~= "table" or #adds == 0 then
      ex[#ex + 1] = { text = o.message, label = o.intent }
    end
  end
  return ex
end
_M.training_examples = training_examples

-- softmax(s / t) of an array of scores, as a new array.
local function softmax(s, t)
  local m = -huge
  for j = 1, #s do if s[j] > m then m = s[j] end end
  local z, p = 0, {}
  for j = 1, #s do
    local e = exp((s[j] - m) / t)
    p[j] = e
    z = z + e
  end
  for j = 1, #s do p[j] = p[j] / z end
  return p
end

-- { log(count in label j + alpha) } of a feature's counts (the array has
-- at least nine entries, as the scoring loop of the nine intents reads).
local function log_counts(v, L, alpha)
  local la = log(alpha)
  local l = { la, la, la, la, la, la, la, la, la }
  for j = 1, L do
    local n = v[j]
    if n > 0 then l[j] = log(n + alpha) else l[j] = la end
  end
  return l
end

-- Train a model from examples {{text=, label=}, ...}. opts: alpha,
-- char_ngrams, char_min, calibration_sample, labels (defaults to INTENTS),
-- calibrate (default true: fit the temperature on leave-one-out scores).
--
-- The model keeps, per feature, the array of log(count in class + alpha)
-- over the labels, so scoring a text is one table look-up per feature.
function _M.train(examples, opts)
  if type(examples) ~= "table" then
    error("bad argument #1 to 'train': expected a list of examples", 2)
  end
  local o = setmetatable({}, { __index = DEFAULTS })
  for k, v in pairs(opts or {}) do o[k] = v end
  local labels = o.labels or _M.INTENTS
  local L = #labels
  local index = {}
  for j, c in ipairs(labels) do index[c] = j end

  -- cnt[f] = { count in label 1, ..., count in label L, examples with f }
  local cnt, total, docs = {}, {}, {}
  local vocab, D = 0, L + 1
  for j = 1, L do total[j], docs[j] = 0, 0 end
  local feats, ys = {}, {}
  for i, e in ipairs(examples) do
    local y = index[e.label]
    if not y then
      error("bad argument #1 to 'train': example " .. i .. " has unknown label '"
        .. tostring(e.label) .. "'", 2)
    end
    if type(e.text) ~= "string" then
      error("bad argument #1 to 'train': example " .. i .. " has no text", 2)
    end
    local fs = features(e.text, o.char_min, o.char_ngrams)
    feats[i], ys[i] = fs, y
    for _, f in ipairs(fs) do
      local v = cnt[f]
      if not v then
        v = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
        for j = 11, D do v[j] = 0 end
        cnt[f] = v
        vocab = vocab + 1
      end
      v[y] = v[y] + 1
      v[D] = v[D] + 1
    end
    total[y] = total[y] + #fs
    docs[y] = docs[y] + 1
  end
  for j = 1, L do
    if docs[j] == 0 then
      error("bad argument #1 to 'train': no example for label '" .. labels[j] .. "'", 2)
    end
  end
  local alpha = o.alpha
  -- lc[f] = { log(count in label j + alpha) }, computed on first use
  local lc = setmetatable({}, { __index = function(t, f)
    local v = cnt[f]
    if not v then return nil end
    local l = log_counts(v, L, alpha)
    t[f] = l
    return l
  end })
  local ndocs = #examples
  local av = alpha * vocab
  local ldenom, lprior = {}, {}
  for j = 1, L do
    ldenom[j] = log(total[j] + av)
    lprior[j] = log((docs[j] + 1) / (ndocs + L))
  end

  local self = setmetatable({
    labels = labels, index = index, opts = o, lc = lc, ldenom = ldenom,
    lprior = lprior, vocab = vocab, ndocs = ndocs, temperature = 1,
    counts = cnt,
  }, mt)

  if o.calibrate ~= false and ndocs > 1 then
    -- Leave-one-out log-joint scores of every training example (features
    -- seen in no other example carry no evidence), kept relative to the
    -- example's best score with the true label first.
    -- An evenly spread sample of at most calibration_sample examples is
    -- enough to pin one temperature down.
    local rel, correct = {}, 0
    local s = {}
    local step = math.max(1, ndocs / o.calibration_sample)
    local nsample = 0
    for x = 1, ndocs, step do
      local i = math.floor(x)
      nsample = nsample + 1
      local fs, y = feats[i], ys[i]
      for j = 1, L do s[j] = 0 end
      local nk, own = 0, 0
      for _, f in ipairs(fs) do
        local v = cnt[f]
        if v[D] > 1 then
          nk = nk + 1
          local l = lc[f]
          for j = 1, L do s[j] = s[j] + l[j] end
          own = own + log(v[y] - 1 + alpha) - l[y]
        end
      end
      for j = 1, L do
        if j == y then
          s[j] = s[j] + own + log(docs[j] / (ndocs - 1 + L))
            - nk * log(total[j] - #fs + av)
        else
          s[j] = s[j] + log((docs[j] + 1) / (ndocs - 1 + L)) - nk * ldenom[j]
        end
      end
      local m, best = -huge, nil
      for j = 1, L do if s[j] > m then m, best = s[j], j end end
      if best == y then correct = correct + 1 end
      local r = { s[y] - m }
      for j = 1, L do if j ~= y then r[#r + 1] = s[j] - m end end
      rel[nsample] = r
    end
    local function nll(t)
      local sum, inv = 0, 1 / t
      for i = 1, nsample do
        local r = rel[i]
        local z = 0
        for j = 1, L do z = z + exp(r[j] * inv) end
        sum = sum + log(z) - r[1] * inv
      end
      return sum
    end
    -- golden-section search for the temperature, on log T
    local a, b = log(0.5), log(200)
    local g = (math.sqrt(5) - 1) / 2
    local x1, x2 = b - g * (b - a), a + g * (b - a)
    local f1, f2 = nll(exp(x1)), nll(exp(x2))
    while b - a > 1e-2 do
      if f1 < f2 then
        b, x2, f2 = x2, x1, f1
        x1 = b - g * (b - a)
        f1 = nll(exp(x1))
      else
        a, x1, f1 = x1, x2, f2
        x2 = a + g * (b - a)
        f2 = nll(exp(x2))
      end
    end
    self.temperature = exp((a + b) / 2)
    self.loo_accuracy = correct / nsample
  end
  return self
end

-- Log-joint score of every label for a text, as an array in label order
-- (features unseen in training carry no evidence and are skipped).
function _M.scores(self, text)
  local fs = features(text, self.opts.char_min, self.opts.char_ngrams)
  local lc, L = self.lc, #self.labels
  local s, n
  if L == 9 then
    -- the nine intents: the sums in locals (same additions, same order)
    local s1, s2, s3, s4, s5, s6, s7, s8, s9 = 0, 0, 0, 0, 0, 0, 0, 0, 0
    n = 0
    for i = 1, #fs do
      local l = lc[fs[i]]
      if l then
        n = n + 1
        s1, s2, s3, s4, s5 = s1 + l[1], s2 + l[2], s3 + l[3], s4 + l[4], s5 + l[5]
        s6, s7, s8, s9 = s6 + l[6], s7 + l[7], s8 + l[8], s9 + l[9]
      end
    end
    s = { s1, s2, s3, s4, s5, s6, s7, s8, s9 }
  else
    s, n = {}, 0
    for j = 1, L do s[j] = 0 end
    for i = 1, #fs do
      local l = lc[fs[i]]
      if l then
        n = n + 1
        for j = 1, L do s[j] = s[j] + l[j] end
      end
    end
  end
  local lprior, ldenom = self.lprior, self.ldenom
  for j = 1, L do s[j] = s[j] + lprior[j] - n * ldenom[j] end
  return s, n
end

-- Calibrated probabilities of a text as an array in label order, the index
-- of the best label (of equal ones, the name that sorts first) and how
-- many of the text's features the model knows: predict() without a table
-- per label.
function _M.probabilities(self, text)
  if type(text) ~= "string" then
    error("bad argument #1 to 'probabilities': expected a string, got " .. type(text), 2)
  end
  local s, known = self:scores(text)
  local p = softmax(s, self.temperature)
  local labels, best = self.labels, 1
  for j = 2, #p do
    if p[j] > p[best] or (p[j] == p[best] and labels[j] < labels[best]) then best = j end
  end
  return p, best, known
end

-- Calibrated probabilities of a text: returns probs {label = p}, the labels
-- ranked best first {{intent=, p=}, ...}, and how many of the text's
-- features the model knows.
function _M.predict(self, text)
  if type(text) ~= "string" then
    error("bad argument #1 to 'predict': expected a string, got " .. type(text), 2)
  end
  local s, known = self:scores(text)
  local p = softmax(s, self.temperature)
  local probs, ranked = {}, {}
  for j, c in ipairs(self.labels) do
    probs[c] = p[j]
    ranked[j] = { intent = c, p = p[j] }
  end
  -- best first, ties by name: an insertion sort of the few labels, without
  -- a call per comparison
  for i = 2, #ranked do
    local e = ranked[i]
    local p, c = e.p, e.intent
    local k = i - 1
    while k >= 1 do
      local o = ranked[k]
      if o.p > p or (o.p == p and o.intent < c) then break end
      ranked[k + 1] = o
      k = k - 1
    end
    ranked[k + 1] = e
  end
  return probs, ranked, known
end

-- data/intents.jsonl beside the modules (moongraph.paths).
function _M.default_data_path()
  return paths.find("data/intents.jsonl") or "data/intents.jsonl"
end

------------------------------------------------------------------------
-- The model as bytes (kept between processes by moongraph.filecache)
------------------------------------------------------------------------

local MAGIC = "moongraph intent model 2\n"
local HASH_MUL = -7046029254386353131   -- 0x9E3779B97F4A7C15 (Fibonacci hashing)

-- The slot of feature f in a table of 2^bits slots, 0-based.
local function slot_of(f, bits)
  return (f * HASH_MUL) >> (64 - bits)
end

-- encode(model) -> bytes: the trained model's labels, settings, priors,
-- normalisers and temperature, and its feature counts: an open-addressing
-- hash table (linear probing) of {feature, offset} slots pointing at each
-- feature's non-zero counts, so a loaded model reads only the features it
-- is asked about.
function _M.encode(self)
  local cnt = self.counts
  if type(cnt) ~= "table" then
    error("bad argument #1 to 'encode': a model made by train() expected", 2)
  end
  local L, o = #self.labels, self.opts
  local keys, maxc = {}, 0
  for f, v in pairs(cnt) do
    keys[#keys + 1] = f
    for j = 1, L do if v[j] > maxc then maxc = v[j] end end
  end
  sort(keys)
  local bits = 4
  while (1 << bits) < 2 * #keys do bits = bits + 1 end
  local size = 1 << bits
  local width = maxc < 65536 and 2 or 4
  local cfmt = "I" .. width
  -- the counts area: per feature, how many labels have a count, then
  -- {label, count} for each
  local records, at, offset = {}, 1, {}
  for i, f in ipairs(keys) do
    local v, pairs_ = cnt[f], { "" }
    local k = 0
    for j = 1, L do
      if v[j] > 0 then
        k = k + 1
        pairs_[#pairs_ + 1] = string.pack("<B" .. cfmt, j, v[j])
      end
    end
    pairs_[1] = string.pack("<B", k)
    records[i] = concat(pairs_)
    offset[f] = at
    at = at + #records[i]
  end
  local slots = {}
  for _, f in ipairs(keys) do
    local i = slot_of(f, bits)
    while slots[i] do i = (i + 1) & (size - 1) end
    slots[i] = f
  end
  local empty = string.pack("<i8I4", 0, 0)
  local table_ = {}
  for i = 0, size - 1 do
    local f = slots[i]
    table_[i + 1] = f and string.pack("<i8I4", f, offset[f]) or empty
  end
  local head = { MAGIC, string.pack("<I2", L) }
  for _, c in ipairs(self.labels) do head[#head + 1] = string.pack("<s1", c) end
  head[#head + 1] = string.pack("<ddI2I2I4I4dB", o.alpha, self.temperature, o.char_min,
    o.char_ngrams, self.vocab, self.ndocs, self.loo_accuracy or 0, self.loo_accuracy and 1 or 0)
  for j = 1, L do head[#head + 1] = string.pack("<dd", self.ldenom[j], self.lprior[j]) end
  head[#head + 1] = string.pack("<BBI4", width, bits, at - 1)
  return concat(head) .. concat(table_) .. concat(records)
end

-- Unknown features remembered per loaded model before the memory of them
-- starts over (a long-running process sees endless new n-grams).
local MAX_UNKNOWN = 65536

-- decode(bytes) -> model | nil, err: a model made by encode(); scores are
-- bit for bit those of the model that was encoded.
function _M.decode(bytes)
  if type(bytes) ~= "string" or bytes:sub(1, #MAGIC) ~= MAGIC then
    return nil, "not an encoded intent model"
  end
  local ok, self = pcall(function()
    local unpack = string.unpack
    local L, pos = unpack("<I2", bytes, #MAGIC + 1)
    local labels, index = {}, {}
    for j = 1, L do
      labels[j], pos = unpack("<s1", bytes, pos)
      index[labels[j]] = j
    end
    local alpha, temperature, char_min, char_ngrams, vocab, ndocs, loo, has_loo
    alpha, temperature, char_min, char_ngrams, vocab, ndocs, loo, has_loo, pos =
      unpack("<ddI2I2I4I4dB", bytes, pos)
    local ldenom, lprior = {}, {}
    for j = 1, L do ldenom[j], lprior[j], pos = unpack("<dd", bytes, pos) end
    local width, bits, area
    width, bits, area, pos = unpack("<BBI4", bytes, pos)
    local size = 1 << bits
    local base = pos                    -- slot i (0-based) at base + 12 * i
    local counts = base + 12 * size - 1 -- a record's offset is relative to this
    if #bytes ~= counts + area then error("truncated", 0) end
    local pair = "<BI" .. width
    local o = setmetatable({ alpha = alpha, char_min = char_min, char_ngrams = char_ngrams },
      { __index = DEFAULTS })
    local model = setmetatable({
      labels = labels, index = index, opts = o, ldenom = ldenom, lprior = lprior,
      vocab = vocab, ndocs = ndocs, temperature = temperature,
      loo_accuracy = has_loo == 1 and loo or nil,
    }, mt)
    local unknown = 0
    local lc_mt = {}
    lc_mt.__index = function(t, f)
      if math.type(f) ~= "integer" or f <= 0 then return nil end
      local i = slot_of(f, bits)
      for _ = 1, size do
        local k, off = unpack("<i8I4", bytes, base + 12 * i)
        if k == f then
          local v = { 0, 0, 0, 0, 0, 0, 0, 0, 0 }
          for j = 10, L do v[j] = 0 end
          local n, at = unpack("<B", bytes, counts + off)
          for _ = 1, n do
            local j, c
            j, c, at = unpack(pair, bytes, at)
            v[j] = c
          end
          local l = log_counts(v, L, alpha)
          t[f] = l
          return l
        elseif k == 0 then
          break
        end
        i = (i + 1) & (size - 1)
      end
      -- remembered as absent, within bounds
      unknown = unknown + 1
      if unknown > MAX_UNKNOWN then
        unknown = 0
        model.lc = setmetatable({}, lc_mt)
      else
        t[f] = false
      end
      return nil
    end
    model.lc = setmetatable({}, lc_mt)
    return model
  end)
  if not ok then return nil, "damaged intent model: " .. tostring(self) end
  return self
end

local default_model

-- The model trained from data/intents.jsonl, built on first use and kept.
-- Training takes tens of milliseconds, so the trained model is also kept
-- in a file (moongraph.filecache) that later processes load instead; it is
-- used only while data/intents.jsonl and this file's code are byte for byte
-- the ones it was trained with. model.cache says how it was obtained ("hit",
-- "built", ...). Returns nil, err when the data file cannot be read.
function _M.default()
  if default_model then return default_model end
  local path = _M.default_data_path()
  local text, err = read_file(path)
  if not text then return nil, "intent data: " .. err end
  local function build()
    local lines, lerr = parse_jsonl(text, path)
    if not lines then return nil, lerr end
    return _M.encode(_M.train(training_examples(lines)))
  end
  local bytes, how
  local source = filecache.source_of(_M.train)
  if source then
    bytes, how = filecache.fetch { name = "intent_model", key = path,
                                  inputs = { MAGIC, text, source }, build = build }
  else
    bytes, how = build()
    how = bytes and "built, own source unreadable" or how
  end
  if not bytes then return nil, "intent data: " .. how end
  local model, derr = _M.decode(bytes)
  if not model then return nil, derr end
  model.cache = how
  default_model = model
  return default_model
end

-- Forget the default model, so the next default() retrains from the file
-- (after editing data/intents.jsonl at the REPL).
function _M.reset()
  default_model = nil
end

return _M
