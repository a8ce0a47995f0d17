-- Eco²'s routing: the intent classifier and the dynamic router of the
-- intent node (nodes/lib/), bound to the Eco² rule tables of this
-- directory. The pipeline, `moongraph route` and `moongraph eval` all
-- classify and route through here, so they decide alike.
--
--   local routing = require "scripts.eco.routing"
--   local res = routing.classify("팔 수 있어?", { prev_intent = "bulk_waste" })
--   local decisions = routing.new_router()({ intent = res.intent, ... })
--
-- The rule tables are plain data, separate from the code that applies them:
--   keyword_map.lua     keywords that raise or lower a decision's confidence
--   transitions.lua     Chain-of-Intent boosts from the previous turn's intent
--   multi_intent.lua    how a message is cut into clauses (several requests)
--   routing_rules.lua   which node serves an intent, enrichments
local classifier = require "nodes.lib.intent_classifier"
local router = require "nodes.lib.dynamic_router"

local pairs, type = pairs, type

local _M = {}

_M.rules = {
  keyword_map = require "scripts.eco.keyword_map",
  transitions = require "scripts.eco.transitions",
  multi_intent = require "scripts.eco.multi_intent",
  routing = require "scripts.eco.routing_rules",
}

_M.INTENTS = classifier.INTENTS
_M.is_intent = classifier.is_intent
_M.new_cache = classifier.new_cache
_M.nodes = router.nodes
_M.sends = router.sends

-- classify(message [, opts]) -> result | nil, err (see intent_classifier)
function _M.classify(message, opts)
  local o = { rules = _M.rules }
  if type(opts) == "table" then
    for k, v in pairs(opts) do if k ~= "rules" then o[k] = v end end
  elseif opts ~= nil then
    error("bad argument #2 to 'classify': expected a table of options", 2)
  end
  return classifier.classify(message, o)
end

function _M.split(message)
  return classifier.split(message, _M.rules.multi_intent)
end

function _M.keyword_adjustment(message, intent)
  return classifier.keyword_adjustment(message, intent, _M.rules.keyword_map)
end

-- new_router([opts]) -> route(state) -> decisions, with the Eco² routing
-- rules unless opts.rules gives others (opts as in dynamic_router.new).
function _M.new_router(opts)
  local o = { rules = _M.rules.routing }
  if type(opts) == "table" then
    for k, v in pairs(opts) do o[k] = v end
  elseif opts ~= nil then
    error("bad argument #1 to 'new_router': expected a table of options", 2)
  end
  return router.new(o)
end

return _M
