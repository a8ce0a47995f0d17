--[[
moongraph.engine.loop — a run: bulk-synchronous supersteps until END.

  plan     the tasks of the step (engine/algo.lua)
  run      every task at once, one coroutine each (engine/runner.lua)
  barrier  apply the writes in plan order through the reducers, record the
           step's tasks, plan the next step, save a checkpoint

A run context (`run`) holds everything one run, or one subgraph run, needs:
  app, nodes, reducers, cfg, ns, limit, root      the graph and the caller's config
  values, step, barriers, deferred, records       the state of the run
  saver, writer, thread_id, exit                  persistence (saver nil: none)
  cp_id, saved_id, last_id, own_id, cp_cfg        the checkpoint chain (own_id:
                                                  the last id this run made;
                                                  cp_cfg: writer.current_cfg)
  sink, trace                                     streaming and tracing (or nil)
  snap, snap_src, written   the async writer's last copy of the values,
                  the values it was made of, and the keys a write reached
                  since (engine/writer.lua snapshot_values)
  copy_on_write   old state snapshots stay referenced (stream, durability
                  exit): the barrier copies the state instead of updating it
                  in place
  observed        something records tasks (saver, stream, trace): task ids,
                  stream events and trace spans are made
  records_kept    the run keeps task records (observed, or a node or router
                  could read ctx.previous_tasks)
  loop            this module (tasks reach subgraphs through it)

  loop.run(app, input, cfg [, sink]) -> values | nil, err    a root run
  loop.run_subgraph(run, ctx, app, input, name [, on_event]) -> values, update
  loop.subgraph_node(run, spec, input, ctx) -> update        a subgraph node
  loop.update_state(app, cfg, values, as_node, graph)        see compiled_graph
]]

local type, pairs, ipairs, tostring, error, pcall, next, setmetatable =
  type, pairs, ipairs, tostring, error, pcall, next, setmetatable
local table_concat = table.concat

local errors = require "moongraph.errors"
local saver_failed = errors.saver_failed
local tasks = require "moongraph.tasks"
local control = require "moongraph.control"
local algo = require "moongraph.engine.algo"
local branch = require "moongraph.engine.branch"
local runner = require "moongraph.engine.runner"
local writer = require "moongraph.engine.writer"
local checkpoint = require "moongraph.engine.checkpoint"
local events = require "moongraph.engine.events"
local subgraph = require "moongraph.engine.subgraph"
local context = require "moongraph.engine.context"

local is_command = control.is_command
local emit = events.emit

local _M = {}

-- the state before any input: shared, never written
local EMPTY_STATE = setmetatable({}, { __newindex = function()
  error("internal: write to the shared empty state", 2) end })

---------------------------------------------------------------------------
-- run contexts

local function observe(run)
  -- a saver takes the data of a checkpoint when it is given it (or the
  -- async writer copies it then); only a stream's events and the latest
  -- checkpoint kept for the end under durability exit hold on to the state
  run.copy_on_write = (run.sink or run.exit) and true or false
  run.observed = (run.saver or run.sink or run.trace) and true or false
  run.records_kept = run.observed or run.app.records_seen
end

