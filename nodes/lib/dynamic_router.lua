-- Dynamic router of the Eco² chat pipeline's intent node: which nodes run,
-- in one parallel step, for a classified message.
--
-- route(state) returns decisions {node =, rule =, ...} in this order:
--   1. the primary intent's node                      rule "primary"
--   2. one node per additional intent                 rule "multi_intent"
--   3. the primary intent's enrichment nodes          rule "enrichment:waste->weather"
--   4. conditional enrichments whose condition holds  rule "conditional:user_location->weather"
-- A node is chosen at most once (the first rule that picks it wins).
-- router.sends() turns decisions into Send packets for the graph engine.
--
-- The rule tables (INTENT_TO_NODE, ENRICHMENT_RULES, CONDITIONAL_ENRICHMENTS;
-- scripts/eco/routing_rules.lua holds the Eco² ones) are data given to new();
-- they are read on every call, never copied.

local cjson = require "cjson"

local ipairs, pairs, type, error, getmetatable = ipairs, pairs, type, error, getmetatable
local null = cjson.null

local _M = {}

-- A state value counts as set unless it is nil or JSON null.
local function is_set(v)
  return v ~= nil and v ~= null
end
_M.is_set = is_set

local function member(list, x)
  if not list then return false end
  for _, v in ipairs(list) do
    if v == x then return true end
  end
  return false
end

local function condition_holds(rule, state)
  if type(rule.condition) == "function" then
    return rule.condition(state) and true or false
  end
  for _, key in ipairs(rule.requires or {}) do
    if not is_set(state[key]) then return false end
  end
  -- as the seed's condition, this looks at state.intent itself: a state
  -- without an intent routes to general but meets the condition
  local intent = state.intent
  if not is_set(intent) then return true end
  return not member(rule.unless_intents, intent)
end

local function check_flag(opts, name)
  local v = opts[name]
  if v == nil then return true end
  if type(v) ~= "boolean" then
    error("bad argument #1 to 'new': " .. name .. " must be a boolean", 3)
  end
  return v
end

-- Build a router. opts: enable_multi_intent, enable_enrichment,
-- enable_conditional (booleans, all true by default) and rules (required: a
-- table with INTENT_TO_NODE, ENRICHMENT_RULES, CONDITIONAL_ENRICHMENTS).
function _M.new(opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #1 to 'new': expected a table of options", 2)
  end
  local multi = check_flag(opts, "enable_multi_intent")
  local enrich = check_flag(opts, "enable_enrichment")
  local conditional = check_flag(opts, "enable_conditional")
  local rules = opts.rules
  if type(rules) ~= "table" then
    error("bad argument #1 to 'new': rules (a routing rule table) expected", 2)
  end

  return function(state)
    if type(state) ~= "table" then
      error("bad argument #1 to 'route': expected a state table, got " .. type(state), 2)
    end
    local r = rules
    local to_node = r.INTENT_TO_NODE or {}
    local decisions, active = {}, {}
    local function add(node, rule, extra)
      if active[node] then return end
      active[node] = true
      local d = { node = node, rule = rule }
      for k, v in pairs(extra or {}) do d[k] = v end
      decisions[#decisions + 1] = d
    end

    local primary = is_set(state.intent) and state.intent or "general"

    -- 1. primary intent
    add(to_node[primary] or "general", "primary", { intent = primary })

    -- 2. multi-intent fan-out
    local additional = state.additional_intents
    if multi and is_set(additional) and type(additional) == "table" then
      for _, intent in ipairs(additional) do
        add(to_node[intent] or intent, "multi_intent", { intent = intent })
      end
    end

    -- 3. enrichment of the primary intent
    local er = r.ENRICHMENT_RULES and r.ENRICHMENT_RULES[primary]
    if enrich and er then
      for _, node in ipairs(er.enrichments or {}) do
        add(node, "enrichment:" .. primary .. "->" .. node,
          { description = er.description })
      end
    end

    -- 4. conditional enrichment
    if conditional then
      for _, rule in ipairs(r.CONDITIONAL_ENRICHMENTS or {}) do
        if not active[rule.node]
          and not member(rule.exclude_intents, primary)
          and condition_holds(rule, state) then
          add(rule.node, "conditional:" .. (rule.name or rule.node),
            { description = rule.description })
        end
      end
    end
    return decisions
  end
end

-- The node names of decisions, sorted.
function _M.nodes(decisions)
  local out = {}
  for i, d in ipairs(decisions) do out[i] = d.node end
  table.sort(out)
  return out
end

-- Send packets for decisions: Send(node, state) for each, in decision
-- order. Send is the graph engine's constructor (mg.Send).
function _M.sends(decisions, state, Send)
  if type(decisions) ~= "table" then
    error("bad argument #1 to 'sends': expected a list of decisions", 2)
  end
  if type(Send) ~= "function" and not (type(Send) == "table" and getmetatable(Send)
      and getmetatable(Send).__call) then
    error("bad argument #3 to 'sends': expected the Send constructor", 2)
  end
  local out = {}
  for i, d in ipairs(decisions) do out[i] = Send(d.node, state) end
  return out
end

return _M
