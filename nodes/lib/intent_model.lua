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

local codes, uchar, ulen, codepoint = utf8.codes, utf8.char, utf8.len, utf8.codepoint
local sub = string.sub
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
local BEGIN, END = 1, 2       -- word boundary marks inside n-gram keys

-- Code points that separate words: ASCII other than letters and digits,
-- and common full-width and typographic punctuation.
local SEPARATOR = {}
for c = 0, 127 do
  if not string.char(c):match("%w") then SEPARATOR[c] = true end
end
for _, ch in ipairs{
  "？", "！", "，", "．", "。", "、", "…", "～", "〜", "·", "•", "—", "–",
  "“", "”", "‘", "’", "「", "」", "『", "』", "《", "》", "〈", "〉",
  "（", "）", "：", "；", "♡", "♥", "★", "☆", "\u{3000}",
} do
  SEPARATOR[utf8.codepoint(ch)] = true
end

-- Replace every byte that is not part of valid UTF-8 with a space.
local function valid_utf8(text)
  while true do
    local n, bad = ulen(text)
    if n then return text end
    text = sub(text, 1, bad - 1) .. " " .. sub(text, bad + 1)
  end
end

-- Texts up to this many bytes are decoded with one utf8.codepoint call.
local CODEPOINTS_AT_ONCE = 4096

-- The feature keys of a text, as an array without duplicates.
local function features(text, nmin, nmax)
  local seen, list, k = {}, {}, 0
  local w, n = {}, 0
  local function flush()
    if n == 0 then return end
    w[0], w[n + 1] = BEGIN, END
    for i = 0, n + 1 do
      local a = w[i]
      if nmin <= 1 and i >= 1 and i <= n and not seen[a] then
        seen[a] = true; k = k + 1; list[k] = a
      end
      if i <= n then
        local f = a * SHIFT + w[i + 1]
        if nmin <= 2 and nmax >= 2 and not seen[f] then
          seen[f] = true; k = k + 1; list[k] = f
        end
        if nmax >= 3 and i < n then
          f = f * SHIFT + w[i + 2]
          if not seen[f] then seen[f] = true; k = k + 1; list[k] = f end
        end
      end
    end
    n = 0
  end
  text = valid_utf8(text)
  if #text <= CODEPOINTS_AT_ONCE then
    -- a short text's code points in one table: cheaper than codes()
    local cs = { codepoint(text, 1, -1) }
    for j = 1, #cs do
      local c = cs[j]
      if SEPARATOR[c] then
        flush()
      else
        if c >= 65 and c <= 90 then c = c + 32 end  -- ASCII lower case
        n = n + 1
        w[n] = c
      end
    end
  else
    for _, c in codes(text) do
      if SEPARATOR[c] then
        flush()
      else
        if c >= 65 and c <= 90 then c = c + 32 end  -- ASCII lower case
        n = n + 1
        w[n] = c
      end
    end
  end
  flush()
  return list
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

-- Read labelled lines {message, intent, additional_intents?} from a JSONL
-- file. Returns the list of decoded objects, or nil, err naming the line.
function _M.read_jsonl(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local out, n = {}, 0
  for line in f:lines() do
    n = n + 1
    if line:match("%S") then
      local ok, obj = pcall(cjson.decode, line)
      if not ok or type(obj) ~= "table" then
        f:close()
        return nil, path .. ":" .. n .. ": not a JSON object"
      end
      if type(obj.message) ~= "string" or type(obj.intent) ~= "string" then
        f:close()
        return nil, path .. ":" .. n .. ": needs string fields \"message\" and \"intent\""
      end
      obj.line = n
      out[#out + 1] = obj
    end
  end
  f:close()
  return out
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
  local la = log(alpha)
  -- lc[f] = { log(count in label j + alpha) }, computed on first use
  local lc = setmetatable({}, { __index = function(t, f)
    local v = cnt[f]
    if not v then return nil end
    local l = { la, la, la, la, la, la, la, la, la }
    for j = 1, L do
      local n = v[j]
      if n > 0 then l[j] = log(n + alpha) else l[j] = la end
    end
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
  sort(ranked, function(x, y)
    if x.p ~= y.p then return x.p > y.p end
    return x.intent < y.intent
  end)
  return probs, ranked, known
end

-- data/intents.jsonl beside the modules (moongraph.paths).
function _M.default_data_path()
  return paths.find("data/intents.jsonl") or "data/intents.jsonl"
end

local default_model

-- The model trained from data/intents.jsonl, built on first use and kept.
-- Returns nil, err when the data file cannot be read.
function _M.default()
  if default_model then return default_model end
  local lines, err = _M.read_jsonl(_M.default_data_path())
  if not lines then return nil, "intent data: " .. err end
  default_model = _M.train(training_examples(lines))
  return default_model
end

-- Forget the default model, so the next default() retrains from the file
-- (after editing data/intents.jsonl at the REPL).
function _M.reset()
  default_model = nil
end

return _M
