-- summarize: context compression of the conversation history, the last
-- node of every turn.
--
-- The history (`messages`) is measured with the Korean-aware token estimate
-- of nodes/lib/tokens.lua. Under `trigger_tokens` nothing changes. Over it,
-- the history is cut into turns (a user message and the replies after it)
-- and each turn is kept according to its age, in five tiers:
--
--   immediate   the newest 5 turns            kept verbatim
--   recent      the 20 turns before them      question and the answer's gist
--   session     the 100 turns before those    the question, shortened
--   archive     the 500 turns before those    key words per intent
--   forgotten   everything older              metadata only (count, intents)
--
-- and, whatever their tier, the newest turns whose tokens fit in
-- `prune_protect` stay verbatim too. Compressed turns live in
-- state.summary (records and a rendered text the answer node passes to the
-- LLM); every later compression re-tiers them by their new age, so a turn
-- only ever loses detail. `messages` is rewritten to the verbatim turns.
--
-- Configuration: ctx.config.summarize = { trigger_tokens =, prune_protect =,
-- tiers = { {name, size}, ... } }, else the environment
-- (MOONGRAPH_SUMMARIZE_TRIGGER_TOKENS, MOONGRAPH_SUMMARIZE_PRUNE_PROTECT),
-- else the defaults below.
local tokens = require "nodes.lib.tokens"
local korean = require "nodes.lib.korean"

local type, ipairs, pairs, tonumber = type, ipairs, pairs, tonumber
local concat, sort, huge, max = table.concat, table.sort, math.huge, math.max
local os = os

local _M = {
  name = "summarize",
  policy = "fail_close",
  timeout = 30,
}

_M.defaults = {
  trigger_tokens = 272000,
  prune_protect = 40000,
  tiers = {
    { "immediate", 5 },
    { "recent", 20 },
    { "session", 100 },
    { "archive", 500 },
    { "forgotten", huge },
  },
  recent_question_chars = 160,
  recent_answer_chars = 240,
  session_question_chars = 60,
  archive_keys = 3,
}

local reducers = require "moongraph.reducers"
local REMOVE_ALL = reducers.remove(reducers.REMOVE_ALL)

local TIER_NAMES = { "immediate", "recent", "session", "archive", "forgotten" }

-- The settings for one run: ctx.config.summarize, then the environment,
-- then the defaults.
function _M.settings(ctx)
  local over = ctx and type(ctx.config) == "table" and ctx.config.summarize or {}
  if type(over) ~= "table" then
    error("bad argument #2 to 'run': config.summarize must be a table", 2)
  end
  local d = _M.defaults
  local s = {}
  for k, v in pairs(d) do s[k] = v end
  s.trigger_tokens = over.trigger_tokens
    or tonumber(os.getenv("MOONGRAPH_SUMMARIZE_TRIGGER_TOKENS") or "") or d.trigger_tokens
  s.prune_protect = over.prune_protect
    or tonumber(os.getenv("MOONGRAPH_SUMMARIZE_PRUNE_PROTECT") or "") or d.prune_protect
  if over.tiers ~= nil then
    local t = over.tiers
    if type(t) ~= "table" or #t ~= #TIER_NAMES then
      error("summarize: tiers must list the five tiers {name, size} in order", 0)
    end
    for i, name in ipairs(TIER_NAMES) do
      if type(t[i]) ~= "table" or t[i][1] ~= name or type(t[i][2]) ~= "number" or t[i][2] < 1 then
        error(("summarize: tier %d must be {\"%s\", size >= 1}"):format(i, name), 0)
      end
    end
    s.tiers = t
  end
  if type(s.trigger_tokens) ~= "number" or s.trigger_tokens < 0 then
    error("summarize: trigger_tokens must be a non-negative number", 0)
  end
  if type(s.prune_protect) ~= "number" or s.prune_protect < 0 then
    error("summarize: prune_protect must be a non-negative number", 0)
  end
  return s
end

