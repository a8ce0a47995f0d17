--[[
moongraph.engine.task — runs one task of a superstep.

A task is one node invocation: an edge-triggered node reading the graph
state, or a Send packet with its own argument. run(run, t) calls the node
with its options applied (cache; retry and timeout, engine/retry.lua; the
policy: fail_close, fail_open, or a fallback chain), evaluates the node's
routers on the state as this task alone would leave it, and returns a result
record, which is also the engine's record of the task:

  status    "done" | "error" | "interrupt"
  update, route, sends        what a finished task leads to
  failed    true: the node failed under fail_open (its error is in `error`)
  error, interrupts
  node, id, send, step        the task
  ran       the node that produced the result (a fallback's name, or nil
            when it is `node`)
  attempts, duration (seconds), cached
  chain     { {node, error, attempts, duration}, ... }: the nodes of the
            fallback chain that failed before `ran`

algo.task_record(res) turns it into what the engine tells about a task, in
ctx.previous_tasks and in the checkpoint of its step.

run() never raises: failures are data for the superstep loop. It writes
nothing into the plan entry `t` (plans of plain runs are shared).
]]

local type, tostring, xpcall, pcall, getmetatable = type, tostring, xpcall, pcall, getmetatable

local errors = require "moongraph.errors"
local tasks = require "moongraph.tasks"
local text = require "moongraph.text"
local control = require "moongraph.control"
local algo = require "moongraph.engine.algo"
local branch = require "moongraph.engine.branch"
local retry = require "moongraph.engine.retry"
local context = require "moongraph.engine.context"

local is_command, is_interrupt = control.is_command, control.is_interrupt
local is_parent_command = control.is_parent_command
local handler = branch.handler
local now = tasks.now

local _M = {}

local short_error = text.error_message

