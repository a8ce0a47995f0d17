--[[
moongraph.routed_agent — routed agents (mg.routed_agent).

  local node = mg.routed_agent{
    name = "support",
    agents = { primary = primary_fn, fallback = fallback_graph },
    router = function(agents, ctx, error_ctx)
      if not error_ctx then return "primary" end
      if error_ctx.failed_keys.primary then return "fallback" end
    end,
  }
  g:add_node("support", node)          -- or node(state, ctx) directly

A routed agent picks, on every call, one agent out of a set with a router
function the script author writes, and runs it in place of itself. An agent
is a node function `fn(input, ctx)`, a compiled graph (run as a subgraph of
the calling graph, with its own checkpoint namespace per agent), or a table
`{name = ..., run = fn}`.

Failover: the router is first called without an error context. When the
chosen agent fails before it emitted anything, the router is called again
with `error_ctx = {failed_keys = {[key] = true, ...}, last_error = err}` and
may name another agent. An agent that already emitted an event (ctx.emit,
ctx.stream_token, or, for a compiled graph, a finished node's update, a
custom event or a token of its own) has shown partial output, so its error
is raised at once. A router that names an agent that already failed, or
returns nil, ends the routing with the last agent error. Interrupts
(ctx.interrupt inside an agent) pass through untouched: they are not failures.

The selection and failover loop is moongraph.failover's route(), the one
llm.routed uses for model-level routing; this module adapts agents to it.
]]

local type, pairs, next, error, tostring, setmetatable, getmetatable =
  type, pairs, next, error, tostring, setmetatable, getmetatable
local table_sort, table_pack, table_unpack = table.sort, table.pack, table.unpack
local string_gsub = string.gsub

local tasks = require "moongraph.tasks"
local compiled_graph = require "moongraph.compiled_graph"
local context = require "moongraph.engine.context"
local failover = require "moongraph.failover"

local _M = {}

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = tostring(k) end
  table_sort(out)
  return out
end

---------------------------------------------------------------------------
-- agents

-- the text of the last user message in state.messages, or nil
local function user_message(state)
  local msgs = type(state) == "table" and state.messages
  if type(msgs) ~= "table" then return nil end
  for i = #msgs, 1, -1 do
    local m = msgs[i]
    if type(m) == "string" then return m end
    if type(m) == "table" and (m.role == "user" or m.role == "human" or m.type == "human") then
      if type(m.content) == "string" then return m.content end
    end
  end
  return nil
end
_M.user_message = user_message

-- The ctx an agent sees: the caller's ctx with emit and stream_token
-- counted. `mark` is called on every event.
local function agent_ctx(ctx, mark, extra)
  local inner_emit, inner_token = nil, nil
  local t = {
    emit = function(value)
      mark()
      inner_emit = inner_emit or ctx.emit
      if inner_emit then return inner_emit(value) end
    end,
    stream_token = function(text)
      mark()
      inner_token = inner_token or ctx.stream_token
      if inner_token then return inner_token(text) end
    end,
  }
  for k, v in pairs(extra) do t[k] = v end
  return setmetatable(t, { __index = ctx })
end

-- Stream modes that count as an agent's output. `values` (the input echoed
-- at the start of a run and the state after each step), `tasks` and `debug`
-- are bookkeeping and do not.
local OUTPUT_MODES = { updates = true, custom = true, messages = true }

-- A compiled graph run inside the calling graph: a subgraph of the calling
-- task (ctx.run_subgraph) with its stream watched and a namespace of its own
-- per agent key, so two agents tried in one task never share checkpoints.
-- -> what the agent changed in the caller's keys (the node's update)
local function run_in_graph(app, input, ctx, key, mark)
  local suffix = string_gsub(tostring(key), "[:|/#@]", "_")
  local _, update = ctx.run_subgraph(app, input, { ns_suffix = suffix, on_event = function(ev)
    if OUTPUT_MODES[ev.mode] then mark() end
  end })
  return update
end

-- A compiled graph called outside a graph run: a run of its own, streamed so
-- its output events are seen (custom events and tokens go on to ctx).
local function run_alone(app, input, ctx, mark)
  local function body()
    local cfg = {}
    local config = type(ctx) == "table" and ctx.config
    if type(config) == "table" then for k, v in pairs(config) do cfg[k] = v end end
    cfg.modes = { "values", "updates", "custom", "messages" }
    local last = nil
    for ev in app:stream(input, cfg) do
      if OUTPUT_MODES[ev.mode] then mark() end
      if ev.mode == "values" then
        last = ev.data
      elseif ev.mode == "custom" and ctx.emit then
        ctx.emit(ev.data)
      elseif ev.mode == "messages" and ctx.stream_token then
        ctx.stream_token(ev.data)
      end
    end
    return last
  end
  if tasks.current() then return body() end
  return tasks.run(body)
end

local function in_graph(ctx)
  return context.is_ctx(ctx)
end

---------------------------------------------------------------------------
-- routed_agent

