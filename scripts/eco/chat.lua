-- The Eco² chat pipeline as a moongraph graph.
--
--   START -> intent --Send fan-out--> waste_rag | character | location | ...
--         (every routed node runs in one parallel step)
--         -> aggregator --> answer -> feedback -> summarize -> END
--                      \--> general / clarify -> aggregator   (fallback chain)
--
--   local chat = require "scripts.eco.chat"
--   local app = chat.build{ checkpointer = mg.checkpoint.file(".moongraph/threads") }
--   local state = app:invoke(chat.input("종이 어떻게 버려?", { location = "서울특별시 강남구" }),
--                            chat.config{ thread_id = "t1", llm = client })
--
-- Policies are the ones each node declares (nodes/*.lua): waste_rag falls
-- back to web_search, web_search, weather and the other lookups are
-- fail_open, character is fail_close (its failure ends the run), general
-- falls back to clarify. When the primary request is still unanswered after
-- its own policy, the aggregator continues the chain with general (when an
-- LLM is configured) and clarify; docs/pipeline.md has the whole picture.
--
-- State keys (reducers): messages (messages), contexts (per-turn merge),
-- errors (per-turn append: the engine's record of fail_open failures);
-- everything else is `last`. The per-turn keys are emptied by the intent
-- node at the start of each turn. Nodes find the LLM client and the clock in
-- the run's config (ctx.config.llm, ctx.config.clock); how each task went
-- (timing, errors, fallback chains) is the engine's: the `tasks` stream mode
-- and ctx.previous_tasks.
-- The previous turn's intent stays in the thread's checkpointed state and
-- feeds the next turn's transition boost.
local mg = require "moongraph"
local reducers = require "moongraph.reducers"
local registry = require "nodes.registry"
local intent_node = require "nodes.intent"
local routing = require "scripts.eco.routing"

local type, ipairs, pairs, error, pcall = type, ipairs, pairs, error, pcall

local _M = {}

-- The nodes the router and the fallback chain can run (one branch each).
_M.branch_nodes = registry.names

-- The pipeline's own nodes, in order.
_M.pipeline_nodes = registry.pipeline

-- Seconds a node's graph timeout adds to its own (the adapters' HTTP timeouts
-- are the node timeouts, so the adapter reports its own error first; the
-- engine's deadline catches a node stuck anywhere else).
_M.timeout_grace = 1

-- History messages a branch receives (general and answer use the last few).
_M.branch_history = 6

------------------------------------------------------------------------
-- reducers: per-turn keys are emptied by a { __reset = true } write
------------------------------------------------------------------------

local function is_reset(v)
  return type(v) == "table" and v.__reset == true
end

function _M.turn_merge(old, new)
  if is_reset(new) then return {} end
  return reducers.merge(old, new)
end

function _M.turn_append(old, new)
  if is_reset(new) then return {} end
  return reducers.append(old, new)
end

function _M.schema()
  return {
    messages = reducers.messages,
    contexts = _M.turn_merge,
    errors = _M.turn_append,
  }
end

------------------------------------------------------------------------
-- routers
------------------------------------------------------------------------

-- What a branch node receives: the turn's request, not the whole state
-- (Send arguments are checkpointed with the step that runs them).
function _M.branch_input(state, ctx)
  local hist = type(state.messages) == "table" and state.messages or {}
  local recent = {}
  for i = math.max(1, #hist - _M.branch_history + 1), #hist do
    local m = hist[i]
    if type(m) == "table" then recent[#recent + 1] = { role = m.role, content = m.content } end
  end
  return {
    message = state.message,
    intent = state.intent,
    additional_intents = state.additional_intents,
    user_location = state.user_location,
    prev_intent = state.prev_intent or nil,
    turn = state.turn,
    thread_id = ctx and ctx.config and ctx.config.thread_id or nil,
    messages = recent,
  }
end

-- After intent: one Send per routing decision, all in the next step.
local function fan_out(state, ctx)
  if type(state.routing) ~= "table" or #state.routing == 0 then
    error("intent did not route the message anywhere", 0)
  end
  return routing.sends(state.routing, _M.branch_input(state, ctx), mg.Send)
end

-- After aggregator: the answer, or the next step of the fallback chain.
local function after_aggregate(state, ctx)
  local agg = state.aggregate
  local nxt = type(agg) == "table" and agg.next or "answer"
  if nxt == "answer" then return "answer" end
  local input = _M.branch_input(state, ctx)
  input.chain_of = agg.primary
  local failures = {}
  for _, m in ipairs(agg.missing or {}) do
    if m.status == "failed" or m.status == "empty" then
      failures[#failures + 1] = { node = m.node, error = m.reason }
    end
  end
  input.chain_failures = failures
  return mg.Send(nxt, input)
end

------------------------------------------------------------------------
-- building
------------------------------------------------------------------------

local function load_branch(name, opts)
  local over = opts.nodes and opts.nodes[name]
  if over then return over end
  return registry.load(name)
end

local function node_opts(node, opts)
  local o = { policy = node.policy }
  local limit = opts.timeouts and opts.timeouts[node.name] or node.timeout
  if opts.node_timeouts ~= false and type(limit) == "number" then
    o.timeout = limit + (opts.timeout_grace or _M.timeout_grace)
  end
  return o
end

-- build{checkpointer, recursion_limit, node_timeouts, timeouts, timeout_grace,
-- nodes} -> compiled graph.
-- Every adapter bounds its own requests with its HTTP timeout (node.timeout
-- unless configured), and the LLM client has its own; the engine's per-node
-- timeout (node.timeout + timeout_grace) is on top, unless node_timeouts =
-- false.
-- `timeouts` sets some nodes' limits ({intent = 5}), timeout_grace the
-- grace (default chat.timeout_grace). `nodes` replaces node modules by name
-- (same contract: name, policy, timeout, run).
function _M.build(opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #1 to 'build': options table expected, got " .. type(opts), 2)
  end
  local g = mg.graph(_M.schema())
  local intent = opts.nodes and opts.nodes.intent or intent_node.new { rules = routing.rules }
  g:add_node("intent", intent.run, node_opts(intent, opts))
  local targets = {}
  for _, name in ipairs(_M.branch_nodes) do
    local node = load_branch(name, opts)
    g:add_node(name, node.run, node_opts(node, opts))
    g:add_edge(name, "aggregator")
    if name ~= "clarify" then targets[#targets + 1] = name end
  end
  for _, name in ipairs({ "aggregator", "answer", "feedback", "summarize" }) do
    local node = opts.nodes and opts.nodes[name] or require("nodes." .. name)
    g:add_node(name, node.run, node_opts(node, opts))
  end
  g:add_edge(mg.START, "intent")
  g:add_conditional_edges("intent", fan_out, targets)
  g:add_conditional_edges("aggregator", after_aggregate, { "answer", "general", "clarify" })
  g:add_edge("answer", "feedback")
  g:add_edge("feedback", "summarize")
  g:add_edge("summarize", mg.END)
  return g:compile { checkpointer = opts.checkpointer, recursion_limit = opts.recursion_limit }
end

-- The input of one turn: the message and, when given, the user's location
-- (kept in the thread's state for later turns).
function _M.input(message, opts)
  if type(message) ~= "string" or not message:find("%S") then
    error("bad argument #1 to 'input': non-empty message expected", 2)
  end
  opts = opts or {}
  local input = { message = message }
  if opts.location ~= nil then input.user_location = opts.location end
  return input
end

-- The run config: thread_id, llm, trace (file), clock, summarize settings
-- and per-service adapter overrides (docs/adapters.md) pass through.
function _M.config(opts)
  local cfg = {}
  for k, v in pairs(opts or {}) do cfg[k] = v end
  return cfg
end

-- The thread's previous intent (for display), or nil.
function _M.previous_intent(app, thread_id)
  if not app.checkpointer then return nil end
  local ok, snap = pcall(app.get_state, app, { thread_id = thread_id })
  if ok and type(snap) == "table" and type(snap.values) == "table" then
    return snap.values.intent, snap.values.turn
  end
  return nil
end

-- The hooks `moongraph worker` runs this pipeline with: its memory and schema.
_M.worker = require "scripts.eco.worker"

return _M
