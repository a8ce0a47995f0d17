-- Why a message goes where it goes: classification plus routing, told as
-- lines a person reads (`moongraph route`) and as one JSON object.
--
-- explain(message, opts) -> lines, object | nil, err (no classifier data)
--   opts.prev_intent  previous turn's intent
--   opts.location     the user's location (state.user_location)
--   opts.json         append the object, encoded on one line, as the last line
--   opts.llm, opts.cache, opts.model   passed to routing.classify
--   opts.router       router options (routing.new_router), or opts.route (a route function)
-- object = { intent, additional_intents, confidence, nodes (sorted), sends,
--            is_multi, complexity, source, fallback_reason }

local routing = require "scripts.eco.routing"
local json = require "moongraph.json"

local format, rep, concat, sort = string.format, string.rep, table.concat, table.sort
local ipairs, pairs, type, error = ipairs, pairs, type, error

local _M = {}

local function pct_bar(p, width)
  local n = math.floor(p * width + 0.5)
  return rep("#", n) .. rep(".", width - n)
end

local function signed(x)
  return format("%+.2f", x)
end

-- Classify and route a message. Returns the explanation lines and the
-- decision object, or nil, err when the message cannot be classified.
function _M.explain(message, opts)
  if type(message) ~= "string" then
    error("bad argument #1 to 'explain': expected a string, got " .. type(message), 2)
  end
  opts = opts or {}
  local res, err = routing.classify(message, {
    prev_intent = opts.prev_intent, user_location = opts.location,
    llm = opts.llm, llm_timeout = opts.llm_timeout, cache = opts.cache, model = opts.model,
  })
  if not res then return nil, err end
  local route = opts.route or routing.new_router(opts.router)
  local state = {
    message = message, intent = res.intent,
    additional_intents = res.additional_intents, user_location = opts.location,
  }
  local decisions = route(state)
  local ex = res.explain

  local lines = {}
  local function say(...) lines[#lines + 1] = format(...) end

  say("message: %s", message)
  if opts.prev_intent then say("previous intent: %s", opts.prev_intent) end
  if opts.location then say("user location: %s", opts.location) end
  if res.source == "llm" then
    say("source: llm%s", ex.cache == "hit" and " (cached answer)" or "")
  else
    say("source: offline classifier (%s)", ex.fallback_reason or "no LLM")
  end

  -- scores, best first
  local order = {}
  for c, p in pairs(ex.scores) do order[#order + 1] = { c, p } end
  sort(order, function(a, b)
    if a[2] ~= b[2] then return a[2] > b[2] end
    return a[1] < b[1]
  end)
  say("%s scores%s:", res.source == "llm" and "llm" or "classifier",
    ex.decided_on and ex.decided_on ~= message and format(" (on \"%s\")", ex.decided_on) or "")
  local boosts = ex.transition_boost and ex.transition_boost.boosts or {}
  for _, e in ipairs(order) do
    local b = boosts[e[1]]
    say("  %-17s %.3f %s%s", e[1], e[2], pct_bar(e[2], 20),
      b and format("  boost %s -> %.3f", signed(b), e[2] + b) or "")
  end

  if ex.no_evidence then
    say("no word of the message is known to the classifier: general")
  end

  local tb = ex.transition_boost or {}
  if tb.prev_intent then
    local parts = {}
    for c, b in pairs(boosts) do parts[#parts + 1] = format("%s %s", c, signed(b)) end
    sort(parts)
    say("transition boost from %s: %s", tb.prev_intent,
      #parts > 0 and concat(parts, ", ") or "none")
    if tb.changed_choice then
      say("  the boost changed the choice: %s -> %s", tb.unboosted_choice, res.intent)
    end
  else
    say("transition boost: none (no previous intent)")
  end

  local kw = ex.keyword_adjustments
  if #kw.matched > 0 then
    say("keyword adjustment: %s (%s: %s)", signed(kw.delta), kw.intent, concat(kw.matched, ", "))
  else
    say("keyword adjustment: %s (no keyword of %s)", signed(kw.delta), kw.intent)
  end
  say("confidence: %.3f = %.3f base %s boost %s keywords (clamped to 0..1)",
    res.confidence, ex.base_confidence, signed(tb.applied or 0), signed(kw.delta))

  if ex.clauses and #ex.clauses > 1 then
    say("clauses:")
    for _, cl in ipairs(ex.clauses) do
      local note = cl.dropped and (" (dropped: " .. cl.dropped .. ")")
        or cl.ignored and (" (ignored: " .. cl.ignored .. ")") or ""
      say("  \"%s\" -> %s %.3f%s", cl.text, cl.intent, cl.p, note)
    end
  end
  say("intent: %s%s", res.intent, #res.additional_intents > 0
    and (" + " .. concat(res.additional_intents, ", ")) or "")
  say("complexity: %s%s", res.complexity,
    ex.complexity_reason and (" (" .. ex.complexity_reason .. ")") or "")
  say("sends:")
  for _, d in ipairs(decisions) do
    say("  Send(%q)  rule=%s%s", d.node, d.rule,
      d.description and ("  -- " .. d.description) or "")
  end

  local sends = json.array()
  for i, d in ipairs(decisions) do sends[i] = { node = d.node, rule = d.rule } end
  local object = {
    intent = res.intent,
    additional_intents = json.array(res.additional_intents),
    confidence = res.confidence,
    nodes = json.array(routing.nodes(decisions)),
    sends = sends,
    is_multi = res.is_multi,
    complexity = res.complexity,
    source = res.source,
    fallback_reason = ex.fallback_reason,
  }
  if opts.json then lines[#lines + 1] = json.encode_output(object) end
  return lines, object, res, decisions
end

setmetatable(_M, { __call = function(_, ...) return _M.explain(...) end })

return _M
