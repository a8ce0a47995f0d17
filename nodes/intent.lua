-- intent: the first node of every turn of the Eco² chat pipeline.
--
-- Classifies the user's message (nodes/lib/intent_classifier.lua: the LLM
-- when one is configured, else the offline classifier), with the previous
-- turn's intent from the thread's state feeding the Chain-of-Intent
-- transition boost, and asks the dynamic router (nodes/lib/dynamic_router.lua)
-- which nodes run next. The rules of both are data the pipeline gives:
--
--   local node = intent.new{ rules = { keyword_map =, transitions =,
--                                      multi_intent =, routing = } }
--   g:add_node("intent", node.run, { timeout = node.timeout })
--
-- It also opens the turn: the turn counter goes up, the user's message joins
-- the history, and the per-turn keys (contexts, errors) are reset
-- with the marker the pipeline's reducers understand (state.RESET below).
local classifier = require "nodes.lib.intent_classifier"
local dynamic_router = require "nodes.lib.dynamic_router"

local type, tostring, ipairs, error, setmetatable = type, tostring, ipairs, error, setmetatable

local _M = {
  name = "intent",
  policy = "fail_close",
  timeout = 30,
}

-- The value that empties a per-turn key (see scripts/eco/chat.lua reducers).
_M.RESET = { __reset = true }

local node_mt = { __index = _M }

-- new{rules} -> the node: this module's fields, and run(state, ctx) using
-- the rules given.
function _M.new(opts)
  local rules = type(opts) == "table" and opts.rules
  if type(rules) ~= "table" or type(rules.routing) ~= "table" then
    error("bad argument #1 to 'new': {rules = {keyword_map, transitions, multi_intent, routing}} expected", 2)
  end
  local route = dynamic_router.new { rules = rules.routing }
  local node = setmetatable({}, node_mt)
  function node.run(state, ctx) return _M.classify_turn(state, ctx, rules, route) end
  return node
end

-- One turn: classify the message, route it, open the turn's state.
function _M.classify_turn(state, ctx, rules, route)
  local message = state and state.message
  if type(message) ~= "string" or not message:find("%S") then
    error("intent: the message (state.message) is empty", 0)
  end
  local prev = state.intent
  -- a previous intent is used only when it is one of the nine intents
  if not classifier.is_intent(prev) then prev = nil end
  local llm = ctx and ctx.config and ctx.config.llm
  local r, err = classifier.classify(message, {
    prev_intent = prev, user_location = state.user_location, llm = llm, rules = rules,
  })
  if not r then error("intent: " .. tostring(err), 0) end
  local turn = (type(state.turn) == "number" and state.turn or 0) + 1
  local routed = {
    intent = r.intent, additional_intents = r.additional_intents,
    user_location = state.user_location,
  }
  local decisions = route(routed)
  local boost = r.explain and r.explain.transition_boost
  return {
    turn = turn,
    prev_intent = prev or false,
    intent = r.intent,
    additional_intents = r.additional_intents,
    confidence = r.confidence,
    is_multi = r.is_multi,
    complexity = r.complexity,
    intent_source = r.source,
    transition_boost = boost and boost.applied or 0,
    routing = decisions,
    contexts = _M.RESET,
    errors = _M.RESET,
    messages = { role = "user", content = message, turn = turn, intent = r.intent },
  }
end

return _M
