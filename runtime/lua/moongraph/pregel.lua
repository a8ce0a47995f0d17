--[[
moongraph.pregel — the superstep runner.

A run is a loop of bulk-synchronous supersteps:

  plan    the tasks of the step: edge-triggered nodes (sorted by name), then
          Send packets (in send order)
  run     every task at once, one coroutine each (a step with a single task
          runs in the caller's coroutine: same semantics, no spawn)
  barrier apply the writes in plan order through the reducers, work out the
          next plan from edges, joins, routes and Sends, save a checkpoint

With a checkpointer every finished task's writes are saved at once as
pending writes of the checkpoint the step started from, so a run killed in
the middle of a step resumes by re-running only the tasks without writes.

The run context R holds everything one run (or one subgraph run) needs:
  app, nodes, reducers, cfg, ns, limit       the graph and the caller's config
  values, step, barriers, deferred           the state of the run
  saver, io, thread_id, cp_id, last_id       persistence (saver == nil: none)
  sink, trace                                streaming and tracing (or nil)
]]

local type, pairs, ipairs, tostring, error, pcall, next, setmetatable, rawget =
  type, pairs, ipairs, tostring, error, pcall, next, setmetatable, rawget
local table_sort, table_concat = table.sort, table.concat
local string_format = string.format
local math_floor, os_time, os_date = math.floor, os.time, os.date

local control = require "moongraph.control"
local reducers = require "moongraph.reducers"
local executor = require "moongraph.executor"

local START, END = control.START, control.END
local is_command = control.is_command
local batch = reducers.batch
local exec_run = executor.run

local _M = {}

-- the state before any input: shared, never written
local EMPTY_STATE = setmetatable({}, { __newindex = function()
  error("internal: write to the shared empty state", 2) end })

local rt
local function runtime()
  if not rt then
    local mg = require "moongraph"
    rt = { spawn = mg.spawn, queue = mg.queue, now = mg.now, current = mg.current, run = mg.run }
  end
  return rt
end
_M.runtime = runtime

-- Checkpoint ids: fixed-width hex of (milliseconds since the epoch * 1024 +
-- sequence), always above every id already in the thread, so ids sort in
-- creation order even across processes and clock steps.
local wall0, mono0, last_int = nil, nil, 0
local function new_id(R)
  local now = runtime().now()
  if not wall0 then wall0, mono0 = os_time() * 1000, now end
  local v = (wall0 + math_floor((now - mono0) * 1000)) * 1024
  if v <= last_int then v = last_int + 1 end
  local after = R.last_id and tonumber(R.last_id, 16)
  if after and v <= after then v = after + 1 end
  last_int = v
  local id = string_format("%016x", v)
  R.last_id = id
  return id
end

local function iso_now()
  return os_date("!%Y-%m-%dT%H:%M:%SZ")
end

---------------------------------------------------------------------------
-- persistence: durability sync (await each write), async (one writer task
-- per run issues writes in order while the run goes on), exit (keep the
-- latest checkpoint and its writes, save them when the run ends)

local function saver_call(io, op, a, b, c)
  local ok, r1, r2 = pcall(io.saver[op], io.saver, a, b, c)
  if not ok then
    io.err = "checkpointer " .. op .. " failed: " .. tostring(r1)
  elseif r1 == nil then
    io.err = "checkpointer " .. op .. " failed: " .. tostring(r2)
  end
end

--[[ The async writer: issues the run's writes in order. A saver that sets
`concurrent_writes = n` gets up to n writes in flight at once (the file
saver's fsyncs then share journal commits); two writes to the same target
(the same task's writes of one checkpoint) still complete in order. Order
between different targets does not matter for recovery: a later checkpoint
already holds the results of every pending write of the earlier ones. ]]
local function writer_loop(io)
  local q = io.q
  local limit = io.limit
  local inflight, busy, done = 0, {}, nil
  local function one(job)
    saver_call(io, job.op, job.a, job.b, job.c)
    busy[job.key] = nil
    done:put(true)
  end
  while true do
    local job = q:get()
    if job == nil then return end
    if job.flush then
      while inflight > 0 do done:get(); inflight = inflight - 1 end
      job.flush:put(true)
    elseif not io.err then
      if limit <= 1 then
        saver_call(io, job.op, job.a, job.b, job.c)
      else
        done = done or runtime().queue()
        while inflight >= limit or busy[job.key] do
          done:get()
          inflight = inflight - 1
        end
        busy[job.key] = true
        inflight = inflight + 1
        runtime().spawn(one, job)
      end
    end
  end
end

local function io_op(R, op, a, b, c)
  local io = R.io
  if io.err then return end
  local mode = io.mode
  if mode == "sync" then
    saver_call(io, op, a, b, c)
  elseif mode == "async" then
    if not io.q then
      local n = io.saver.concurrent_writes
      io.limit = type(n) == "number" and n >= 1 and n or 1
      io.q = runtime().queue()
      io.task = runtime().spawn(writer_loop, io)
    end
    -- the target: a checkpoint, or one task's writes for a checkpoint
    local key = op == "put" and b.id or (a.checkpoint_ns .. "\0" .. a.checkpoint_id .. "\0" .. b)
    io.q:put { op = op, a = a, b = b, c = c, key = key }
  else -- exit: remember the latest checkpoint of this namespace and its writes
    local ex = R.exit
    if op == "put" then
      ex.put = { a, b, c }
      ex.writes = {}
    else
      ex.writes[#ex.writes + 1] = { a, b, c }
    end
  end
end

local function cp_cfg(R, id)
  return { thread_id = R.thread_id, checkpoint_ns = R.ns, checkpoint_id = id }
end

-- async: wait until the writer has issued and finished every queued write
local function io_drain(io)
  local reply = runtime().queue()
  io.q:put { flush = reply }
  reply:get()
end

-- Wait until every write of this run is issued and done -> true | nil, err
local function io_flush(R)
  local io = R.io
  if not io then return true end
  if io.mode == "exit" then
    local ex = R.exit
    if ex.put then
      local p = ex.put
      ex.put = nil
      -- the parent is the last checkpoint actually saved in this namespace
      p[1] = cp_cfg(R, R.saved_id)
      saver_call(io, "put", p[1], p[2], p[3])
      for _, w in ipairs(ex.writes) do
        if io.err then break end
        saver_call(io, "put_writes", w[1], w[2], w[3])
      end
      ex.writes = {}
    end
  elseif io.mode == "async" and io.q and R.root then
    io_drain(io)
  end
  if io.err then return nil, io.err end
  return true
end

local function io_close(R)
  local io = R.io
  if io and R.root and io.q then
    io.q:close()
    io.q = nil
  end
end

local function save_writes(R, task_id, writes)
  io_op(R, "put_writes", cp_cfg(R, R.cp_id), task_id, writes)
end

-- result record -> list of {channel, value} for put_writes
local function to_writes(res, resume)
  local w = {}
  local st = res.status
  if st == "done" then
    local up = res.update
    if up then
      local keys = {}
      for k in pairs(up) do keys[#keys + 1] = k end
      table_sort(keys)
      for i, k in ipairs(keys) do w[i] = { k, up[k] } end
    end
    if res.route then w[#w + 1] = { "__route__", res.route } end
    if res.sends then
      local s = {}
      for i, p in ipairs(res.sends) do s[i] = { node = p.node, arg = p.arg } end
      w[#w + 1] = { "__send__", s }
    end
    if res.ran then w[#w + 1] = { "__ran__", res.ran } end
    if res.failed then w[#w + 1] = { "__failed__", true } end
  elseif st == "interrupt" then
    if resume then w[#w + 1] = { "__resume__", resume } end
    local list = {}
    for i, it in ipairs(res.interrupts) do
      list[i] = { id = it.id, value = it.value, node = it.node, ns = it.ns }
    end
    w[#w + 1] = { "__interrupt__", list }
  else
    w[#w + 1] = { "__error__", res.error }
  end
  return w
end
_M.to_writes = to_writes

-- list of {channel, value} -> result record (finished) or a partial record
-- (unfinished: error, interrupt and resume values only)
local function from_writes(writes)
  local res = { status = "done" }
  local finished = false
  for _, w in ipairs(writes) do
    local ch, v = w[1], w[2]
    if ch == "__error__" then
      res.status, res.error = "error", v
    elseif ch == "__interrupt__" then
      res.status, res.interrupts = "interrupt", v
    elseif ch == "__resume__" then
      res.resume = v
    elseif ch == "__route__" then
      res.route, finished = v, true
    elseif ch == "__send__" then
      local s = {}
      for i, p in ipairs(v) do s[i] = control.Send(p.node, p.arg) end
      res.sends, finished = s, true
    elseif ch == "__ran__" then
      res.ran, finished = v, true
    elseif ch == "__failed__" then
      res.failed = true
    elseif ch == "__done__" then
      finished = true
    else
      res.update = res.update or {}
      res.update[ch] = v
      finished = true
    end
  end
  if res.status ~= "done" then finished = false end
  return res, finished
end
_M.from_writes = from_writes

---------------------------------------------------------------------------
-- events

local function emit(R, mode, node, task_id, data)
  local sink = R.sink
  if sink and sink.modes[mode] then
    sink.put { mode = mode, node = node, task_id = task_id, ns = R.ns, step = R.step, data = data }
  end
end

local function task_label(t)
  if t.send then return "'" .. t.node .. "' (send " .. t.send .. ")" end
  return "'" .. t.node .. "'"
end

local function on_start(R, t)
  local sink = R.sink
  if sink then
    local m = sink.modes
    if m.tasks or m.debug then
      local data = { event = "start", name = t.node, id = t.id, send = t.send,
        input = t.send and t.arg or R.values }
      emit(R, "tasks", t.node, t.id, data)
      emit(R, "debug", t.node, t.id, { type = "task", step = R.step + 1, task = data })
    end
  end
  if R.trace then t.span = R.trace:begin(t.node, { task_id = t.id, ns = R.ns, step = R.step + 1 }) end
end

local function on_finish(R, t, res)
  if t.span then R.trace:finish(t.span, res.status) end
  local sink = R.sink
  if sink then
    local m = sink.modes
    if m.updates and res.status == "done" then
      emit(R, "updates", t.node, t.id, res.update or {})
    end
    if m.tasks or m.debug then
      local data = { event = "result", name = t.node, id = t.id, send = t.send, status = res.status,
        result = res.update, error = res.error, interrupts = res.interrupts, ran = res.ran,
        cached = res.cached }
      emit(R, "tasks", t.node, t.id, data)
      emit(R, "debug", t.node, t.id, { type = "task_result", step = R.step + 1, task = data })
    end
  end
  if R.saver then
    local w = to_writes(res, t.resume)
    if not w[1] then w[1] = { "__done__", true } end
    save_writes(R, t.id, w)
  end
end

---------------------------------------------------------------------------
-- running the tasks of one step

local function worker(R, t, i, results, q)
  local ok, res = pcall(exec_run, R, t)
  if not ok then
    res = { status = "error", error = "task " .. task_label(t) .. " failed inside the engine: " .. tostring(res) }
  end
  results[i] = res
  q:put(i)
end

-- cancels the step's tasks still running when the runner stops early
-- (fail_close, or the run itself cancelled: a stream left early, a timeout)
local function cancel_rest(handles)
  for _, h in pairs(handles) do
    if not h:done() then h:cancel() end
  end
end

-- results[i] preset for tasks finished earlier (from pending writes).
-- Returns the first fatal error message, or nil.
local function run_tasks(R, tasks, results)
  local n = #tasks
  local todo, last = 0, nil
  for i = 1, n do
    if results[i] == nil then todo = todo + 1; last = i end
  end
  if todo == 0 then return nil end
  if todo == 1 then
    local t = tasks[last]
    local obs = R.obs
    if obs then on_start(R, t) end
    local res = exec_run(R, t, true)
    results[last] = res
    if obs then on_finish(R, t, res) end
    if res.status == "error" then return res.error end
    return nil
  end
  local r = runtime()
  local q = r.queue()
  local handles = {}
  local guard <close> = setmetatable({}, { __close = function() cancel_rest(handles) end })
  local obs = R.obs
  for i = 1, n do
    if results[i] == nil then
      if obs then on_start(R, tasks[i]) end
      handles[i] = r.spawn(worker, R, tasks[i], i, results, q)
    end
  end
  local done = {}
  local fatal
  for _ = 1, todo do
    local i = q:get()
    done[i] = true
    local res = results[i]
    if obs then on_finish(R, tasks[i], res) end
    if res.status == "error" then fatal = res.error break end
  end
  if fatal then
    -- fail_close: stop the siblings still running; keep what finished
    cancel_rest(handles)
    if obs then
      for i in pairs(handles) do
        if results[i] ~= nil and not done[i] then on_finish(R, tasks[i], results[i]) end
      end
    end
  end
  return fatal
end

---------------------------------------------------------------------------
-- the barrier

local function apply_input(R, values, input)
  local reds = R.reducers
  local new = {}
  for k, v in pairs(values) do new[k] = v end
  for k, v in pairs(input) do
    if type(k) ~= "string" then
      error("state keys must be strings, got a " .. type(k) .. " key", 0)
    end
    local red = reds[k]
    if red then new[k] = red(new[k], v) else new[k] = v end
  end
  return new
end
_M.apply_input = apply_input

--[[ Apply the writes of a step in plan order -> new values | raises a
message (reducer failure or two writes to a `last` key). ]]
local function bad_key(k, who)
  error(who .. " returned an update with a " .. type(k) .. " key; state keys are strings", 0)
end

local function apply_writes(R, tasks, results, cmd)
  local reds = R.reducers
  local new
  local copy = R.cow
  if not copy then
    -- a Send packet carrying the state itself must keep this step's state
    local values = R.values
    for i = 0, #tasks do
      local res = i == 0 and cmd or results[i]
      local sends = res and res.sends
      if sends then
        for j = 1, #sends do
          if sends[j].arg == values then copy = true end
        end
      end
    end
  end
  if copy then
    -- old snapshots are still referenced (checkpoints, stream events)
    new = {}
    for k, v in pairs(R.values) do new[k] = v end
  else
    new = R.values
  end
  local n = #tasks
  if n == 1 and not cmd then
    local up = results[1].update
    if up then
      for k, v in pairs(up) do
        if type(k) ~= "string" then bad_key(k, "node '" .. tasks[1].node .. "'") end
        local red = reds[k]
        if red then new[k] = red(new[k], v) else new[k] = v end
      end
    end
    return new
  end
  local lists, writers, keys = {}, {}, {}
  local function collect(up, who)
    for k, v in pairs(up) do
      if type(k) ~= "string" then
        bad_key(k, type(who) == "number" and ("task " .. task_label(tasks[who])) or who)
      end
      local l = lists[k]
      if not l then
        lists[k] = { v }
        writers[k] = { who }
        keys[#keys + 1] = k
      else
        l[#l + 1] = v
        local w = writers[k]
        w[#w + 1] = who
      end
    end
  end
  if cmd and cmd.update then collect(cmd.update, "the caller's Command") end
  for i = 1, n do
    local res = results[i]
    if res.update then collect(res.update, i) end
  end
  for _, k in ipairs(keys) do
    local l = lists[k]
    local red = reds[k]
    if red == nil then
      if l[2] ~= nil then
        local w = writers[k]
        local a = type(w[1]) == "number" and task_label(tasks[w[1]]) or w[1]
        local b = type(w[2]) == "number" and task_label(tasks[w[2]]) or w[2]
        error("state key '" .. k .. "' was written by " .. a .. " and " .. b ..
          " in the same step, but its reducer is `last`; declare a reducer for '" .. k ..
          "' in the schema (e.g. mg.reducers.append)", 0)
      end
      new[k] = l[1]
    elseif l[2] == nil then
      new[k] = red(new[k], l[1])
    else
      local b = batch[red]
      if b then
        new[k] = b(new[k], l)
      else
        local v = new[k]
        for j = 1, #l do v = red(v, l[j]) end
        new[k] = v
      end
    end
  end
  return new
end

local EMPTY = setmetatable({}, { __newindex = function() error("shared empty plan", 2) end })


-- The plan after a node with a single plain edge (or none), shared between
-- runs: only used when nothing annotates task records (no saver, stream or
-- trace). false: the node needs the general path.
local function single_plan(nodes, spec)
  local sp = spec.single_plan
  if sp == nil then
    sp = false
    if not spec.joins[1] and not spec.branches[1] and not spec.edges[2] then
      local target = spec.edges[1]
      if target == nil or target == END then
        sp = EMPTY
      elseif not nodes[target].defer then
        sp = { { node = target } }
      end
    end
    spec.single_plan = sp
  end
  return sp
end

-- Work out the next plan (list of tasks) from what the step produced.
local function plan_next(R, tasks, results, cmd)
  local nodes = R.nodes
  if not tasks[2] and not cmd and not R.obs and not R.deferred then
    local res = results[1]
    if res.status == "done" and not res.route and not res.sends then
      local sp = single_plan(nodes, nodes[tasks[1].node])
      if sp then return sp end
    end
  end
  local pulls, pushes, seen = {}, nil, nil
  local function add(name)
    if name == END then return end
    if nodes[name].defer then
      local d = R.deferred
      if not d then d = {}; R.deferred = d end
      d[name] = true
      return
    end
    if not seen then
      seen = { [name] = true }
      pulls[1] = name
    elseif not seen[name] then
      seen[name] = true
      pulls[#pulls + 1] = name
    end
  end
  local function follow(node, res)
    if node then
      local edges = node.edges
      for i = 1, #edges do add(edges[i]) end
      local joins = node.joins
      for i = 1, #joins do
        local j = joins[i]
        local bs = R.barriers
        if not bs then bs = {}; R.barriers = bs end
        local b = bs[j.key]
        if not b then b = {}; bs[j.key] = b end
        b[node.name] = true
        local all = true
        for _, s in ipairs(j.sources) do
          if not b[s] then all = false break end
        end
        if all then
          bs[j.key] = nil
          add(j.target)
        end
      end
    end
    local route = res.route
    if route then
      for i = 1, #route do add(route[i]) end
    end
    local sends = res.sends
    if sends then
      pushes = pushes or {}
      for i = 1, #sends do pushes[#pushes + 1] = sends[i] end
    end
  end
  if cmd then follow(nil, cmd) end
  for i = 1, #tasks do
    local res = results[i]
    if res.status == "done" then follow(nodes[tasks[i].node], res) end
  end
  if not pulls[1] and not pushes and R.deferred then
    for name in pairs(R.deferred) do pulls[#pulls + 1] = name end
    R.deferred = nil
  end
  if pulls[2] then table_sort(pulls) end
  return _M.make_plan(R.step + 1, pulls, pushes, R.obs)   -- R.step: the step just done
end

--[[ tasks for step `step` from node names and Send packets. Task ids are
filled in when `ids` is set (saver, stream or trace need them); otherwise
ctx.task_id computes one on demand. ]]
function _M.make_plan(step, pulls, pushes, ids)
  local plan = {}
  local prefix = ids and (step .. ":")
  for i = 1, #pulls do
    local name = pulls[i]
    plan[i] = { node = name, id = ids and (prefix .. name) or nil }
  end
  if pushes then
    local n = #plan
    for j = 1, #pushes do
      local s = pushes[j]
      plan[n + j] = { node = s.node, send = j, arg = s.arg,
        id = ids and (prefix .. s.node .. "#" .. j) or nil }
    end
  end
  return plan
end

-- the first plan of a run: START's edges and routers on the input state
local function plan_start(R)
  local start = R.app.start
  local res = nil
  if start.branches[1] then
    res = { status = "done" }
    local err = executor.route(R, start, R.values, res, {
      node = START, task_id = (R.step + 1) .. ":" .. START, config = R.cfg, ns = R.ns,
      step = R.step + 1,
    })
    if err then return nil, err end
  elseif not R.obs then
    -- START's plain edges always lead to the same plan
    local sp = start.plan
    if not sp then
      local pulls = {}
      for _, e in ipairs(start.edges) do
        if e ~= END then pulls[#pulls + 1] = e end
      end
      table_sort(pulls)
      sp = _M.make_plan(0, pulls, nil, false)
      start.plan = sp
    end
    return sp
  end
  local pulls = {}
  local seen = {}
  local function add(name)
    if name ~= END and not seen[name] then
      seen[name] = true
      pulls[#pulls + 1] = name
    end
  end
  for _, e in ipairs(start.edges) do add(e) end
  if res and res.route then for _, e in ipairs(res.route) do add(e) end end
  table_sort(pulls)
  return _M.make_plan(R.step + 1, pulls, res and res.sends, R.obs)
end
_M.plan_start = plan_start

---------------------------------------------------------------------------
-- checkpoints

local function save_checkpoint(R, plan, source, ran)
  local next_list = {}
  for i, t in ipairs(plan) do
    if t.send then
      next_list[i] = { node = t.node, send = t.send, arg = t.arg }
    else
      next_list[i] = { node = t.node }
    end
  end
  local barriers, deferred = nil, nil
  if R.barriers and next(R.barriers) then
    barriers = {}
    for k, set in pairs(R.barriers) do
      local l = {}
      for s in pairs(set) do l[#l + 1] = s end
      table_sort(l)
      barriers[k] = l
    end
  end
  if R.deferred and next(R.deferred) then
    deferred = {}
    for n in pairs(R.deferred) do deferred[#deferred + 1] = n end
    table_sort(deferred)
  end
  local id = new_id(R)
  local cp = {
    v = 1, id = id, ts = iso_now(), step = R.step, values = R.values,
    next = next_list, barriers = barriers, deferred = deferred,
  }
  local md = { source = source, step = R.step, ran = ran }
  io_op(R, "put", cp_cfg(R, R.cp_id), cp, md)
  if R.io.mode ~= "exit" then R.saved_id = id end
  R.cp_id = id
  local sink = R.sink
  if sink and sink.modes.debug then
    emit(R, "debug", nil, nil, { type = "checkpoint", step = R.step, id = id,
      values = R.values, next = next_list, metadata = md })
  end
end

_M.save_checkpoint = save_checkpoint

-- restore R from a saver tuple
local function restore(R, tup)
  local cp = tup.checkpoint
  R.values = cp.values or {}
  R.step = cp.step or -1
  R.cp_id = cp.id
  R.saved_id = cp.id
  R.barriers, R.deferred = nil, nil
  if cp.barriers then
    R.barriers = {}
    for k, l in pairs(cp.barriers) do
      local set = {}
      for _, s in ipairs(l) do set[s] = true end
      R.barriers[k] = set
    end
  end
  if cp.deferred then
    R.deferred = {}
    for _, n in ipairs(cp.deferred) do R.deferred[n] = true end
  end
  local plan = {}
  local prefix = (R.step + 1) .. ":"
  for i, e in ipairs(cp.next or {}) do
    if not R.nodes[e.node] then
      error("checkpoint " .. cp.id .. " plans node '" .. tostring(e.node) ..
        "', which this graph does not have", 0)
    end
    if e.send then
      plan[i] = { node = e.node, send = e.send, arg = e.arg, id = prefix .. e.node .. "#" .. e.send }
    else
      plan[i] = { node = e.node, id = prefix .. e.node }
    end
  end
  return plan
end

-- pending writes of a tuple grouped by task id
local function group_writes(tup)
  local by = {}
  for _, w in ipairs(tup.pending_writes or {}) do
    local l = by[w[1]]
    if not l then l = {}; by[w[1]] = l end
    l[#l + 1] = { w[2], w[3] }
  end
  return by
end
_M.group_writes = group_writes

---------------------------------------------------------------------------
-- the run

local function interrupted(R, list)
  local out = {}
  for k, v in pairs(R.values) do out[k] = v end
  out.__interrupt__ = list
  return out
end

-- static breakpoints: a marker write so that resuming does not stop again
local function breakpoint(R, plan, when, set)
  if not set then return nil end
  local hit = {}
  for _, t in ipairs(plan) do
    if set == "*" or set[t.node] then hit[#hit + 1] = t.node end
  end
  if not hit[1] then return nil end
  if not R.saver then
    error("interrupt_" .. when .. " needs a checkpointer: compile the graph with {checkpointer = ...}", 0)
  end
  local rec = { { id = when .. ":" .. (R.step + (when == "before" and 1 or 0)), when = when,
    nodes = hit, ns = R.ns } }
  if when == "before" then
    save_writes(R, "__breakpoint__", { { "__interrupt__", rec } })
  end
  return rec
end

--[[ loop(R, plan, results, cmd) -> values | nil, err
results: preset results of finished tasks; cmd: the caller's Command as a
pseudo-task result applied first at the barrier. ]]
local function loop(R, plan, results, cmd, skip_before)
  local steps = 0
  local app = R.app
  while plan[1] do
    if steps >= R.limit then
      local names = {}
      for i, t in ipairs(plan) do names[i] = t.node end
      return nil, "recursion limit of " .. R.limit .. " supersteps reached without hitting END (next: " ..
        table_concat(names, ", ") .. "); raise recursion_limit if the graph needs more steps"
    end
    steps = steps + 1
    if not skip_before and app.interrupt_before then
      local rec = breakpoint(R, plan, "before", app.interrupt_before)
      if rec then return interrupted(R, rec) end
    end
    skip_before = false
    if not results then
      if plan[2] then
        results = {}
      else
        results = R.rbuf
        if not results then results = {}; R.rbuf = results end
        results[1] = nil
      end
    end
    local span = R.trace and R.trace:begin_step(R.step + 1, #plan)
    local fatal = run_tasks(R, plan, results)
    if span then R.trace:finish(span) end
    if fatal then return nil, fatal end
    local ints = nil
    for i = 1, #plan do
      local res = results[i]
      if res.status == "interrupt" then
        ints = ints or {}
        for _, it in ipairs(res.interrupts) do ints[#ints + 1] = it end
      end
    end
    if ints then return interrupted(R, ints) end
    local ok, values = pcall(apply_writes, R, plan, results, cmd)
    if not ok then return nil, values end
    R.values = values
    R.step = R.step + 1
    local nextp = plan_next(R, plan, results, cmd)
    if R.saver then
      local ran = {}
      for i, t in ipairs(plan) do ran[i] = t.node end
      save_checkpoint(R, nextp, "loop", ran)
      if R.io.err then return nil, R.io.err end
    end
    emit(R, "values", nil, nil, values)
    if app.interrupt_after then
      local rec = breakpoint(R, plan, "after", app.interrupt_after)
      if rec then return interrupted(R, rec) end
    end
    plan, results, cmd = nextp, nil, nil
  end
  return R.values
end

local function new_run(app, cfg, parent, ns, sink, trace)
  if parent then sink, trace = parent.sink, parent.trace end
  -- one constructor with every field: the table is sized once
  local R = {
    app = app, nodes = app.nodes, reducers = app.reducers, cfg = cfg,
    ns = ns or "", limit = (not parent and cfg.recursion_limit) or app.recursion_limit,
    values = nil, step = -1, root = not parent,
    saver = nil, io = nil, thread_id = nil, exit = nil,
    sink = sink, trace = trace, cow = false, obs = false,
    cp_id = nil, saved_id = nil, last_id = nil,
    barriers = nil, deferred = nil, ctx = nil, rbuf = nil, res = nil,
  }
  if parent then
    R.saver, R.io, R.thread_id = parent.saver, parent.io, parent.thread_id
  else
    local saver = app.checkpointer
    if saver then
      if cfg.thread_id == nil then
        error("bad argument #2 to 'invoke': thread_id is required: the graph has a checkpointer", 0)
      end
      R.saver = saver
      R.thread_id = tostring(cfg.thread_id)
      local mode = cfg.durability or app.durability
      if mode ~= "sync" and mode ~= "async" and mode ~= "exit" then
        error("bad argument #2 to 'invoke': durability must be \"sync\", \"async\" or \"exit\"", 0)
      end
      R.io = { saver = saver, mode = mode }
    end
  end
  if R.io and R.io.mode == "exit" then R.exit = { writes = {} } end
  R.values = EMPTY_STATE
  _M.observe(R)
  return R
end
_M.new_run = new_run

-- cow: old state snapshots stay referenced (saver, stream), so the barrier
-- copies the state; obs: something records tasks (saver, stream, trace).
function _M.observe(R)
  R.cow = (R.saver or R.sink) and true or false
  R.obs = (R.cow or R.trace) and true or false
end

-- resume values for interrupted tasks -> nil | error message
local function assign_resume(R, plan, results, pending, resume)
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
    return "nothing to resume: thread '" .. tostring(R.thread_id) .. "' has no pending interrupt"
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
    local sub_node = R.nodes[t.node].sub ~= nil
    for _, it in ipairs(o.list) do
      if it.ns ~= nil and it.ns ~= R.ns then
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
        save_writes(R, t.id, { { "__resume__", list } })
      end
    end
  end
  return nil
end

--[[ start(R, input, cfg) -> values | nil, err
Decide where the run begins (fresh input, resume, caller Command) and run
the loop. ]]
local function start(R, input, cfg, resume_cmd)
  local saver = R.saver
  local tup, latest = nil, nil
  local want_id = R.root and cfg.checkpoint_id or nil
  if saver then
    local ok, got, err = pcall(saver.get, saver, {
      thread_id = R.thread_id, checkpoint_ns = R.ns, checkpoint_id = want_id })
    if not ok then return nil, "checkpointer get failed: " .. tostring(got) end
    if got == nil and err then return nil, "checkpointer get failed: " .. tostring(err) end
    if want_id and got == nil then
      return nil, "checkpoint '" .. tostring(want_id) .. "' not found in thread '" .. R.thread_id .. "'"
    end
    tup = got
    latest = tup and tup.checkpoint.id
    if want_id then
      local lok, l = pcall(saver.get, saver, { thread_id = R.thread_id, checkpoint_ns = R.ns })
      latest = lok and l and l.checkpoint.id or latest
    end
    R.last_id = latest
  end
  local forked = want_id ~= nil and latest ~= want_id
  if not R.root and tup then
    -- a subgraph namespace belongs to one task of its parent: what is saved
    -- there is this same task's earlier, interrupted or crashed, attempt
    input = nil
    if not (tup.checkpoint.next and tup.checkpoint.next[1]) then resume_cmd = nil end
  end

  local cmd = nil
  if is_command(input) then
    cmd = input
    input = nil
  elseif resume_cmd ~= nil then
    cmd = control.Command { resume = resume_cmd }
  end

  -- pending run: resume it (input nil, or a Command)
  if input == nil and tup and tup.checkpoint.next and tup.checkpoint.next[1] then
    local plan = restore(R, tup)
    local by = forked and {} or group_writes(tup)
    local results, pending = {}, {}
    for i, t in ipairs(plan) do
      local w = by[t.id]
      if w then
        local res, finished = from_writes(w)
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
    local cmd_id = (R.step + 1) .. ":__command__"
    if cmd and cmd.resume ~= nil then
      local err = assign_resume(R, plan, results, pending, cmd.resume)
      if err and not skip_before then return nil, err end
    end
    if cmd and (cmd.update or cmd.to) then
      cmd_res = { status = "done", update = cmd.update }
      if cmd.to ~= nil then
        local err = executor.add_targets(R, cmd_res, cmd.to, nil, "Command.to")
        if err then return nil, err end
      end
      if saver then save_writes(R, cmd_id, to_writes(cmd_res)) end
    elseif by[cmd_id] then
      cmd_res = from_writes(by[cmd_id])
    end
    return loop(R, plan, results, cmd_res, skip_before)
  end

  -- a new run (or a Command on a thread with nothing pending)
  if cmd and cmd.resume ~= nil then
    if not saver then
      return nil, "nothing to resume: Command{resume=...} needs a checkpointer and a thread_id"
    end
    return nil, "nothing to resume: thread '" .. R.thread_id .. "' has no pending interrupt"
  end
  if input == nil and not cmd then
    if tup then return tup.checkpoint.values or {} end
    if saver then
      return nil, "nothing to resume: thread '" .. R.thread_id .. "' has no checkpoint"
    end
    error("bad argument #1 to 'invoke': input table expected (nil resumes a thread, which needs a checkpointer)", 0)
  end
  if tup then
    R.values = tup.checkpoint.values or {}
    R.step = tup.checkpoint.step or -1
    R.cp_id = tup.checkpoint.id
    R.saved_id = tup.checkpoint.id
  end
  local update = input or (cmd and cmd.update)
  if update ~= nil then
    if type(update) ~= "table" then
      error("bad argument #1 to 'invoke': input must be a table of state values, got " .. type(update), 0)
    end
    local ok, v = pcall(apply_input, R, R.values, update)
    if not ok then return nil, "input: " .. tostring(v) end
    R.values = v
  end
  if R.values == EMPTY_STATE then R.values = {} end
  R.step = R.step + 1
  local plan, err
  if cmd and cmd.to ~= nil then
    local res = { status = "done" }
    err = executor.add_targets(R, res, cmd.to, nil, "Command.to")
    if err then return nil, err end
    local pulls, seen = {}, {}
    for _, name in ipairs(res.route or {}) do
      if not seen[name] then seen[name] = true; pulls[#pulls + 1] = name end
    end
    table_sort(pulls)
    plan = _M.make_plan(R.step + 1, pulls, res.sends, R.obs)
  else
    plan, err = plan_start(R)
    if not plan then return nil, err end
  end
  if saver then
    save_checkpoint(R, plan, "input", nil)
    if R.io.err then return nil, R.io.err end
  end
  emit(R, "values", nil, nil, R.values)
  return loop(R, plan, nil, nil, false)
end

-- Run contexts of plain runs (no saver, stream or trace) are recycled per
-- graph: a run costs no context table, ctx table or result buffer.
local POOL_MAX = 8

local function acquire(app, cfg)
  local pool = app.pool
  local n = #pool
  if n == 0 then
    local R = new_run(app, cfg, nil, nil, nil, nil)
    R.pooled = true
    return R
  end
  local R = pool[n]
  pool[n] = nil
  R.cfg = cfg
  R.limit = cfg.recursion_limit or app.recursion_limit
  R.values, R.step = EMPTY_STATE, -1
  return R
end

local function release(R)
  local pool = R.app.pool
  R.cfg, R.values, R.barriers, R.deferred = nil, nil, nil, nil
  if R.rbuf then R.rbuf[1] = nil end
  if R.ctx then R.ctx._t = nil end
  if R.res then R.res.update = nil end
  if #pool < POOL_MAX then pool[#pool + 1] = R end
end

--[[ run(app, input, cfg, sink) -> values | nil, err : the root of a run.
sink: nil, or the stream's {modes = {mode = true}, put = function(event)}. ]]
function _M.run(app, input, cfg, sink)
  local trace = nil
  if cfg.trace then
    local terr
    trace, terr = require("moongraph.trace").new(cfg.trace, runtime().now)
    if not trace then return nil, terr end
  end
  if not (sink or trace or app.checkpointer) then
    local R = acquire(app, cfg)
    local ok, values, err = pcall(start, R, input, cfg)
    release(R)
    if not ok then error(values, 0) end
    return values, err
  end
  local R = new_run(app, cfg, nil, nil, sink, trace)
  local guard <close> = R.io and setmetatable({}, { __close = function() io_close(R) end }) or nil
  local ok, values, err = pcall(start, R, input, cfg)
  local fok, ferr = true, nil
  if R.io then fok, ferr = io_flush(R) end
  if trace then
    local tok, terr = trace:write()
    if not tok and ok and values then values, err = nil, terr end
  end
  if not ok then error(values, 0) end
  if values == nil then return nil, err end
  if not fok then return nil, ferr end
  return values
end

local function deep_equal(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do
    if not deep_equal(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end
_M.deep_equal = deep_equal

--[[ Before a retry attempt of task t runs the subgraph of namespace ns
again: every write the earlier attempts made there must be in the saver, so
that the subgraph resumes from its last checkpoint under every durability
(async: the writer's queue drained; exit: the buffer of an attempt cut short
by its timeout saved). ]]
local function settle(R, t, ns)
  local io = R.io
  if io.mode == "async" then
    if io.q then io_drain(io) end
  elseif io.mode == "exit" then
    local left = t.sub_exit and t.sub_exit[ns]
    if left then
      t.sub_exit[ns] = nil
      io_flush(left)
    end
  end
  if io.err then error(io.err, 0) end
end

-- Does the subgraph of namespace ns hold one of the pending interrupts?
-- nss: their namespaces (nil: records without one, from a subgraph node,
-- whose one subgraph holds them)
local function holds(nss, ns)
  if nss == nil then return true end
  local n = #ns
  for _, x in ipairs(nss) do
    if x == ns or (x:sub(1, n) == ns and x:sub(n + 1, n + 1) == "|") then return true end
  end
  return false
end

local ALL_MODES = { values = true, updates = true, messages = true, custom = true,
  tasks = true, debug = true }

-- What a subgraph changed in the keys the parent declares, as an update for
-- the parent's reducers (see subgraph below).
local function write_back(R, input, values)
  local declared = R.app.declared
  local reds = R.reducers
  local up = nil
  for k, v in pairs(values) do
    if declared == nil or declared[k] then
      local iv = input[k]
      if not deep_equal(v, iv) then
        local red = reds[k]
        if red == reducers.append and reducers.is_list(iv) and reducers.is_list(v) and #v >= #iv then
          local prefix = true
          for i = 1, #iv do
            if not deep_equal(iv[i], v[i]) then prefix = false break end
          end
          if prefix then
            local d = {}
            for i = #iv + 1, #v do d[#d + 1] = v[i] end
            v = d
          end
        elseif red == reducers.add and type(iv) == "number" and type(v) == "number" then
          v = v - iv
        end
        up = up or {}
        up[k] = v
      end
    end
  end
  return up
end

--[[ run_subgraph(R, ctx, sub, input, name [, on_event]) -> final state, update
Runs compiled graph `sub` inside the task of ctx: namespace
parent_ns|name:task_id[@checkpoint], the parent's checkpointer, stream and
trace. on_event(ev), when given, sees every event of the subgraph (and of
the subgraphs it runs) whatever the parent's stream asked for. A failure is
raised as its message, interrupts inside as an interrupt of the task.
update: what the subgraph changed in the keys the parent declares (every
key when the parent has no schema), for the parent's reducers. ]]
function _M.run_subgraph(R, ctx, sub, input, name, on_event)
  local t = ctx._t
  local ns = (R.ns ~= "" and (R.ns .. "|") or "") .. name .. ":" .. ctx.task_id
  if R.cp_id then ns = ns .. "@" .. R.cp_id end
  local used = rawget(ctx, "_subns")
  if used and used[ns] then
    error("node '" .. ctx.node .. "' ran two subgraphs in namespace '" .. ns ..
      "'; give each call its own ns_suffix", 0)
  end
  if not used then used = {}; ctx._subns = used end
  used[ns] = true
  if R.io and ctx.attempt > 1 then settle(R, t, ns) end
  local SR = new_run(sub, R.cfg, R, ns)
  if on_event then
    local outer = R.sink
    SR.sink = { modes = ALL_MODES, put = function(ev)
      on_event(ev)
      if outer and outer.modes[ev.mode] then outer.put(ev) end
    end }
    _M.observe(SR)
  end
  if SR.exit then
    -- kept until saved: a timeout may cancel this attempt before it ends
    local pending = t.sub_exit
    if not pending then pending = {}; t.sub_exit = pending end
    pending[ns] = SR
  end
  local resume_cmd = nil
  if t.resume_cmd ~= nil and holds(t.resume_ns, ns) then
    resume_cmd = t.resume_cmd
    t.resume_cmd, t.resume_ns = nil, nil
  end
  local values, err = start(SR, input, R.cfg, resume_cmd)
  local fok, ferr = io_flush(SR)
  if SR.exit then t.sub_exit[ns] = nil end
  if values == nil then error(err, 0) end
  if not fok then error(ferr, 0) end
  if values.__interrupt__ then
    error(control.interrupt_error(values.__interrupt__), 0)
  end
  return values, write_back(R, input, values)
end

--[[ subgraph(R, spec, input, ctx) -> update for the parent
A compiled graph as the body of a node: run in the namespace of the node's
task. What the subgraph changed in the keys the parent declares is written
back through the parent's reducers. ]]
function _M.subgraph(R, spec, input, ctx)
  if type(input) ~= "table" then
    error("subgraph node '" .. ctx.node .. "' needs a table as input, got " .. type(input), 0)
  end
  local _, up = _M.run_subgraph(R, ctx, spec.sub, input, ctx.node, nil)
  return up
end

return _M
