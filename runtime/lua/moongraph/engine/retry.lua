--[[
moongraph.engine.retry — one node's attempts: its timeout on each attempt,
and retries with exponential backoff (node option `retry`).

  local ok, value_or_err, attempts = retry.run(spec, input, ctx, call)

call(spec, input, ctx) runs the node once. An attempt with a timeout runs in
a child task under mg.timeout, so the node's deadline bounds every call made
inside it (docs/runtime.md, Deadlines). Interrupts are never retried;
retry_on(err) decides which errors are.
]]

local type, tostring, pcall, xpcall = type, tostring, pcall, xpcall
local math_random = math.random

local errors = require "moongraph.errors"
local tasks = require "moongraph.tasks"
local control = require "moongraph.control"
local branch = require "moongraph.engine.branch"
local context = require "moongraph.engine.context"

local is_interrupt, is_parent_command = control.is_interrupt, control.is_parent_command
local handler = branch.handler

local _M = {}

-- The wait before retry number n (1-based).
function _M.backoff(r, n)
  local d = r.initial_interval * r.backoff_factor ^ (n - 1)
  if r.jitter then d = d * (0.5 + math_random()) end
  if d > r.max_interval then d = r.max_interval end
  return d
end

local function attempt(call, spec, input, ctx)
  local task, before = context.bind(ctx)
  local ok, v = xpcall(call, handler, spec, input, ctx)
  context.unbind(task, before)
  return ok, v
end

local function attempt_timed(call, spec, input, ctx)
  local ok, a, b = tasks.timeout(spec.timeout, attempt, call, spec, input, ctx)
  if ok then return a, b end
  if a == "timeout" then
    return false, errors.new("timeout", "node '" .. spec.name .. "' timed out after " .. spec.timeout .. " s",
      { retryable = true })
  end
  return false, a
end

--[[ run(spec, input, ctx, call) -> ok, value | err, attempts
ctx.attempt is set to the attempt's number before each call. ]]
function _M.run(spec, input, ctx, call)
  local once = spec.timeout and attempt_timed or attempt
  local r = spec.retry
  local n = 1
  while true do
    ctx.attempt = n
    local ok, v = once(call, spec, input, ctx)
    if is_parent_command(v) then
      -- a subgraph run by this node sent a Command to this graph: the
      -- node's result, as if it had returned it
      return true, control.Command { update = v.command.update, to = v.command.to }, n
    end
    if ok or is_interrupt(v) or not r or n >= r.max_attempts then return ok, v, n end
    if r.retry_on then
      local pok, again = pcall(r.retry_on, v)
      if not pok then
        return false, "retry_on of node '" .. spec.name .. "' failed: " .. tostring(again), n
      end
      if not again then return false, v, n end
    end
    tasks.sleep(_M.backoff(r, n))
    n = n + 1
  end
end

return _M
