--[[
moongraph.executor — runs one task of a superstep.

A task is one node invocation: an edge-triggered node reading the graph
state, or a Send packet with its own argument. run(R, t) calls the node with
its options applied (cache, retry with backoff, timeout, policy with the
fallback chain), evaluates the node's routers on the state as this task alone
would leave it, and returns a result record:

  { status = "done", update = {...}|nil, route = {names}|nil, sends = {Send}|nil,
    failed = true|nil (fail_open), ran = "node that produced it" }
  { status = "error", error = "message" }
  { status = "interrupt", interrupts = { {id=, value=, node=, ns=}, ... } }

It never raises: failures are data for the superstep runner (moongraph.pregel).
]]

local type, pairs, tostring, error, xpcall, pcall, setmetatable, getmetatable, rawset, rawget =
  type, pairs, tostring, error, xpcall, pcall, setmetatable, getmetatable, rawset, rawget
local math_random = math.random
local string_find, string_sub = string.find, string.sub
local traceback = debug.traceback

local control = require "moongraph.control"

local is_command, is_send, is_interrupt = control.is_command, control.is_send, control.is_interrupt
local END = control.END

local _M = {}

local rt   -- runtime primitives, bound on first use (moongraph requires us)
local function runtime()
  if not rt then
    local mg = require "moongraph"
    rt = { sleep = mg.sleep, now = mg.now, timeout = mg.timeout }
  end
  return rt
end

local function handler(e)
  if type(e) == "string" then return traceback(e, 2) end
  return e
end

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

-- First line of an error, without position noise from tracebacks.
local function short_error(e)
  if type(e) ~= "string" then
    if type(e) == "table" and e.message then return tostring(e.message) end
    return tostring(e)
  end
  local cut = string_find(e, "\nstack traceback:", 1, true)
  if cut then return string_sub(e, 1, cut - 1) end
  return e
end
_M.short_error = short_error

-- ctx: the second argument of every node. emit/interrupt/stream_token are
-- closures made on first use, so a node that ignores them costs nothing.
local ctx_methods = {}

function ctx_methods.emit(ctx)
  return function(value)
    local R = ctx._R
    local sink = R.sink
    if sink and sink.modes.custom then
      sink.put { mode = "custom", node = ctx.node, task_id = ctx.task_id, ns = R.ns,
        step = ctx.step, data = value }
    end
  end
end

function ctx_methods.stream_token(ctx)
  return function(text)
    local R = ctx._R
    local sink = R.sink
    if sink and sink.modes.messages then
      sink.put { mode = "messages", node = ctx.node, task_id = ctx.task_id, ns = R.ns,
        step = ctx.step, data = text }
    end
  end
end

function ctx_methods.interrupt(ctx)
  return function(value)
    local i = (rawget(ctx, "_ic") or 0) + 1
    ctx._ic = i
    local t = ctx._t
    local resume = t.resume
    if resume and resume[i] ~= nil then
      return resume[i]
    end
    local R = ctx._R
    if not R.saver then
      error("ctx.interrupt in node '" .. ctx.node ..
        "' needs a checkpointer: compile the graph with {checkpointer = ...} and invoke it with a thread_id", 2)
    end
    local prefix = R.ns ~= "" and (R.ns .. "|") or ""
    error(control.interrupt_error { {
      id = prefix .. ctx.task_id .. "/" .. i, value = value, node = ctx.node, ns = R.ns,
    } }, 0)
  end
end

--[[ ctx.run_subgraph(app, input [, opts]) -> final state, update
Runs compiled graph `app` as a subgraph of this task (see
pregel.run_subgraph). opts: ns_suffix (a name of its own within the task:
namespace <node>.<suffix>:<task_id>, needed to run more than one subgraph in
a task), on_event (function(event) seeing every stream event of the run). ]]
local app_mod
local function check_subgraph_args(sub, input, opts)
  app_mod = app_mod or require "moongraph.app"
  if not app_mod.is_app(sub) then
    error("bad argument #1 to 'run_subgraph': compiled graph expected, got " .. type(sub), 3)
  end
  if type(input) ~= "table" then
    error("bad argument #2 to 'run_subgraph': table of state values expected, got " .. type(input), 3)
  end
  if opts == nil then return nil, nil end
  if type(opts) ~= "table" then
    error("bad argument #3 to 'run_subgraph': options table expected, got " .. type(opts), 3)
  end
  for k in pairs(opts) do
    if k ~= "ns_suffix" and k ~= "on_event" then
      error("bad argument #3 to 'run_subgraph': unknown option '" .. tostring(k) ..
        "' (expected ns_suffix, on_event)", 3)
    end
  end
  local suffix, on_event = opts.ns_suffix, opts.on_event
  if suffix ~= nil and (type(suffix) ~= "string" or suffix == "" or string_find(suffix, "[:|/#@]")) then
    error("bad argument #3 to 'run_subgraph': ns_suffix must be a non-empty string without ':', '|', '/', '#' or '@'", 3)
  end
  if on_event ~= nil and not is_callable(on_event) then
    error("bad argument #3 to 'run_subgraph': on_event must be a function", 3)
  end
  return suffix, on_event