-- agents option -> map key -> {kind = "fn"|"graph", target = ...}
local function normalise_agents(agents)
  if type(agents) ~= "table" then
    error("bad argument #1 to 'routed_agent': agents must be a table (a map key -> agent or a list of named agents), got " ..
      type(agents), 3)
  end
  local n = #agents
  local out, count = {}, 0
  local function entry(key, a, where)
    if compiled_graph.is_compiled(a) then
      return { kind = "graph", target = a }
    elseif type(a) == "table" and not getmetatable(a) and a.run ~= nil then
      if not is_callable(a.run) then
        error("bad argument #1 to 'routed_agent': " .. where .. ": run must be a function", 4)
      end
      return { kind = "fn", target = a.run }
    elseif is_callable(a) then
      return { kind = "fn", target = a }
    end
    error("bad argument #1 to 'routed_agent': " .. where ..
      " must be a node function, a compiled graph or {name = ..., run = fn}, got " .. type(a), 4)
  end
  if n > 0 then
    for k in pairs(agents) do
      if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then
        error("bad argument #1 to 'routed_agent': agents mixes a list with the key '" ..
          tostring(k) .. "'", 3)
      end
    end
    for i = 1, n do
      local a = agents[i]
      local name = type(a) == "table" and a.name or nil
      if type(name) ~= "string" or name == "" then
        error("bad argument #1 to 'routed_agent': agent " .. i ..
          " of the list has no name (compile it with {name = ...} or give {name = ..., run = fn})", 3)
      end
      if out[name] then
        error("bad argument #1 to 'routed_agent': two agents are named '" .. name .. "'", 3)
      end
      out[name] = entry(name, a, "agent '" .. name .. "'")
      count = count + 1
    end
  else
    for k, a in pairs(agents) do
      if type(k) ~= "string" or k == "" then
        error("bad argument #1 to 'routed_agent': agent keys must be non-empty strings, got " .. type(k), 3)
      end
      out[k] = entry(k, a, "agent '" .. k .. "'")
      count = count + 1
    end
  end
  if count == 0 then
    error("bad argument #1 to 'routed_agent': agents is empty", 3)
  end
  return out
end

--[[ routed_agent{name = "...", agents = {...}, router = fn} -> node function

agents: a map {key = agent, ...} or a list {agent, ...} whose entries are
compiled graphs with a name (compile{name = ...}) or {name = ..., run = fn},
keyed by that name.
router(agents, ctx, error_ctx) -> key | nil: may yield (call an LLM, read a
file); `agents` is a read-only view of the agents by key; ctx is the node's
ctx plus ctx.state (the input) and ctx.user_message (the last user message
of state.messages, or nil); error_ctx as described at the top of this file.

The returned function(input, ctx) runs the chosen agent and returns what it
returns (a compiled graph: its changes to the caller's state keys). The ctx
an agent gets carries ctx.agent_key and ctx.routed_agent (the name). ]]
function _M.routed_agent(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'routed_agent': options table expected, got " .. type(opts), 2)
  end
  for k in pairs(opts) do
    if k ~= "name" and k ~= "agents" and k ~= "router" then
      error("bad argument #1 to 'routed_agent': unknown option '" .. tostring(k) ..
        "' (expected name, agents, router)", 2)
    end
  end
  local name = opts.name or "routed_agent"
  if type(name) ~= "string" or name == "" then
    error("bad argument #1 to 'routed_agent': name must be a non-empty string", 2)
  end
  if not is_callable(opts.router) then
    error("bad argument #1 to 'routed_agent': router function expected, got " .. type(opts.router), 2)
  end
  local router = opts.router
  local entries = normalise_agents(opts.agents)
  local view_src = {}
  for k, e in pairs(entries) do view_src[k] = e.target end
  local view = setmetatable({}, {
    __index = view_src,
    __newindex = function() error("routed agent '" .. name .. "': the agents table is read-only", 2) end,
    __pairs = function() return next, view_src, nil end,
  })
  local what = "routed agent '" .. name .. "'"

  local order = sorted_keys(view_src)

  return function(input, ctx)
    if ctx ~= nil and type(ctx) ~= "table" then
      error("bad argument #2 to '" .. name .. "': ctx table expected, got " .. type(ctx), 2)
    end
    ctx = ctx or {}
    local graph_ctx = in_graph(ctx)
    local rctx = setmetatable({ state = input, user_message = user_message(input) }, { __index = ctx })

    -- one attempt; a failure is raised, an interrupt passes through routing
    local function call(key, _, mark)
      local e = entries[key]
      if e.kind == "graph" then
        if graph_ctx then return true, run_in_graph(e.target, input, ctx, key, mark) end
        return true, run_alone(e.target, input, ctx, mark)
      end
      return true, e.target(input, agent_ctx(ctx, mark, { agent_key = key, routed_agent = name }))
    end

    local results = table_pack(failover.route { map = view, order = order, context = rctx,
      router = router, call = call, ok_flag = true, pass_through = true,
      name = what, what = "agents" })
    if not results[1] then
      -- nothing failed: the router chose no agent at all
      error(what .. ": the router selected no agent", 0)
    end
    return table_unpack(results, 3, results.n)
  end
end

return _M
