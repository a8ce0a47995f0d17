--[[
moongraph.engine.context — `ctx`, the second argument of every node and
router: what a node may know of its run and do in it.

  ctx.node            the node running (a fallback's own name in a chain)
  ctx.task_id         "<step>:<node>" or "<step>:<node>#<send>"
  ctx.step, ctx.ns    the superstep, the checkpoint namespace ("" at the root)
  ctx.config          the run's config (the table given to invoke/stream)
  ctx.context         cfg.context, read-only: LangGraph's runtime context (what
                      a run depends on: a user id, a client, a connection)
  ctx.store           the long-term store the graph was compiled with (the
                      root graph's, in a subgraph without its own)
  ctx.attempt         1, 2, ... under a retry policy
  ctx.failures        the failures earlier in this task: a fallback node sees
                      {node, error, attempts} of each node that failed before it
  ctx.previous_tasks  records of the tasks of earlier steps of this run
                      (oldest first; see engine/task.lua for the fields)
  ctx.emit(value)             a `custom` stream event
  ctx.stream_token(text)      a `messages` stream event
  ctx.interrupt(value)        pause the run; returns the resume value later
  ctx.run_subgraph(app, input [, opts])   a compiled graph inside this task

Every task gets a ctx of its own, so a ctx a node keeps (in a closure, a
spawned task) always speaks for that node. The engine's own references live
under keys user code cannot name.

While a node runs, its ctx is also the current one of the task running it
(context.current()): mg.interrupt(value) and an LLM call made without a
`stream` callback find it there, as LangGraph's interrupt() and its callbacks
do. (A task the node spawns has none.)
]]

local type, pairs, next, tostring, error, setmetatable, getmetatable, rawget =
  type, pairs, next, tostring, error, setmetatable, getmetatable, rawget
local string_find = string.find

local tasks = require "moongraph.tasks"

local control = require "moongraph.control"
local algo = require "moongraph.engine.algo"

local _M = {}

-- private keys: the run, the task (plan entry), per-attempt state
local RUN, TASK, ATTEMPT = {}, {}, {}
_M.RUN, _M.TASK = RUN, TASK

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do
    if type(v) == "table" then v = copy(v) end
    c[k] = v
  end
  return c
end

-- Methods are closures made on first use, so a node that ignores them
-- costs nothing.
local methods = {}

function methods.emit(ctx)
  return function(value)
    local run = ctx[RUN]
    local sink = run.sink
    if sink and sink.modes.custom then
      sink.put { mode = "custom", node = ctx.node, task_id = ctx.task_id, ns = run.ns,
        step = ctx.step, data = value }
    end
  end
end

function methods.stream_token(ctx)
  return function(text)
    local run = ctx[RUN]
    local sink = run.sink
    if sink and sink.modes.messages then
      sink.put { mode = "messages", node = ctx.node, task_id = ctx.task_id, ns = run.ns,
        step = ctx.step, data = text }
    end
  end
end

-- the per-attempt state, made on first use
local function attempt_state(ctx)
  local st = ctx[ATTEMPT]
  if not st then
    st = { interrupts = 0, subgraphs = nil, chain = nil }
    ctx[ATTEMPT] = st
  end
  return st
end

function methods.interrupt(ctx)
  return function(value)
    local st = attempt_state(ctx)
    local i = st.interrupts + 1
    st.interrupts = i
    local resume = ctx[TASK].resume
    if resume and resume[i] ~= nil then
      return resume[i]
    end
    local run = ctx[RUN]
    if not run.saver then
      error("ctx.interrupt in node '" .. ctx.node ..
        "' needs a checkpointer: compile the graph with {checkpointer = ...} and invoke it with a thread_id", 2)
    end
    local prefix = run.ns ~= "" and (run.ns .. "|") or ""
    error(control.interrupt_error { {
      id = prefix .. ctx.task_id .. "/" .. i, value = value, node = ctx.node, ns = run.ns,
    } }, 0)
  end
end

local function check_subgraph_args(sub, input, opts)
  if not (type(sub) == "table" and sub.is_compiled_graph == true) then
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

--[[ ctx.run_subgraph(app, input [, opts]) -> final state, update
Runs compiled graph `app` as a subgraph of this task (engine/loop.lua
run_subgraph). opts: ns_suffix (a name of its own within the task:
namespace <node>.<suffix>:<task_id>, needed to run more than one subgraph in
a task), on_event (function(event) seeing every stream event of the run). ]]
function methods.run_subgraph(ctx)
  return function(sub, input, opts)
    local suffix, on_event = check_subgraph_args(sub, input, opts)
    local name = ctx.node
    if suffix then name = name .. "." .. suffix end
    local run = ctx[RUN]
    return run.loop.run_subgraph(run, ctx, sub, input, name, on_event)
  end
end

-- A read-only view of a table.
local function read_only(t)
  return setmetatable({}, { __index = t, __newindex = function(_, k)
    error("ctx.context is read-only (set '" .. tostring(k) .. "' in the config's context before the run)", 2)
  end, __pairs = function() return next, t, nil end })
end

-- fields computed on access, so that making a ctx costs one small table
local fields = {
  config = function(ctx) return ctx[RUN].cfg end,
  store = function(ctx) return ctx[RUN].store end,
  context = function(ctx)
    local c = ctx[RUN].cfg.context
    if type(c) ~= "table" then return c end
    local v = read_only(c)
    ctx.context = v
    return v
  end,
  step = function(ctx) return ctx[RUN].step + 1 end,
  ns = function(ctx) return ctx[RUN].ns end,
  attempt = function() return 1 end,
  task_id = function(ctx)
    local t = ctx[TASK]
    return t.id or algo.task_id(ctx[RUN].step + 1, t.node, t.send)
  end,
  failures = function(ctx)
    local st = ctx[ATTEMPT]
    local chain = st and st.chain
    local out = {}
    for i = 1, chain and #chain or 0 do out[i] = copy(chain[i]) end
    return out
  end,
  previous_tasks = function(ctx)
    local records = ctx[RUN].records
    local out = {}
    for i = 1, records and #records or 0 do out[i] = algo.task_record(records[i]) end
    return out
  end,
}

local mt = {
  __name = "moongraph.ctx",
  __index = function(ctx, k)
    local field = fields[k]
    if field then return field(ctx) end
    local make = methods[k]
    if make then
      local f = make(ctx)
      ctx[k] = f
      return f
    end
  end,
}

-- new(run, task) -> ctx for one task
function _M.new(run, task)
  return setmetatable({ node = task.node, [RUN] = run, [TASK] = task }, mt)
end

-- A fresh attempt of the node: interrupts are counted and subgraph
-- namespaces claimed again.
function _M.new_attempt(ctx)
  local st = ctx[ATTEMPT]
  if st then st.interrupts, st.subgraphs, st.calls = 0, nil, nil end
end

-- The failures before the node now running in this task (a fallback chain).
function _M.set_failures(ctx, chain)
  attempt_state(ctx).chain = chain
end

--[[ A call of a functional-API task (moongraph.functional) made by this
attempt of the node: its place in the order of calls -> id, saved writes
(the writes a run that stopped earlier saved for the same call, or nil). ]]
function _M.task_call(ctx, name)
  local st = attempt_state(ctx)
  local n = (st.calls or 0) + 1
  st.calls = n
  local id = ctx.task_id .. "/" .. name .. "#" .. n
  local saved = ctx[RUN].saved_writes
  return id, saved and saved[id] or nil
end

-- claim_namespace(ctx, ns) -> true | nil when this attempt already ran a
-- subgraph in ns
function _M.claim_namespace(ctx, ns)
  local st = attempt_state(ctx)
  local used = st.subgraphs
  if used and used[ns] then return nil end
  if not used then used = {}; st.subgraphs = used end
  used[ns] = true
  return true
end

function _M.run_of(ctx) return rawget(ctx, RUN) end

-- the ctx of the node each task is running (weak: a finished task's goes),
-- or the plan entry of a node bound by bind_later, whose run is in later_run
local current = setmetatable({}, { __mode = "k" })
local later_run = setmetatable({}, { __mode = "k" })

-- bind(ctx) -> task, before: ctx is current in the running task until
-- unbind(task, before) (a task cancelled meanwhile takes its entry along)
function _M.bind(ctx)
  local task = tasks.current()
  if not task then return nil end
  local before = current[task]
  current[task] = ctx
  return task, before
end

function _M.unbind(task, before, before_run)
  if task then
    current[task] = before
    if before_run ~= nil then later_run[task] = before_run end
  end
end

--[[ bind_later(run, t) -> task, before, before_run: as bind, for a node
that takes no ctx: its ctx is made only if current() is asked for it
(mg.interrupt, an LLM call). unbind(task, before, before_run) ends it. ]]
function _M.bind_later(run, t)
  local task = tasks.current()
  if not task then return nil end
  local before, before_run = current[task], later_run[task]
  current[task] = t
  later_run[task] = run
  return task, before, before_run or false
end

-- current() -> the ctx of the node the running task is running, or nil
function _M.current()
  local task = tasks.current()
  local c = task and current[task]
  if c and getmetatable(c) ~= mt then
    -- bound by bind_later: the task's plan entry, its ctx made now
    c = _M.new(later_run[task], c)
    current[task] = c
  end
  return c or nil
end

-- token_sink() -> ctx.stream_token of the current node when its run is
-- streamed in `messages` mode, else nil
function _M.token_sink()
  local ctx = _M.current()
  if not ctx then return nil end
  local sink = ctx[RUN].sink
  if sink and sink.modes.messages then return ctx.stream_token end
  return nil
end
function _M.is_ctx(v) return type(v) == "table" and getmetatable(v) == mt end
function _M.task_of(ctx) return rawget(ctx, TASK) end

return _M
