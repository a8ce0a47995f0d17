-- intent: the first node of every turn of the Eco² chat pipeline.
--
-- Classifies the user's message (scripts/eco/intent.lua: the LLM when one is
-- configured, else the offline classifier), with the previous turn's intent
-- from the thread's state feeding the Chain-of-Intent transition boost, and
-- asks the dynamic router (scripts/eco/router.lua) which nodes run next.
-- It also opens the turn: the turn counter goes up, the user's message joins
-- the history, and the per-turn keys (contexts, node_runs, errors) are reset
-- with the marker the pipeline's reducers understand (state.RESET below).
local intent = require "scripts.eco.intent"
local router = require "scripts.eco.router"

local type, tostring, ipairs = type, tostring, ipairs

local _M = {
  name = "intent",
  policy = "fail_close",
  timeout = 30,
}

-- The value that empties a per-turn key (see scripts/eco/chat.lua reducers).
_M.RESET = { __reset = true }

local route = router.new()

-- A previous intent is used only when it is one of the nine intents.
local known = {}
for _, c in ipairs(intent.INTENTS) do known[c] = true end

function _M.run(state, ctx)
  local message = state and state.message
  if type(message) ~= "string" or not message:find("%S") then
    error("intent: the message (state.message) is empty", 0)
  end
  local prev = state.intent
  if not known[prev] then prev = nil end
  local llm = ctx and ctx.llm
  local r, err = intent.classify(message, {
    prev_intent = prev, user_location = state.user_location, llm = llm,
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
    node_runs = _M.RESET,
    errors = _M.RESET,
    messages = { role = "user", content = message, turn = turn, intent = r.intent },
  }
end

return _M