local function new_run(app, cfg, parent, ns, sink, trace)
  if parent then sink, trace = parent.sink, parent.trace end
  -- one constructor with every field: the table is sized once
  local run = {
    app = app, nodes = app.nodes, reducers = app.reducers, cfg = cfg,
    ns = ns or "", limit = (not parent and cfg.recursion_limit) or app.recursion_limit,
    values = nil, step = -1, root = not parent, records = nil,
    saver = nil, writer = nil, thread_id = nil, exit = nil,
    sink = sink, trace = trace, copy_on_write = false, observed = false, records_kept = false,
    cp_id = nil, cp_parent = nil, saved_id = nil, last_id = nil, own_id = nil, cp_cfg = nil,
    barriers = nil, deferred = nil, results = nil, inline_res = nil, store = nil,
    saved_writes = nil, writes_scratch = nil, cp_scratch = nil, metadata = nil, loop = _M,
    snap = nil, snap_src = nil, written = nil,
  }
  run.store = app.store
  if parent then
    run.saver, run.writer, run.thread_id = parent.saver, parent.writer, parent.thread_id
    run.metadata = parent.metadata
    run.store = run.store or parent.store
  else
    local saver = app.checkpointer
    if saver then
      if cfg.thread_id == nil then
        error("bad argument #2 to 'invoke': thread_id is required: the graph has a checkpointer", 0)
      end
      run.saver = saver
      run.thread_id = tostring(cfg.thread_id)
      local mode = cfg.durability or app.durability
      if mode ~= "sync" and mode ~= "async" and mode ~= "exit" then
        error("bad argument #2 to 'invoke': durability must be \"sync\", \"async\" or \"exit\"", 0)
      end
      if cfg.drop_unsaved ~= nil and type(cfg.drop_unsaved) ~= "boolean" then
        error("bad argument #2 to 'invoke': drop_unsaved must be a boolean", 0)
      end
      if cfg.on_first_save ~= nil and type(cfg.on_first_save) ~= "function" then
        error("bad argument #2 to 'invoke': on_first_save must be a function", 0)
      end
      if cfg.metadata ~= nil and type(cfg.metadata) ~= "table" then
        error("bad argument #2 to 'invoke': metadata must be a table", 0)
      end
      run.metadata = cfg.metadata
      run.writer = writer.new(saver, mode, run.thread_id, cfg.drop_unsaved, cfg.on_first_save)
    end
  end
  if run.writer and run.writer.mode == "exit" then run.exit = { writes = {} } end
  run.values = EMPTY_STATE
  observe(run)
  return run
end
_M.new_run = new_run

