--[[
moongraph.compiled_graph — what g:compile{...} returns (LangGraph's
CompiledStateGraph).

  app:invoke(input, cfg)            -> final state | nil, err
  app:stream(input, cfg)            -> iterator of events {mode, node, task_id, ns, step, data}
  app:get_state(cfg)                -> snapshot
  app:get_state_history(cfg [, {limit, before}]) -> snapshots, newest first
                                       (also app:history)
  app:update_state(cfg, values [, as_node]) -> cfg of the new checkpoint
  app:mermaid()  app:dot()          -> diagram source
  app:draw(path) app:draw_png(path) -> the drawing as an image (Graphviz)

cfg: thread_id (required with a checkpointer), checkpoint_id (resume or fork
from that checkpoint), recursion_limit, durability, stream_mode (stream; also
`modes`), trace (Chrome trace file path); the whole table is visible to
nodes as ctx.config. The run itself is engine/loop.lua.

Input: a table of state values starts a run (on a thread with history, on
top of its last state); nil resumes the thread's pending run; mg.Command
resumes interrupts and/or updates state and picks the next nodes.
]]

local type, pairs, ipairs, error, setmetatable, getmetatable, tostring, pcall, next =
  type, pairs, ipairs, error, setmetatable, getmetatable, tostring, pcall, next
local table_sort = table.sort
local string_gmatch, string_match = string.gmatch, string.match
local coroutine_running = coroutine.running

local errors = require "moongraph.errors"
local tasks = require "moongraph.tasks"
local control = require "moongraph.control"
local engine = require "moongraph.engine.loop"
local algo = require "moongraph.engine.algo"
local writer = require "moongraph.engine.writer"
local events = require "moongraph.engine.events"

local _M = {}
local app = { is_compiled_graph = true }
local app_mt = { __index = app, __name = "moongraph.CompiledGraph" }

local render

function _M.new(spec)
  spec.pool = {}
  spec.cache = {}
  for name in pairs(spec.nodes) do spec.cache[name] = {} end
  return setmetatable(spec, app_mt)
end

function _M.is_compiled(v)
  return getmetatable(v) == app_mt
end

-- the config of a call without one (read-only: nodes see it as ctx.config)
local NO_CFG = setmetatable({}, { __newindex = function()
  error("ctx.config is read-only here: no config table was passed to invoke", 2) end })

local function check_cfg(cfg, fname)
  if cfg == nil then return NO_CFG end
  if type(cfg) ~= "table" then
    error("bad argument #2 to '" .. fname .. "': config table expected, got " .. type(cfg), 3)
  end
  return cfg
end

-- Run fn inside a moongraph task: directly when already in one, else in a
-- fresh mg.run (so plain scripts can call app:invoke at top level).
local function in_task(fn, ...)
  local _, main = coroutine_running()
  if not main and tasks.current() then return fn(...) end
  return tasks.run(fn, ...)
end

-- The input's keys the graph takes (its input schema; a Command passes).
local function input_of(self, input)
  local keys = self.input_keys
  if not keys or type(input) ~= "table" or control.is_command(input) then return input end
  local out = {}
  for k, v in pairs(input) do
    if keys[k] then out[k] = v end
  end
  return out
end

-- The state's keys the graph gives back (its output schema), and the
-- interrupts of a paused run.
local function output_of(self, values)
  local keys = self.output_keys
  if not keys or type(values) ~= "table" then return values end
  local out = {}
  for k, v in pairs(values) do
    if keys[k] or k == "__interrupt__" then out[k] = v end
  end
  return out
end
_M.output_of = output_of

local ALL_MODES = events.MODES
local MODE_NAMES = table.concat(ALL_MODES, ", ")
local DEFAULT_MODES = { values = true, updates = true, messages = true, custom = true }
local known_modes = {}
for _, m in ipairs(ALL_MODES) do known_modes[m] = true end