end

local pregel  -- moongraph.pregel, for subgraphs

function ctx_methods.run_subgraph(ctx)
  return function(sub, input, opts)
    local suffix, on_event = check_subgraph_args(sub, input, opts)
    pregel = pregel or require "moongraph.pregel"
    local name = ctx.node
    if suffix then name = name .. "." .. suffix end
    return pregel.run_subgraph(ctx._R, ctx, sub, input, name, on_event)
  end
end

-- fields computed on access, so that making a ctx costs one small table
local ctx_fields = {
  config = function(ctx) return ctx._R.cfg end,
  step = function(ctx) return ctx._R.step + 1 end,
  ns = function(ctx) return ctx._R.ns end,
  attempt = function() return 1 end,
  task_id = function(ctx)
    local t = ctx._t
    return t.id or _M.task_id(ctx._R.step + 1, t)
  end,
}

local ctx_mt = {
  __name = "moongraph.ctx",
  __index = function(ctx, k)
    local field = ctx_fields[k]
    if field then return field(ctx) end
    local make = ctx_methods[k]
    if make then
      local f = make(ctx)
      rawset(ctx, k, f)
      return f
    end
  end,
}

-- the id of task t in step `step`: "<step>:<node>" or "<step>:<node>#<send>"
function _M.task_id(step, t)
  if t.send then return step .. ":" .. t.node .. "#" .. t.send end
  return step .. ":" .. t.node
end

local function backoff(r, n)
  local d = r.initial_interval * r.backoff_factor ^ (n - 1)
  if r.jitter then d = d * (0.5 + math_random()) end
  if d > r.max_interval then d = r.max_interval end
  return d
end
_M.backoff = backoff

local function call_node(spec, input, ctx)
  if spec.sub then
    pregel = pregel or require "moongraph.pregel"
    return pregel.subgraph(ctx._R, spec, input, ctx)
  end
  return spec.fn(input, ctx)
end

local function attempt(spec, input, ctx)
  ctx._ic, ctx._subns = nil, nil
  return xpcall(call_node, handler, spec, input, ctx)
end

local function attempt_timed(spec, input, ctx)
  local ok, a, b = runtime().timeout(spec.timeout, attempt, spec, input, ctx)
  if ok then return a, b end
  if a == "timeout" then
    return false, "node '" .. ctx.node .. "' timed out after " .. spec.timeout .. " s"
  end
  return false, a
end

-- Run one node (with retry and timeout) -> ok, value|err
local function run_with_retry(spec, input, ctx)
  local once = spec.timeout and attempt_timed or attempt
  local r = spec.retry
  local n = 1
  while true do
    ctx.attempt = n
    local ok, v = once(spec, input, ctx)
    if ok or is_interrupt(v) or not r or n >= r.max_attempts then return ok, v end
    if r.retry_on then
      local pok, again = pcall(r.retry_on, v)
      if not pok then
        return false, "retry_on of node '" .. spec.name .. "' failed: " .. tostring(again)
      end
      if not again then return false, v end
    end
    runtime().sleep(backoff(r, n))
    n = n + 1
  end
end

local json
local function cache_key(spec, input)
  local c = spec.cache
  if c.key then
    local ok, k = pcall(c.key, input)
    if ok and k ~= nil then return tostring(k) end
    return nil
  end
  json = json or require "moongraph.json"
  return (json.encode(input))
end