-- Pure: age ranges of the tiers, { {name, from, to}, ... } (ages count from
-- 1 = the newest turn; `to` is math.huge for the last tier).
function _M.ranges(tiers)
  local out, from = {}, 1
  for _, t in ipairs(tiers) do
    local to = t[2] == huge and huge or from + t[2] - 1
    out[#out + 1] = { t[1], from, to }
    from = to + 1
  end
  return out
end

local function tier_of(ranges, age)
  for _, r in ipairs(ranges) do
    if age >= r[2] and age <= r[3] then return r[1] end
  end
  return ranges[#ranges][1]
end

local function clip(s, n)
  if type(s) ~= "string" then return "" end
  s = s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
  if (utf8.len(s) or #s) <= n then return s end
  local cut = utf8.offset(s, n + 1) or (n + 1)
  return s:sub(1, cut - 1) .. "…"
end

-- The gist of an answer: its text without labels, headings and notices.
local function gist(answer)
  local keep = {}
  for line in ((answer or "") .. "\n"):gmatch("(.-)\n") do
    if line:find("%S") and not line:find("^%s*[%[■※]") then keep[#keep + 1] = line end
  end
  return concat(keep, " ")
end

-- Pure: the history as turns { {n=, messages={...}, tokens=, user=, answer=, intent=} }.
function _M.turns(messages)
  local out, cur = {}, nil
  local seq = 0
  for _, m in ipairs(messages) do
    if type(m) == "table" then
      if m.role == "user" or not cur then
        seq = (type(m.turn) == "number" and m.turn) or seq + 1
        cur = { n = seq, messages = {}, tokens = 0 }
        out[#out + 1] = cur
      end
      local ms = cur.messages
      ms[#ms + 1] = m
      local content = type(m.content) == "string" and m.content or ""
      cur.tokens = cur.tokens + tokens.estimate(content) + tokens.per_message
      if m.role == "user" and not cur.user then
        cur.user, cur.intent = content, m.intent
      elseif m.role == "assistant" then
        cur.answer = content
      end
    end
  end
  return out
end

local function keys_of(text, n)
  local out = {}
  for _, t in ipairs(korean.content_tokens(text or "")) do
    local v = t.variants[#t.variants]
    if v ~= "" then out[#out + 1] = v end
    if #out >= n then break end
  end
  return out
end

-- A record of a turn at a tier (the richest form degrades with age).
local function record(rec, tier, s)
  local r = { n = rec.n, intent = rec.intent, tier = tier }
  if tier == "recent" or tier == "immediate" then
    r.q = clip(rec.q or rec.user, s.recent_question_chars)
    r.a = rec.a or clip(gist(rec.answer), s.recent_answer_chars)
  elseif tier == "session" then
    r.q = clip(rec.q or rec.user, s.session_question_chars)
  else
    r.keys = rec.keys or keys_of(rec.q or rec.user, s.archive_keys)
  end
  return r
end

-- Pure: the summary's text.
function _M.render(summary, ranges)
  local by = {}
  for _, r in ipairs(summary.records) do
    by[r.tier] = by[r.tier] or {}
    local l = by[r.tier]
    l[#l + 1] = r
  end
  local label = {}
  for _, rg in ipairs(ranges) do label[rg[1]] = rg end
  local function span(name)
    local rg = label[name]
    if not rg then return "" end
    if rg[3] == huge then return ("%d턴 전 이전"):format(rg[2]) end
    return ("%d~%d턴 전"):format(rg[2], rg[3])
  end
  local lines = { ("[이전 대화 요약: 전체 %d턴 중 압축된 %d턴]"):format(summary.turns,
    summary.tiers.recent.count + summary.tiers.session.count + summary.tiers.archive.count
      + summary.tiers.forgotten.count) }
  if by.recent then
    lines[#lines + 1] = "최근 (" .. span("recent") .. "):"
    for _, r in ipairs(by.recent) do
      lines[#lines + 1] = ("- %d턴 [%s] Q: %s / A: %s"):format(r.n, r.intent or "?", r.q, r.a or "")
    end
  end
  if by.session then
    lines[#lines + 1] = "세션 (" .. span("session") .. "):"
    for _, r in ipairs(by.session) do
      lines[#lines + 1] = ("- %d턴 [%s] %s"):format(r.n, r.intent or "?", r.q)
    end
  end
  if by.archive then
    local per, order = {}, {}
    for _, r in ipairs(by.archive) do
      local k = r.intent or "?"
      if not per[k] then per[k] = { n = 0, keys = {}, seen = {} }; order[#order + 1] = k end
      local p = per[k]
      p.n = p.n + 1
      for _, w in ipairs(r.keys or {}) do
        if not p.seen[w] and #p.keys < 12 then p.seen[w] = true; p.keys[#p.keys + 1] = w end
      end
    end
    lines[#lines + 1] = "보관 (" .. span("archive") .. "), 키포인트:"
    for _, k in ipairs(order) do
      lines[#lines + 1] = ("- %s %d턴: %s"):format(k, per[k].n, concat(per[k].keys, ", "))
    end
  end
  local f = summary.forgotten
  if f and f.turns > 0 then
    local parts = {}
    local names = {}
    for k in pairs(f.intents) do names[#names + 1] = k end
    sort(names, function(a, b)
      if f.intents[a] ~= f.intents[b] then return f.intents[a] > f.intents[b] end
      return a < b
    end)
    for _, k in ipairs(names) do parts[#parts + 1] = k .. " " .. f.intents[k] end
    lines[#lines + 1] = ("잊힘 (%s): %d~%d턴, %d턴 (%s)"):format(span("forgotten"),
      f.first, f.last, f.turns, concat(parts, ", "))
  end
  return concat(lines, "\n")
end

-- Pure: compress a history. state: { messages, summary, turn }; s: settings.
-- Returns the new summary and the list of verbatim messages kept.
function _M.compress(state, s)
  local ranges = _M.ranges(s.tiers)
  local turns = _M.turns(state.messages or {})
  local total = type(state.turn) == "number" and state.turn or 0
  for _, t in ipairs(turns) do if t.n > total then total = t.n end end

  -- verbatim: the immediate tier and the protected newest tokens
  local immediate = ranges[1][3]
  local keep_from = #turns + 1
  local used = 0
  for i = #turns, 1, -1 do
    local t = turns[i]
    local age = total - t.n + 1
    used = used + t.tokens
    if age <= immediate or used <= s.prune_protect then keep_from = i else break end
  end
  local protected_turns = 0
  used = 0
  for i = #turns, 1, -1 do
    used = used + turns[i].tokens
    if used <= s.prune_protect then protected_turns = protected_turns + 1 else break end
  end

  local old = type(state.summary) == "table" and state.summary or {}
  local recs = {}
  for _, r in ipairs(old.records or {}) do recs[#recs + 1] = r end
  for i = 1, keep_from - 1 do
    local t = turns[i]
    recs[#recs + 1] = { n = t.n, intent = t.intent, user = t.user, answer = t.answer }
  end
  local forgotten = { turns = 0, intents = {} }
  local of = old.forgotten
  if type(of) == "table" and (of.turns or 0) > 0 then
    forgotten.turns, forgotten.first, forgotten.last = of.turns, of.first, of.last
    for k, v in pairs(of.intents or {}) do forgotten.intents[k] = v end
  end
  local records = {}
  local counts = {}
  for _, rg in ipairs(ranges) do counts[rg[1]] = { count = 0 } end
  local last_name = ranges[#ranges][1]
  for _, r in ipairs(recs) do
    local age = total - r.n + 1
    local tier = tier_of(ranges, age)
    if tier == ranges[1][1] then tier = ranges[2] and ranges[2][1] or tier end
    local c = counts[tier]
    c.count = c.count + 1
    c.from = c.from and math.min(c.from, r.n) or r.n
    c.to = c.to and max(c.to, r.n) or r.n
    if tier == last_name then
      forgotten.turns = forgotten.turns + 1
      forgotten.first = forgotten.first and math.min(forgotten.first, r.n) or r.n
      forgotten.last = forgotten.last and max(forgotten.last, r.n) or r.n
      local k = r.intent or "?"
      forgotten.intents[k] = (forgotten.intents[k] or 0) + 1
    else
      records[#records + 1] = record(r, tier, s)
    end
  end
  -- earlier forgotten turns count in the forgotten tier too
  if type(of) == "table" and (of.turns or 0) > 0 then
    local c = counts[last_name]
    c.count = c.count + of.turns
    c.from = c.from and math.min(c.from, of.first) or of.first
    c.to = c.to and max(c.to, of.last) or of.last
  end
  sort(records, function(a, b) return a.n > b.n end)

  local kept = {}
  local verbatim = counts[ranges[1][1]]
  for i = keep_from, #turns do
    local t = turns[i]
    for _, m in ipairs(t.messages) do kept[#kept + 1] = m end
    verbatim.count = verbatim.count + 1
    verbatim.from = verbatim.from and math.min(verbatim.from, t.n) or t.n
    verbatim.to = verbatim.to and max(verbatim.to, t.n) or t.n
  end

  local summary = {
    turns = total,
    compressed_at = total,
    tiers = counts,
    records = records,
    forgotten = forgotten,
    protected = { turns = protected_turns, tokens = s.prune_protect },
  }
  summary.text = _M.render(summary, ranges)
  return summary, kept
end

function _M.run(state, ctx)
  local s = _M.settings(ctx)
  local messages = type(state.messages) == "table" and state.messages or {}
  local summary = type(state.summary) == "table" and state.summary or nil
  local before = tokens.messages(messages)
    + (summary and type(summary.text) == "string" and tokens.estimate(summary.text) or 0)
  if before <= s.trigger_tokens then
    return { context_tokens = before }
  end
  local new, kept = _M.compress(state, s)
  local after = tokens.messages(kept) + tokens.estimate(new.text)
  new.tokens_before, new.tokens_after = before, after
  local update = { REMOVE_ALL }
  for _, m in ipairs(kept) do update[#update + 1] = m end
  if ctx and ctx.emit then
    ctx.emit { type = "log", node = "summarize",
      text = ("compressed %d tokens to %d (trigger %d): verbatim %d turns, recent %d, session %d, archive %d, forgotten %d")
        :format(before, after, s.trigger_tokens, new.tiers.immediate and new.tiers.immediate.count or 0,
          new.tiers.recent and new.tiers.recent.count or 0, new.tiers.session and new.tiers.session.count or 0,
          new.tiers.archive and new.tiers.archive.count or 0, new.tiers.forgotten and new.tiers.forgotten.count or 0) }
  end
  return { messages = update, summary = new, context_tokens = after }
end

return _M