-- The modes cfg.stream_mode (or cfg.modes) asks for, as a set (called by
-- event_sink: errors are raised at the caller of the API function fname).
local function stream_modes(cfg, fname)
  local wanted = cfg.stream_mode
  if wanted == nil then wanted = cfg.modes end
  if wanted == nil then return DEFAULT_MODES end
  local list = wanted
  if type(list) == "string" then list = { list } end
  if type(list) ~= "table" then
    error("bad argument #2 to '" .. fname .. "': stream_mode must be a mode name or a list of them", 4)
  end
  local modes = {}
  for _, m in ipairs(list) do
    if not known_modes[m] then
      error("bad argument #2 to '" .. fname .. "': unknown mode '" .. tostring(m) ..
        "' (expected " .. MODE_NAMES .. ")", 4)
    end
    modes[m] = true
  end
  return modes
end

-- The engine's sink for a caller that takes events with deliver(ev):
-- the modes asked for, subgraph events left out with cfg.subgraphs =
-- false, and `values` as the graph's output schema shows them.
local function event_sink(self, cfg, fname, deliver)
  local modes = stream_modes(cfg, fname)
  if cfg.subgraphs ~= nil and type(cfg.subgraphs) ~= "boolean" then
    error("bad argument #2 to '" .. fname .. "': subgraphs must be a boolean", 3)
  end
  local root_only = cfg.subgraphs == false
  local filter = self.output_keys ~= nil
  return { modes = modes, put = function(ev)
    local ns = ev.ns
    if ns ~= nil and ns ~= "" then
      if root_only then return end
    elseif filter and ev.mode == "values" then
      ev.data = output_of(self, ev.data)
    end
    deliver(ev)
  end }
end

local function invoke(self, input, cfg, sink)
  local values, err = engine.run(self, input_of(self, input), cfg, sink)
  return output_of(self, values), err
end

--[[ invoke(input, cfg) -> output | nil, err
Runs the graph to its end (or its next interrupt: the output then carries
__interrupt__). With cfg.on_event, a function, the run's events of
cfg.stream_mode (and cfg.subgraphs) are also handed to it as they happen,
as app:stream would give them, without a task and a queue of their own:
it is called by the run's tasks, which wait while it works (it should not
block). ]]
function app:invoke(input, cfg)
  cfg = check_cfg(cfg, "invoke")
  if input ~= nil and type(input) ~= "table" then
    error("bad argument #1 to 'invoke': input table, mg.Command or nil expected, got " .. type(input), 2)
  end
  if self.checkpointer and cfg.thread_id == nil then
    error("bad argument #2 to 'invoke': thread_id is required: the graph has a checkpointer", 2)
  end
  local sink = nil
  local on_event = cfg.on_event
  if on_event ~= nil then
    if type(on_event) ~= "function" then
      error("bad argument #2 to 'invoke': on_event must be a function, got " .. type(on_event), 2)
    end
    sink = event_sink(self, cfg, "invoke", on_event)
  end
  return in_task(invoke, self, input, cfg, sink)
end

local DONE = {}

--[[ stream(input, cfg) -> iterator
Runs the graph in its own task and yields its events as they happen.
cfg.stream_mode (or cfg.modes) selects the modes (a list or a single name;
default values, updates, messages, custom); cfg.subgraphs = false leaves out
the events of subgraphs (their ns is not ""). A failed run raises its error
from the iterator once the events before the failure are consumed. Leaving
the loop early cancels the run. ]]
function app:stream(input, cfg)
  cfg = check_cfg(cfg, "stream")
  if input ~= nil and type(input) ~= "table" then
    error("bad argument #1 to 'stream': input table, mg.Command or nil expected, got " .. type(input), 2)
  end
  if self.checkpointer and cfg.thread_id == nil then
    error("bad argument #2 to 'stream': thread_id is required: the graph has a checkpointer", 2)
  end
  local q = tasks.queue()
  local sink = event_sink(self, cfg, "stream", function(ev) q:put(ev) end)
  local _, main = coroutine_running()
  if main or not tasks.current() then
    error("app:stream must be called inside a moongraph task (mg.run, mg.spawn or the CLI)", 2)
  end
  local failure = nil
  input = input_of(self, input)
  local task = tasks.spawn(function()
    local ok, values, err = pcall(engine.run, self, input, cfg, sink)
    if not ok then failure = values
    elseif values == nil then failure = err end
    q:put(DONE)
  end)
  local finished = false
  local function iter()
    if finished then return nil end
    local ev = q:get()
    if ev == DONE or ev == nil then
      finished = true
      if failure ~= nil then error(failure, 0) end
      return nil
    end
    return ev
  end
  local closer = setmetatable({}, { __close = function()
    if not task:done() then task:cancel() end
  end })
  return iter, nil, nil, closer
