--[[
moongraph.functional — LangGraph's functional API: a workflow written as a
plain function, with tasks that run in parallel and results that survive a
crash or an interrupt.

  local write = mg.task(function(topic) return "an essay about " .. topic end)

  local workflow = mg.entrypoint { checkpointer = mg.checkpoint.memory() }(
    function(input, ctx)
      local essay = write(input.topic):result()    -- a task: a future
      local ok = mg.interrupt { essay = essay }     -- or ctx.interrupt
      return { essay = essay, approved = ok }
    end)

  workflow:invoke({ topic = "cats" }, { thread_id = "t" })          -- pauses
  workflow:invoke(mg.Command { resume = true }, { thread_id = "t" }) -- the result

The entrypoint is a compiled graph of one node (its name, "entrypoint" by
default) underneath, so invoke, stream, get_state, get_state_history and
update_state behave as they do for graphs. Its function gets the input and
ctx, with ctx.previous: what the last run of the thread returned (or saved
with entrypoint.final{value =, save =}).

A task called inside a node (an entrypoint's, or any graph node's) runs in a
task of its own and returns a future; future:result() waits for it and
returns its value, or raises its error. With a checkpointer each finished
task's result is saved with the node's task, so when the node runs again —
after an interrupt, or in a new process after a crash — a task it already
finished returns its saved result instead of running again. Calls are told
apart by their order: a node must call its tasks in the same order each
time it runs (as LangGraph requires). Outside a node a task simply runs.
]]

local type, error, setmetatable, getmetatable, ipairs =
  type, error, setmetatable, getmetatable, ipairs
local table_pack, table_unpack = table.pack, table.unpack

local tasks = require "moongraph.tasks"
local control = require "moongraph.control"
local context = require "moongraph.engine.context"
local writer = require "moongraph.engine.writer"

local _M = {}

local future_mt = { __name = "moongraph.Future" }
future_mt.__index = future_mt

-- future:result() -> the task's value; raises its error
function future_mt:result()
  if not self.done then
    local ok, v = self.task:join()
    self.done, self.ok = true, ok
    if ok then self.value = v else self.err = v end
  end
  if self.ok then return self.value end
  error(self.err, 0)
end

local function resolved(value)
  return setmetatable({ done = true, ok = true, value = value }, future_mt)
end