-- A node's failure as an error value: code "node_failed", details.node,
-- the cause (the node's own error) kept, its retryable too. A string cause
-- keeps its traceback in the message, as before.
local function node_failed(node, what, cause)
  local msg = type(cause) == "string" and cause or tostring(short_error(cause))
  return errors.wrap(cause, "node_failed", what .. " failed: " .. msg, { node = node })
end

-- One attempt of a node: a function, or a compiled graph run as a subgraph.
local function call_node(spec, input, ctx)
  context.new_attempt(ctx)
  if spec.sub then
    local run = context.run_of(ctx)
    return run.loop.subgraph_node(run, spec, input, ctx)
  end
  return spec.fn(input, ctx)
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

--[[ Run node `name` and its fallback chain.
-> ok, value, ran, attempts, chain, cached, failed_error ]]
local function run_policies(run, name, input, ctx)
  local nodes = run.nodes
  local spec = nodes[name]
  local chain = nil
  while true do
    ctx.node = spec.name
    local key, store
    if spec.cache then
      key = cache_key(spec, input)
      if key then
        store = run.app.cache[spec.name]
        local hit = store[key]
        if hit and (hit.expires == nil or hit.expires > now()) then
          return true, hit.value, spec.name, 0, chain, true
        end
      end
    end
    local t0 = now()
    local ok, v, attempts = retry.run(spec, input, ctx, call_node)
    if ok then
      if key then
        local ttl = spec.cache.ttl
        store[key] = { value = v, expires = ttl and (now() + ttl) or nil }
      end
      return true, v, spec.name, attempts, chain
    end
    if is_interrupt(v) then return false, v, spec.name, attempts, chain end
    if spec.policy == "fail_open" then
      local e = short_error(v)
      return true, { errors = { { node = spec.name, error = e, fallback_of = chain and name or nil } } },
        spec.name, attempts, chain, false, e
    elseif spec.policy == "fallback" then
      chain = chain or {}
      chain[#chain + 1] = { node = spec.name, error = short_error(v), attempts = attempts,
        duration = now() - t0 }
      context.set_failures(ctx, chain)
      spec = nodes[spec.fallback]
    else
      local what = "node '" .. spec.name .. "'"
      if chain then what = what .. " (fallback of '" .. name .. "')" end
      return false, node_failed(spec.name, what, v), spec.name, attempts, chain
    end
  end
end

local function route_error(res, msg)
  res.status = "error"
  res.error = msg
  res.update, res.route, res.sends, res.failed = nil, nil, nil, nil
  return res
end

--[[ run(run, t [, reuse]) -> result record (see the top of this file).
A run that keeps no records (run.records_kept false: no saver, stream or
trace, and no node or router that could read ctx.previous_tasks) times
nothing and, for a task alone in its step (reuse), recycles the previous
step's result record, which its barrier has consumed. ]]
function _M.run(run, t, reuse)
  local spec = run.nodes[t.node]
  local kept = run.records_kept
  local t0 = kept and now() or 0
  local ctx = nil
  -- a plain node that takes no ctx and has no routers gets none; with
  -- records kept, one is made if it asks (context.current)
  local bare = spec.plain and spec.no_ctx and not spec.branches[1]
  if not bare then ctx = context.new(run, t) end
  local input
  if t.send then input = t.arg else input = run.values end
  local ok, v, ran, attempts, chain, cached, failed
  if spec.plain then
    local task, before, before_run = nil, nil, nil
    if ctx then
      task, before = context.bind(ctx)
    elseif kept then
      task, before, before_run = context.bind_later(run, t)
    end
    ok, v = xpcall(spec.fn, handler, input, ctx)
    if task then context.unbind(task, before, before_run) end
    ran, attempts = t.node, 1
    if not ok and is_parent_command(v) then
      ok, v = true, control.Command { update = v.command.update, to = v.command.to }
    end
    if not ok and not is_interrupt(v) then
      v = node_failed(ran, "node '" .. ran .. "'", v)
    end
  else
    ok, v, ran, attempts, chain, cached, failed = run_policies(run, t.node, input, ctx)
  end
  local res
  if kept then
    res = { status = "done", node = t.node, id = t.id, send = t.send, step = run.step + 1,
      attempts = attempts, duration = now() - t0 }
  else
    res = reuse and run.inline_res
    if res then
      res.status, res.update, res.route, res.sends = "done", nil, nil, nil
      res.ran, res.error, res.failed, res.interrupts, res.cached, res.chain = nil, nil, nil, nil, nil, nil
    else
      res = { status = "done", update = nil, route = nil, sends = nil }
      if reuse then run.inline_res = res end
    end
    res.node = t.node
  end
  if ran ~= t.node then res.ran = ran end
  if chain then res.chain = chain end
  if cached then res.cached = true end
  if not ok then
    if is_interrupt(v) then
      res.status, res.interrupts = "interrupt", v
      return res
    end
    res.status, res.error = "error", v
    return res
  end
  if failed then res.failed, res.error = true, failed end
  -- normalise the node's return value
  local to
  -- (a table without a metatable is an update: no is_command call)
  if v == nil or (type(v) == "table" and (getmetatable(v) == nil or not is_command(v))) then
    res.update = v
  else
    if type(v) ~= "table" then
      return route_error(res, "node '" .. ran .. "' returned a " .. type(v) ..
        "; return a table of state updates, nil or mg.Command{...}")
    end
    if v.resume ~= nil then
      return route_error(res, "node '" .. ran .. "' returned Command{resume=...}; resume is for the caller of invoke()")
    end
    if v.graph == control.PARENT then
      if run.root then
        return route_error(res, "node '" .. ran .. "' returned Command{graph = mg.PARENT}, " ..
          "but its graph is not running as a subgraph")
      end
      -- the subgraph ends here; the parent's task that ran it takes the command
      res.status, res.parent = "error", true
      res.update, res.error = nil, control.parent_command(v)
      return res
    end
    res.update = v.update
    to = v.to
  end
  if to ~= nil then
    local err = branch.add_targets(run, res, to, nil, "node '" .. ran .. "' (Command.to)")
    if err then return route_error(res, err) end
  end
  if spec.branches[1] then
    local okr, state = pcall(algo.local_state, run, res.update)
    if not okr then
      return route_error(res, "node '" .. ran .. "': " .. tostring(state))
    end
    if ctx then ctx.node = t.node end
    local err = branch.route(run, spec, state, res, ctx)
    if err then return route_error(res, err) end
  end
  return res
end

return _M