end

---------------------------------------------------------------------------
-- state inspection

local function need_saver(self, cfg, fname)
  if not self.checkpointer then
    error(fname .. " needs a checkpointer: compile the graph with {checkpointer = ...}", 3)
  end
  if cfg.thread_id == nil then
    error("bad argument #1 to '" .. fname .. "': thread_id is required", 3)
  end
end

local function snapshot(self, tuple, cfg)
  if not tuple then
    return { values = {}, next = {}, tasks = {}, interrupts = {},
      config = { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "" } }
  end
  local cp = tuple.checkpoint
  local by = algo.group_writes(tuple)
  local next_names, tasks, interrupts = {}, {}, {}
  local step = (cp.step or -1) + 1
  for i, e in ipairs(cp.next or {}) do
    local id = algo.task_id(step, e.node, e.send)
    next_names[i] = e.node
    local task = { id = id, name = e.node, send = e.send, arg = e.arg }
    local w = by[id]
    if w then
      local res, finished = algo.from_writes(w)
      if finished then
        task.result = res.update or {}
      elseif res.status == "interrupt" then
        task.interrupts = res.interrupts
        for _, it in ipairs(res.interrupts) do interrupts[#interrupts + 1] = it end
      elseif res.status == "error" then
        task.error = res.error
      end
    end
    tasks[i] = task
  end
  if by.__breakpoint__ then
    local res = algo.from_writes(by.__breakpoint__)
    for _, it in ipairs(res.interrupts or {}) do interrupts[#interrupts + 1] = it end
  end
  return {
    values = cp.values or {},
    next = next_names,
    tasks = tasks,
    interrupts = interrupts,
    step = cp.step,
    config = tuple.config,
    parent_config = tuple.parent_config,
    metadata = tuple.metadata,
    created_at = cp.ts,
  }
end

local function get_state(self, cfg)
  -- after the writes of a cancelled run on this thread have landed
  if cfg.thread_id ~= nil then writer.settle(self.checkpointer, tostring(cfg.thread_id)) end
  local ok, tuple, err = pcall(self.checkpointer.get, self.checkpointer, cfg)
  if not ok then return nil, errors.saver_failed("get", tuple) end
  if tuple == nil and err then return nil, err end
  return snapshot(self, tuple, cfg)
end

--[[ get_state(cfg) -> snapshot | nil, err
snapshot: values, next (node names), tasks ({id, name, send, result|error|
interrupts}), interrupts (pending, flattened), step, config, parent_config,
metadata, created_at. cfg.checkpoint_id selects a past checkpoint and
cfg.checkpoint_ns a subgraph's namespace. ]]
function app:get_state(cfg)
  cfg = check_cfg(cfg, "get_state")
  need_saver(self, cfg, "get_state")
  return in_task(get_state, self, cfg)
end

local function history(self, cfg, opts)
  local ok, list, err = pcall(self.checkpointer.list, self.checkpointer, cfg, opts)
  if not ok then return nil, errors.saver_failed("list", list) end
  if list == nil then return nil, err end
  local out = {}
  for i, tuple in ipairs(list) do out[i] = snapshot(self, tuple, cfg) end
  return out
end

--[[ get_state_history(cfg [, {limit=, before=}]) -> list of snapshots,
newest first (app:history is the same) ]]
function app:get_state_history(cfg, opts)
  cfg = check_cfg(cfg, "get_state_history")
  need_saver(self, cfg, "get_state_history")
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #2 to 'get_state_history': options table expected, got " .. type(opts), 2)
  end
  return in_task(history, self, cfg, opts or {})
end
app.history = app.get_state_history

-- The compiled graph whose checkpoints namespace ns holds: each level
-- "name:task_id[@checkpoint]" names a subgraph node of the level above.
-- -> graph | nil, the first name that is not a subgraph node
local function graph_of_ns(self, ns)
  local g = self
  for seg in string_gmatch(ns .. "|", "([^|]*)|") do
    local name = string_match(seg, "^([^:]*):")
    local spec = name and g.nodes[name]
    if not (spec and spec.sub) then return nil, name or seg end
    g = spec.sub
  end
  return g
end

--[[ update_state(cfg, values [, as_node]) -> cfg of the new checkpoint | nil, err
Writes `values` through the reducers as if node `as_node` had returned them
and saves a new checkpoint (metadata.source = "update"). With as_node, the
next nodes are the ones as_node's edges and routers lead to; without it, the
checkpoint's planned nodes stay. mg.START as as_node restarts from the entry
edges; mg.END ends the run. With cfg.checkpoint_ns of a subgraph node's run,
the subgraph's nodes, entry and reducers apply. ]]
function app:update_state(cfg, values, as_node)
  cfg = check_cfg(cfg, "update_state")
  need_saver(self, cfg, "update_state")
  if values ~= nil and type(values) ~= "table" then
    error("bad argument #2 to 'update_state': table of state values expected, got " .. type(values), 2)
  end
  local graph = self
  local ns = cfg.checkpoint_ns
  if ns ~= nil and ns ~= "" then
    if type(ns) ~= "string" then
      error("bad argument #1 to 'update_state': checkpoint_ns must be a string, got " .. type(ns), 2)
    end
    local name
    graph, name = graph_of_ns(self, ns)
    if not graph then
      error("bad argument #1 to 'update_state': checkpoint_ns '" .. ns ..
        "' is not the namespace of a subgraph node of this graph ('" .. tostring(name) ..
        "' is not a subgraph node); subgraphs run by ctx.run_subgraph cannot be updated", 2)
    end
  end
  if as_node ~= nil and as_node ~= control.START and as_node ~= control.END and not graph.nodes[as_node] then
    error("bad argument #3 to 'update_state': unknown node '" .. tostring(as_node) .. "'" ..
      (graph ~= self and " in the subgraph of that checkpoint_ns" or ""), 2)
  end
  return in_task(engine.update_state, self, cfg, values, as_node, graph)
end

---------------------------------------------------------------------------
-- rendering

function app:mermaid()
  render = render or require "moongraph.render"
  return render.mermaid(self)
end

function app:dot(opts)
  render = render or require "moongraph.render"
  return render.dot(self, opts)
end

-- draw(path [, {format =, depth =}]) -> true | nil, err: the drawing written
-- to path as svg, png or pdf (format default: path's extension, else png),
-- rendered by Graphviz. draw_png(path) and draw_svg(path) name the format.
function app:draw(path, opts)
  if type(path) ~= "string" or path == "" then
    error("bad argument #1 to 'draw': file path expected, got " .. type(path), 2)
  end
  render = render or require "moongraph.render"
  local format = opts and opts.format or path:match("%.(%a+)$")
  if format ~= "svg" and format ~= "pdf" then format = "png" end
  local bytes, err = render.image(self, format, opts)
  if not bytes then return nil, err end
  local f, ferr = io.open(path, "wb")
  if not f then return nil, ferr end
  local ok, werr = f:write(bytes)
  local cok, cerr = f:close()
  if not ok or not cok then return nil, tostring(werr or cerr) end
  return true
end

function app:draw_png(path, opts)
  local o = { format = "png" }
  for k, v in pairs(opts or {}) do if k ~= "format" then o[k] = v end end
  return self:draw(path, o)
end

function app:draw_svg(path, opts)
  local o = { format = "svg" }
  for k, v in pairs(opts or {}) do if k ~= "format" then o[k] = v end end
  return self:draw(path, o)
end

return _M