--[[ task(fn [, {name =}]) -> a function whose calls return futures of the
value fn returns (one value, which must be JSON-serialisable when results
are saved). name (default: "task") tells the task's calls apart in saved
results and names it in `updates` stream events. ]]
function _M.task(fn, opts)
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    error("bad argument #1 to 'task': function expected, got " .. type(fn), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #2 to 'task': options table {name =} expected, got " .. type(opts), 2)
  end
  local name = opts and opts.name or "task"
  if type(name) ~= "string" or name == "" or name:find("[/#]") then
    error("bad argument #2 to 'task': name must be a non-empty string without '/' or '#'", 2)
  end
  return function(...)
    local ctx = context.current()
    if not ctx then
      return setmetatable({ task = tasks.spawn(fn, ...) }, future_mt)
    end
    local id, saved = context.task_call(ctx, name)
    if saved then
      for _, w in ipairs(saved) do
        if w[1] == "__return__" then return resolved(w[2][1]) end
      end
    end
    local run = context.run_of(ctx)
    local args = table_pack(...)
    local t = tasks.spawn(function()
      local value = fn(table_unpack(args, 1, args.n))
      local sink = run.sink
      if sink and sink.modes.updates then
        sink.put { mode = "updates", node = name, task_id = id, ns = run.ns, step = run.step + 1,
          data = { [name] = value } }
      end
      if run.saver then writer.save_writes(run, id, { { "__return__", { value } } }) end
      return value
    end)
    return setmetatable({ task = t }, future_mt)
  end
end

---------------------------------------------------------------------------
-- entrypoints

local final_mt = { __name = "moongraph.entrypoint.final" }

-- What an entrypoint returns when the thread should remember something else
-- than what the caller gets: final{value = returned, save = for ctx.previous}.
local function final(t)
  if type(t) ~= "table" then
    error("bad argument #1 to 'final': table {value =, save =} expected, got " .. type(t), 2)
  end
  return setmetatable({ value = t.value, save = t.save }, final_mt)
end

local Entrypoint = {}
Entrypoint.__index = Entrypoint
Entrypoint.__name = "moongraph.Entrypoint"

-- the caller's view of the underlying graph's state
local function output(values)
  if type(values) ~= "table" then return values end
  if values.__interrupt__ then return { __interrupt__ = values.__interrupt__ } end
  return values.__output__
end

function Entrypoint:invoke(input, cfg)
  local wrapped = input
  if input ~= nil and not control.is_command(input) then wrapped = { __input__ = input } end
  local values, err = self.graph:invoke(wrapped, cfg)
  if values == nil then return nil, err end
  return output(values)
end

-- stream: the graph's events, with `values` the entrypoint's return value
-- and `updates` of the entrypoint named after it
function Entrypoint:stream(input, cfg)
  local wrapped = input
  if input ~= nil and not control.is_command(input) then wrapped = { __input__ = input } end
  local iter, s, c, closer = self.graph:stream(wrapped, cfg)
  local name = self.name
  -- a new input's first values event is the state before the entrypoint
  -- ran: it still holds the thread's previous return value
  local skip_input = wrapped ~= input
  local function next_event()
    while true do
      local ev = iter(s, c)
      if ev == nil then return nil end
      if ev.mode == "values" and skip_input and (ev.ns == nil or ev.ns == "") then
        skip_input = false
      elseif ev.mode == "values" then
        if ev.data.__output__ ~= nil or ev.data.__interrupt__ then
          ev.data = output(ev.data)
          return ev
        end
      elseif ev.mode == "updates" and ev.node == name then
        if type(ev.data) == "table" and ev.data.__output__ ~= nil then
          ev.data = { [name] = ev.data.__output__ }
          return ev
        end
      else
        return ev
      end
    end
  end
  return next_event, nil, nil, closer
end

local function snapshot_of(snap)
  if type(snap) ~= "table" then return snap end
  snap.values = snap.values and snap.values.__output__
  return snap
end

function Entrypoint:get_state(cfg)
  local snap, err = self.graph:get_state(cfg)
  if not snap then return nil, err end
  return snapshot_of(snap)
end

function Entrypoint:get_state_history(cfg, opts)
  local list, err = self.graph:get_state_history(cfg, opts)
  if not list then return nil, err end
  for i, snap in ipairs(list) do list[i] = snapshot_of(snap) end
  return list
end
Entrypoint.history = Entrypoint.get_state_history

--[[ entrypoint{checkpointer =, store =, name = "entrypoint", durability =,
recursion_limit =} -> function(fn) -> entrypoint; entrypoint.final{value =,
save =} as LangGraph spells it. ]]
local function entrypoint(opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #1 to 'entrypoint': options table expected, got " .. type(opts), 2)
  end
  local name = opts.name or "entrypoint"
  return function(fn)
    if type(fn) ~= "function" then
      error("bad argument #1 to entrypoint{...}: the workflow function expected, got " .. type(fn), 2)
    end
    local graph = require "moongraph.graph"
    local g = graph.new { "__input__", "__output__", "__previous__" }
    g:add_node(name, function(state, ctx)
      ctx.previous = state.__previous__
      local out = fn(state.__input__, ctx)
      local save = out
      if getmetatable(out) == final_mt then out, save = out.value, out.save end
      return { __output__ = out, __previous__ = save }
    end)
    g:add_edge(graph.START, name)
    local compiled = g:compile {
      checkpointer = opts.checkpointer, store = opts.store, name = name,
      durability = opts.durability, recursion_limit = opts.recursion_limit,
    }
    return setmetatable({ graph = compiled, name = name }, Entrypoint)
  end
end

_M.entrypoint = setmetatable({ final = final }, {
  __call = function(_, opts) return entrypoint(opts) end,
})
_M.final = final
_M.Future = future_mt

return _M