-- Run `name` (and its fallback chain) -> ok, value, ran_name
local function run_policies(R, name, input, ctx)
  local nodes = R.nodes
  local spec = nodes[name]
  local chain = nil
  while true do
    ctx.node = spec.name
    local ok, v
    local key, store
    if spec.cache then
      key = cache_key(spec, input)
      if key then
        store = R.app.cache[spec.name]
        local hit = store[key]
        if hit and (hit.expires == nil or hit.expires > runtime().now()) then
          return true, hit.value, spec.name, true
        end
      end
    end
    ok, v = run_with_retry(spec, input, ctx)
    if ok then
      if key then
        local ttl = spec.cache.ttl
        store[key] = { value = v, expires = ttl and (runtime().now() + ttl) or nil }
      end
      return true, v, spec.name
    end
    if is_interrupt(v) then return false, v, spec.name end
    if spec.policy == "fail_open" then
      return true, { errors = { { node = spec.name, error = short_error(v),
        fallback_of = chain and name or nil } } }, spec.name, false, true
    elseif spec.policy == "fallback" then
      chain = chain or { name }
      chain[#chain + 1] = spec.fallback
      spec = nodes[spec.fallback]
    else
      local what = "node '" .. spec.name .. "'"
      if chain then what = what .. " (fallback of '" .. name .. "')" end
      if type(v) ~= "string" then v = tostring(short_error(v)) end
      return false, what .. " failed: " .. v, spec.name
    end
  end
end

-- Apply one task's update to a copy of the graph state (for its routers).
local function local_state(R, update)
  local s = {}
  for k, v in pairs(R.values) do s[k] = v end
  if update then
    local reds = R.reducers
    for k, v in pairs(update) do
      local r = reds[k]
      if r then s[k] = r(s[k], v) else s[k] = v end
    end
  end
  return s
end
_M.local_state = local_state

local function route_error(res, msg)
  res.status = "error"
  res.error = msg
  res.update, res.route, res.sends = nil, nil, nil
  return res
end

-- Resolve one router/Command output into res.route / res.sends.
local function add_target(R, res, out, branch, who)
  if is_send(out) then
    if not R.nodes[out.node] then
      return who .. " sent to '" .. tostring(out.node) .. "', which is not a node"
    end
    local sends = res.sends
    if not sends then sends = {}; res.sends = sends end
    sends[#sends + 1] = out
    return nil
  end
  if type(out) ~= "string" then
    return who .. " returned a " .. type(out) ..
      "; expected a node name, a list of them, mg.Send packets or mg.END"
  end
  local target = out
  if branch and branch.map then
    target = branch.map[out]
    if target == nil then
      return who .. " returned '" .. out .. "', which is not in its path_map (" ..
        table.concat(branch.labels, ", ") .. ")"
    end
  end
  if target == END then return nil end
  if not R.nodes[target] then
    return who .. " returned '" .. target .. "', which is not a node"
  end
  local route = res.route
  if not route then route = {}; res.route = route end
  route[#route + 1] = target
  return nil
end

local function add_targets(R, res, out, branch, who)
  if out == nil then
    return who .. " returned nil; expected a node name, a list of them, mg.Send packets or mg.END"
  end
  if type(out) == "table" and not is_send(out) then
    for i = 1, #out do
      local err = add_target(R, res, out[i], branch, who)
      if err then return err end
    end
    return nil
  end
  return add_target(R, res, out, branch, who)
end
_M.add_targets = add_targets

--[[ Evaluate the routers of `spec` (a node or the START pseudo-node) on
`state`, adding targets to res. Returns nil or an error message. ]]
function _M.route(R, spec, state, res, ctx)
  local branches = spec.branches
  for i = 1, #branches do
    local b = branches[i]
    local ok, out = xpcall(b.router, handler, state, ctx)
    local who = "router on '" .. spec.name .. "'"
    if not ok then return who .. " failed: " .. tostring(out) end
    local err = add_targets(R, res, out, b, who)
    if err then return err end
  end
  return nil
end

--[[ run(R, t [, reuse]) -> result record (see the top of this file).
reuse: the task runs alone in the runner's coroutine, so the run's ctx table
is recycled instead of making a new one. ]]
function _M.run(R, t, reuse)
  local ctx = reuse and R.ctx
  if ctx then
    ctx.node, ctx._t, ctx.attempt, ctx._ic, ctx._subns = t.node, t, nil, nil, nil
  else
    ctx = setmetatable({ node = t.node, _R = R, _t = t }, ctx_mt)
    if reuse then R.ctx = ctx end
  end
  local input
  if t.send then input = t.arg else input = R.values end
  local spec = R.nodes[t.node]
  local ok, v, ran, cached, failed
  if spec.plain then
    ok, v = xpcall(spec.fn, handler, input, ctx)
    ran = t.node
    if not ok and not is_interrupt(v) then
      if type(v) ~= "string" then v = tostring(short_error(v)) end
      v = "node '" .. ran .. "' failed: " .. v
    end
  else
    ok, v, ran, cached, failed = run_policies(R, t.node, input, ctx)
  end
  if not ok then
    if is_interrupt(v) then
      return { status = "interrupt", interrupts = v, ran = ran }
    end
    return { status = "error", error = v, ran = ran }
  end
  -- normalise the node's return value
  local res
  local to
  if v == nil or (type(v) == "table" and not is_command(v)) then
    res = reuse and R.res
    if res then
      -- the previous inline step's record: consumed by its barrier already
      res.status, res.update, res.route, res.sends = "done", v, nil, nil
      res.ran, res.cached, res.failed, res.error = nil, nil, nil, nil
    else
      res = { status = "done", update = v, route = nil, sends = nil }
      if reuse then R.res = res end
    end
  else
    res = { status = "done", update = nil }
    if type(v) ~= "table" then
      return route_error(res, "node '" .. ran .. "' returned a " .. type(v) ..
        "; return a table of state updates, nil or mg.Command{...}")
    end
    if v.resume ~= nil then
      return route_error(res, "node '" .. ran .. "' returned Command{resume=...}; resume is for the caller of invoke()")
    end
    res.update = v.update
    to = v.to
  end
  if ran ~= t.node then res.ran = ran end
  if cached then res.cached = true end
  if failed then res.failed = true end
  if to ~= nil then
    local err = add_targets(R, res, to, nil, "node '" .. ran .. "' (Command.to)")
    if err then return route_error(res, err) end
  end
  if spec.branches[1] then
    local okr, state = pcall(local_state, R, res.update)
    if not okr then
      return route_error(res, "node '" .. ran .. "': " .. tostring(state))
    end
    ctx.node = t.node
    local err = _M.route(R, spec, state, res, ctx)
    if err then return route_error(res, err) end
  end
  return res
end

return _M