-- Run contexts of plain runs (no saver, stream or trace) are recycled per
-- graph: such a run allocates no context table and no result buffer. They
-- never reach user code (a node's ctx is made per task).
local POOL_MAX = 8

local function acquire(app, cfg)
  local pool = app.pool
  local n = #pool
  if n == 0 then
    local run = new_run(app, cfg, nil, nil, nil, nil)
    run.pooled = true
    return run
  end
  local run = pool[n]
  pool[n] = nil
  run.cfg = cfg
  run.limit = cfg.recursion_limit or app.recursion_limit
  run.values, run.step = EMPTY_STATE, -1
  return run
end

local function release(run)
  local pool = run.app.pool
  run.cfg, run.values, run.barriers, run.deferred = nil, nil, nil, nil
  local records = run.records
  if records then
    for i = #records, 1, -1 do records[i] = nil end
  end
  if run.results then run.results[1] = nil end
  if #pool < POOL_MAX then pool[#pool + 1] = run end
end

---------------------------------------------------------------------------
-- the superstep loop

local function interrupted(run, list)
  local out = {}
  for k, v in pairs(run.values) do out[k] = v end
  out.__interrupt__ = list
  return out
end

-- static breakpoints: a marker write so that resuming does not stop again
local function breakpoint(run, plan, when, set)
  if not set then return nil end
  local hit = {}
  for _, t in ipairs(plan) do
    if set == "*" or set[t.node] then hit[#hit + 1] = t.node end
  end
  if not hit[1] then return nil end
  if not run.saver then
    error("interrupt_" .. when .. " needs a checkpointer: compile the graph with {checkpointer = ...}", 0)
  end
  local rec = { { id = when .. ":" .. (run.step + (when == "before" and 1 or 0)), when = when,
    nodes = hit, ns = run.ns } }
  if when == "before" then
    writer.save_writes(run, "__breakpoint__", { { "__interrupt__", rec } })
  end
  return rec
end

--[[ loop(run, plan, results, cmd, skip_before) -> values | nil, err
results: preset results of finished tasks; cmd: the caller's Command as a
pseudo-task result applied first at the barrier. ]]
local function loop(run, plan, results, cmd, skip_before)
  local steps = 0
  local app = run.app
  while plan[1] do
    if steps >= run.limit then
      local names = {}
      for i, t in ipairs(plan) do names[i] = t.node end
      return nil, "recursion limit of " .. run.limit .. " supersteps reached without hitting END (next: " ..
        table_concat(names, ", ") .. "); raise recursion_limit if the graph needs more steps"
    end
    steps = steps + 1
    if not skip_before and app.interrupt_before then
      local rec = breakpoint(run, plan, "before", app.interrupt_before)
      if rec then return interrupted(run, rec) end
    end
    skip_before = false
    if not results then
      if plan[2] then
        results = {}
      else
        results = run.results
        if not results then results = {}; run.results = results end
        results[1] = nil
      end
    end
    local span = run.trace and run.trace:begin_step(run.step + 1, #plan)
    local fatal = runner.run_step(run, plan, results)
    if span then run.trace:finish(span) end
    if fatal then return nil, fatal end
    local ints = nil
    for i = 1, #plan do
      local res = results[i]
      if res.status == "interrupt" then
        ints = ints or {}
        for _, it in ipairs(res.interrupts) do ints[#ints + 1] = it end
      end
    end
    if ints then return interrupted(run, ints) end
    local ok, values = pcall(algo.apply_writes, run, plan, results, cmd)
    if not ok then return nil, values end
    run.values = values
    run.step = run.step + 1
    if run.records_kept then
      -- the step's result records are the run's records of its tasks
      local records = run.records
      if not records then records = {}; run.records = records end
      local nr = #records
      for i = 1, #plan do records[nr + i] = results[i] end
    end
    local nextp = algo.plan_next(run, plan, results, cmd)
    if run.saver then
      local ran
      if not plan[2] and not run.sink then
        local lists = run.nodes[plan[1].node].saved_lists
        ran = lists and lists.ran or checkpoint.shared_list(run, plan[1].node, "ran")
      else
        ran = {}
        for i, t in ipairs(plan) do ran[i] = t.node end
      end
      checkpoint.save(run, nextp, "loop", ran)
      if run.writer.err then return nil, run.writer.err end
    end
    if run.sink then emit(run, "values", nil, nil, values) end
    if app.interrupt_after then
      local rec = breakpoint(run, plan, "after", app.interrupt_after)
      if rec then return interrupted(run, rec) end
    end
    plan, results, cmd = nextp, nil, nil
  end
  return run.values
end

---------------------------------------------------------------------------
-- where a run begins

-- resume values for interrupted tasks -> nil | error message
local function assign_resume(run, plan, results, pending, resume)
  local owners = {}     -- { {task=, list={interrupt records}} }
  local total, all_ids = 0, {}
  for i, t in ipairs(plan) do
    local p = pending[t.id]
    if results[i] == nil and p and p.interrupts then
      for _, it in ipairs(p.interrupts) do
        all_ids[#all_ids + 1] = it.id
      end
      total = total + #p.interrupts
      owners[#owners + 1] = { task = t, list = p.interrupts }
    end
  end
  if total == 0 then
    return "nothing to resume: thread '" .. tostring(run.thread_id) .. "' has no pending interrupt"
  end
  local map = nil
  if type(resume) == "table" and not is_command(resume) and next(resume) ~= nil then
    local known = {}
    for _, id in ipairs(all_ids) do known[id] = true end
    map = true
    for k in pairs(resume) do
      if not known[k] then map = nil break end
    end
    if map then map = resume end
  end
  if not map and total > 1 then
    return total .. " interrupts are pending (" .. table_concat(all_ids, ", ") ..
      "); resume with a table mapping each interrupt id to its value"
  end
  for _, o in ipairs(owners) do
    local t = o.task
    -- interrupts raised inside a subgraph the task ran (a subgraph node, or
    -- ctx.run_subgraph) resume that subgraph; the node's own ctx.interrupt
    -- calls get their value in t.resume
    local own, inner, inner_ns = nil, nil, {}
    local sub_node = run.nodes[t.node].sub ~= nil
    for _, it in ipairs(o.list) do
      if it.ns ~= nil and it.ns ~= run.ns then
        inner = inner or {}
        inner[#inner + 1] = it.id
        if inner_ns then inner_ns[#inner_ns + 1] = it.ns end
      elseif it.ns == nil and sub_node then
        -- a record without its namespace: the subgraph node's one subgraph
        inner = inner or {}
        inner[#inner + 1] = it.id
        inner_ns = nil
      else
        own = it.id
      end
    end
    if inner then
      local cmd = resume
      if map then
        cmd = {}
        for _, id in ipairs(inner) do if map[id] ~= nil then cmd[id] = map[id] end end
        if not next(cmd) then cmd = nil end
      end
      t.resume_cmd, t.resume_ns = cmd, inner_ns
    end
    if own then
      local v
      if map then v = map[own] else v = resume end
      if v ~= nil then
        local list = {}
        for i, x in ipairs(t.resume or {}) do list[i] = x end
        list[#list + 1] = v
        t.resume = list
        writer.save_writes(run, t.id, { { "__resume__", list } })
      end
    end
  end
  return nil
end

-- The saver's tuple of the thread (at cfg.checkpoint_id when given) and the
-- id of its latest checkpoint. -> tuple, latest | nil, nil, err
local function saved(run, cfg)
  local saver = run.saver
  local want_id = run.root and cfg.checkpoint_id or nil
  if run.root and not want_id and cfg.checkpoint_tuple ~= nil then
    -- the caller has just read the thread's latest from this same saver
    -- (false: it has none)
    local given = cfg.checkpoint_tuple
    if given == false then return nil, nil end
    if type(given) ~= "table" or type(given.checkpoint) ~= "table" then
      return nil, nil, "bad argument #2 to 'invoke': checkpoint_tuple must be a saver's tuple or false"
    end
    return given, given.checkpoint.id
  end
  local ok, got, err = pcall(saver.get, saver, {
    thread_id = run.thread_id, checkpoint_ns = run.ns, checkpoint_id = want_id })
  if not ok then return nil, nil, saver_failed("get", got) end
  if got == nil and err then return nil, nil, saver_failed("get", err) end
  if want_id and got == nil then
    return nil, nil, errors.new("not_found",
      "checkpoint '" .. tostring(want_id) .. "' not found in thread '" .. run.thread_id .. "'")
  end
  local latest = got and got.checkpoint.id
  if want_id then
    local lok, l = pcall(saver.get, saver, { thread_id = run.thread_id, checkpoint_ns = run.ns })
    latest = lok and l and l.checkpoint.id or latest
  end
  return got, latest
end

--[[ start(run, input, cfg, resume_cmd) -> values | nil, err
Decide where the run begins (fresh input, resume, caller Command) and run
the loop. ]]
local function start(run, input, cfg, resume_cmd)
  local saver = run.saver
  local tuple, latest = nil, nil
  local want_id = run.root and cfg.checkpoint_id or nil
  if saver then
    local err
    if run.root then writer.settle(saver, run.thread_id) end
    tuple, latest, err = saved(run, cfg)
    if err then return nil, err end
    run.last_id = latest
  end
  local forked = want_id ~= nil and latest ~= want_id
  -- the first checkpoint of a fork extends an older one: the saver checks
  -- the namespace's latest against what this run saw instead
  if forked then run.fork_head = latest end
  if not run.root and tuple then
    -- a subgraph namespace belongs to one task of its parent: what is saved
    -- there is this same task's earlier, interrupted or crashed, attempt
    input = nil
    if not (tuple.checkpoint.next and tuple.checkpoint.next[1]) then resume_cmd = nil end
  end

  local cmd = nil
  if is_command(input) then
    cmd = input
    input = nil
  elseif resume_cmd ~= nil then
    cmd = control.Command { resume = resume_cmd }
  end

  -- pending run: resume it (input nil, or a Command)
  if input == nil and tuple and tuple.checkpoint.next and tuple.checkpoint.next[1] then
    local plan = checkpoint.restore(run, tuple, true)
    local by = forked and {} or algo.group_writes(tuple)
    run.saved_writes = by
    local results, pending = {}, {}
    for i, t in ipairs(plan) do
      local w = by[t.id]
      if w then
        local res, finished = algo.from_writes(w, t, run.step + 1)
        if finished then
          results[i] = res
        else
          pending[t.id] = res
          t.resume = res.resume
        end
      end
    end
    local skip_before = by["__breakpoint__"] ~= nil
    local cmd_res = nil
    local cmd_id = algo.task_id(run.step + 1, "__command__")
    if cmd and cmd.resume ~= nil then
      local err = assign_resume(run, plan, results, pending, cmd.resume)
      if err and not skip_before then return nil, err end
    end
    if cmd and (cmd.update or cmd.to) then
      cmd_res = { status = "done", update = cmd.update }
      if cmd.to ~= nil then
        local err = branch.add_targets(run, cmd_res, cmd.to, nil, "Command.to")
        if err then return nil, err end
      end
      if saver then writer.save_writes(run, cmd_id, algo.to_writes(cmd_res)) end
    elseif by[cmd_id] then
      cmd_res = algo.from_writes(by[cmd_id])
    end
    return loop(run, plan, results, cmd_res, skip_before)
  end

  -- a new run (or a Command on a thread with nothing pending)
  if cmd and cmd.resume ~= nil then
    if not saver then
      return nil, "nothing to resume: Command{resume=...} needs a checkpointer and a thread_id"
    end
    return nil, "nothing to resume: thread '" .. run.thread_id .. "' has no pending interrupt"
  end
  if input == nil and not cmd then
    if tuple then return tuple.checkpoint.values or {} end
    if saver then
      return nil, "nothing to resume: thread '" .. run.thread_id .. "' has no checkpoint"
    end
    error("bad argument #1 to 'invoke': input table expected (nil resumes a thread, which needs a checkpointer)", 0)
  end
  if tuple then
    run.values = tuple.checkpoint.values or {}
    run.step = tuple.checkpoint.step or -1
    run.cp_id = tuple.checkpoint.id
    run.saved_id = tuple.checkpoint.id
  end
  if run.records and not run.pooled then run.records = nil end
  local update = input or (cmd and cmd.update)
  if update ~= nil then
    if type(update) ~= "table" then
      error("bad argument #1 to 'invoke': input must be a table of state values, got " .. type(update), 0)
    end
    local ok, v = pcall(algo.apply_input, run, run.values, update)
    if not ok then return nil, "input: " .. tostring(v) end
    run.values = v
  end
  if run.values == EMPTY_STATE then run.values = {} end
  run.step = run.step + 1
  local plan, err
  if cmd and cmd.to ~= nil then
    local res = { status = "done" }
    err = branch.add_targets(run, res, cmd.to, nil, "Command.to")
    if err then return nil, err end
    plan = algo.plan_of_targets(run, res)
  else
    plan, err = algo.plan_start(run)
    if not plan then return nil, err end
  end
  if saver then
    checkpoint.save(run, plan, "input", nil)
    if run.writer.err then return nil, run.writer.err end
  end
  emit(run, "values", nil, nil, run.values)
  return loop(run, plan, nil, nil, false)
end

--[[ run(app, input, cfg, sink) -> values | nil, err : the root of a run.
sink: nil, or the stream's {modes = {mode = true}, put = function(event)}. ]]
function _M.run(app, input, cfg, sink)
  local trace = nil
  if cfg.trace then
    local terr
    trace, terr = require("moongraph.trace").new(cfg.trace, tasks.now)
    if not trace then return nil, terr end
  end
  if not (sink or trace or app.checkpointer) then
    local run = acquire(app, cfg)
    local ok, values, err = pcall(start, run, input, cfg)
    release(run)
    if not ok then error(values, 0) end
    return values, err
  end
  local run = new_run(app, cfg, nil, nil, sink, trace)
  local guard <close> = run.writer and setmetatable({}, { __close = function() writer.close(run) end }) or nil
  local ok, values, err = pcall(start, run, input, cfg)
  local fok, ferr = true, nil
  if run.writer then fok, ferr = writer.flush(run) end
  if trace then
    local tok, terr = trace:write()
    if not tok and ok and values then values, err = nil, terr end
  end
  if not ok then error(values, 0) end
  if values == nil then return nil, err end
  if not fok then return nil, ferr end
  return values
end

---------------------------------------------------------------------------
-- subgraphs

--[[ Before a retry attempt of task t runs the subgraph of namespace ns
again: every write the earlier attempts made there must be in the saver, so
that the subgraph resumes from its last checkpoint under every durability
(async: the writer's queue drained; exit: the buffer of an attempt cut short
by its timeout saved). ]]
local function settle(run, t, ns)
  local w = run.writer
  if w.mode == "async" then
    if w.q then writer.drain(w) end
  elseif w.mode == "exit" then
    local left = t.sub_exit and t.sub_exit[ns]
    if left then
      t.sub_exit[ns] = nil
      writer.flush(left)
    end
  end
  if w.err then error(w.err, 0) end
end

local ALL_MODES = {}
for _, m in ipairs(events.MODES) do ALL_MODES[m] = true end

--[[ run_subgraph(run, ctx, sub, input, name [, on_event]) -> final state, update
Runs compiled graph `sub` inside the task of ctx: namespace
parent_ns|name:task_id[@checkpoint], the parent's checkpointer, stream and
trace. on_event(ev), when given, sees every event of the subgraph (and of
the subgraphs it runs) whatever the parent's stream asked for. A failure is
raised as its message, interrupts inside as an interrupt of the task.
update: see engine/subgraph.lua write_back. ]]
function _M.run_subgraph(run, ctx, sub, input, name, on_event)
  local t = context.task_of(ctx)
  local ns = (run.ns ~= "" and (run.ns .. "|") or "") .. name .. ":" .. ctx.task_id
  if run.cp_id then ns = ns .. "@" .. run.cp_id end
  if not context.claim_namespace(ctx, ns) then
    error("node '" .. ctx.node .. "' ran two subgraphs in namespace '" .. ns ..
      "'; give each call its own ns_suffix", 0)
  end
  if run.writer and ctx.attempt > 1 then settle(run, t, ns) end
  local sub_run = new_run(sub, run.cfg, run, ns)
  if on_event then
    local outer = run.sink
    sub_run.sink = { modes = ALL_MODES, put = function(ev)
      on_event(ev)
      if outer and outer.modes[ev.mode] then outer.put(ev) end
    end }
    observe(sub_run)
  end
  if sub_run.exit then
    -- kept until saved: a timeout may cancel this attempt before it ends
    local pending = t.sub_exit
    if not pending then pending = {}; t.sub_exit = pending end
    pending[ns] = sub_run
  end
  local resume_cmd = nil
  if t.resume_cmd ~= nil and subgraph.holds(t.resume_ns, ns) then
    resume_cmd = t.resume_cmd
    t.resume_cmd, t.resume_ns = nil, nil
  end
  -- the subgraph takes its input schema's part of what it is given
  local sub_input = input
  if sub.input_keys then
    sub_input = {}
    for k, v in pairs(input) do if sub.input_keys[k] then sub_input[k] = v end end
  end
  local values, err = start(sub_run, sub_input, run.cfg, resume_cmd)
  local fok, ferr = writer.flush(sub_run)
  if sub_run.exit then t.sub_exit[ns] = nil end
  if values == nil then error(err, 0) end
  if not fok then error(ferr, 0) end
  if values.__interrupt__ then
    error(control.interrupt_error(values.__interrupt__), 0)
  end
  -- what the subgraph gives back is its output schema's part of its state
  local out = values
  if sub.output_keys then
    out = {}
    for k, v in pairs(values) do if sub.output_keys[k] then out[k] = v end end
  end
  return out, subgraph.write_back(run, input, out)
end

--[[ subgraph_node(run, spec, input, ctx) -> update for the parent
A compiled graph as the body of a node: run in the namespace of the node's
task. What the subgraph changed in the keys the parent declares is written
back through the parent's reducers. ]]
function _M.subgraph_node(run, spec, input, ctx)
  if type(input) ~= "table" then
    error("subgraph node '" .. ctx.node .. "' needs a table as input, got " .. type(input), 0)
  end
  local _, up = _M.run_subgraph(run, ctx, spec.sub, input, ctx.node, nil)
  return up
end

---------------------------------------------------------------------------
-- update_state

--[[ update_state(app, cfg, values, as_node, graph) -> cfg of the new
checkpoint | nil, err. graph: the compiled graph whose namespace
cfg.checkpoint_ns is (app itself at the root). ]]
function _M.update_state(app, cfg, values, as_node, graph)
  local run = new_run(app, cfg, nil, cfg.checkpoint_ns or "")
  run.writer.mode = "sync"
  run.exit = nil
  -- a subgraph's namespace: its own nodes, entry and reducers
  run.app, run.nodes, run.reducers = graph, graph.nodes, graph.reducers
  local saver = app.checkpointer
  writer.settle(saver, run.thread_id)
  local ok, tuple, err = pcall(saver.get, saver, cfg)
  if not ok then return nil, saver_failed("get", tuple) end
  if tuple == nil and err then return nil, err end
  if cfg.checkpoint_id and not tuple then
    return nil, errors.new("not_found", "checkpoint '" .. tostring(cfg.checkpoint_id) .. "' not found")
  end
  local lok, latest = pcall(saver.get, saver, { thread_id = cfg.thread_id, checkpoint_ns = run.ns })
  run.last_id = lok and latest and latest.checkpoint.id or nil
  if cfg.checkpoint_id and run.last_id ~= cfg.checkpoint_id then run.fork_head = run.last_id end
  local base_plan = {}
  if tuple then
    local rok, plan = pcall(checkpoint.restore, run, tuple)
    if not rok then return nil, tostring(plan) end
    base_plan = plan
  end
  local aok, v = pcall(algo.apply_input, run, run.values or {}, values or {})
  if not aok then return nil, tostring(v) end
  run.values = v
  local plan
  if as_node == nil then
    plan = base_plan
  elseif as_node == control.END then
    plan = {}
  elseif as_node == control.START then
    plan = algo.plan_start(run)
  else
    local spec = graph.nodes[as_node]
    local res = { status = "done" }
    if spec.branches[1] then
      local rerr = branch.route(run, spec, run.values, res, {
        node = as_node, config = cfg, ns = run.ns, step = run.step + 1 })
      if rerr then return nil, rerr end
    end
    plan = algo.plan_after(run, spec, res)
  end
  run.step = run.step + 1
  checkpoint.save(run, plan, "update", { as_node })
  if run.writer.err then return nil, run.writer.err end
  if as_node == nil and tuple and base_plan[1] then
    local by = algo.group_writes(tuple)
    if by.__breakpoint__ then
      local ok2, e2 = pcall(saver.put_writes, saver, {
        thread_id = cfg.thread_id, checkpoint_ns = run.ns, checkpoint_id = run.cp_id,
      }, "__breakpoint__", by.__breakpoint__)
      if not ok2 then return nil, tostring(e2) end
    end
  end
  return { thread_id = cfg.thread_id, checkpoint_ns = run.ns, checkpoint_id = run.cp_id }
end

return _M
