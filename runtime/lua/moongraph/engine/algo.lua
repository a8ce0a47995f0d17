--[[
moongraph.engine.algo — the superstep's arithmetic, shared by the loop and
by update_state: task ids, plans, the barrier that applies a step's writes,
and the encoding of a task's result as pending writes.

Nothing here waits or writes anywhere; routers are the only user code it
calls (START's routers when a run begins, a node's routers in update_state).

A plan is the list of tasks of one step: edge-triggered nodes (sorted by
name), then Send packets (in send order). A task is
  { node = name, id = "<step>:<node>" | "<step>:<node>#<send>" | nil,
    send = index | nil, arg = Send argument | nil }
Task ids are made here (task_id) and only here; they are left out when
nothing needs them (no saver, stream or trace), and the node's ctx.task_id
makes one on demand.
]]

local type, pairs, ipairs, error, tostring, setmetatable =
  type, pairs, ipairs, error, tostring, setmetatable
local table_sort = table.sort

local control = require "moongraph.control"
local reducers = require "moongraph.reducers"
local text = require "moongraph.text"
local branch = require "moongraph.engine.branch"

local END, START = control.END, control.START
local batch = reducers.batch
local is_overwrite = control.is_overwrite

local _M = {}

---------------------------------------------------------------------------
-- task ids and plans

-- "<step>:" of the usual steps, made once: an integer's text costs a
-- formatted print each time it is made
local STEP_PREFIX = {}
for i = 0, 255 do STEP_PREFIX[i] = i .. ":" end

-- task_id(step, node [, send]) -> "<step>:<node>" or "<step>:<node>#<send>"
local function task_id(step, node, send)
  if send then return step .. ":" .. node .. "#" .. send end
  local prefix = STEP_PREFIX[step]
  if prefix then return prefix .. node end
  return step .. ":" .. node
end
_M.task_id = task_id

--[[ make_plan(step, pulls, pushes, with_ids) -> plan
pulls: node names (already sorted); pushes: Send packets. ]]
function _M.make_plan(step, pulls, pushes, with_ids)
  local plan = {}
  for i = 1, #pulls do
    local name = pulls[i]
    plan[i] = { node = name, id = with_ids and task_id(step, name) or nil }
  end
  if pushes then
    local n = #plan
    for j = 1, #pushes do
      local s = pushes[j]
      plan[n + j] = { node = s.node, send = j, arg = s.arg,
        id = with_ids and task_id(step, s.node, j) or nil }
    end
  end
  return plan
end
local make_plan = _M.make_plan

-- An empty plan shared by every run (read-only).
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

-- the plans with task ids after a node with a single plain edge, by step
-- (shared between runs, read-only)
local SHARED_TASK_MT = { __newindex = function(_, k)
  error("internal: write of '" .. tostring(k) .. "' into a shared plan task", 2) end }
local function step_plans(spec)
  local by_step = spec.step_plans
  if not by_step then by_step = {}; spec.step_plans = by_step end
  return by_step
end

--[[ follow(run, spec, res, add)
What one finished task triggers: `spec`'s edges and the joins it completes
(run.barriers records the sources seen so far), then the task's routes;
`add(name)` is called for each node. spec may be nil (a Command's result). ]]
local function follow(run, spec, res, add)
  if spec then
    local edges = spec.edges
    for i = 1, #edges do add(edges[i]) end
    local joins = spec.joins
    for i = 1, #joins do
      local j = joins[i]
      local bs = run.barriers
      if not bs then bs = {}; run.barriers = bs end
      local b = bs[j.key]
      if not b then b = {}; bs[j.key] = b end
      b[spec.name] = true
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
end
_M.follow = follow

--[[ plan_next(run, tasks, results, cmd) -> plan of the next step
From what the step produced: edges, joins, routes and Sends of every
finished task (and of the caller's Command), deferred nodes once nothing
else is left. run.step is the step just done. ]]
function _M.plan_next(run, tasks, results, cmd)
  local nodes = run.nodes
  if not tasks[2] and not cmd and not run.deferred then
    local res = results[1]
    if res.status == "done" and not res.route and not res.sends then
      local spec = nodes[tasks[1].node]
      local sp = single_plan(nodes, spec)
      if sp then
        if not run.observed or sp == EMPTY then return sp end
        -- the same plan with a task id
        local name, step = sp[1].node, run.step + 1
        if run.trace or run.exit or not STEP_PREFIX[step] then
          -- a trace (t.span) or durability exit (t.sub_exit) writes into
          -- the plan's task: a table of this run's own
          return { { node = name, id = task_id(step, name) } }
        end
        -- else nothing writes into it: one per node and step, shared
        local by_step = step_plans(spec)
        local p = by_step[step]
        if not p then
          p = { setmetatable({ node = name, id = task_id(step, name) }, SHARED_TASK_MT) }
          by_step[step] = p
        end
        return p
      end
    end
  end
  local pulls, pushes, seen = {}, nil, nil
  local function add(name)
    if name == END then return end
    if nodes[name].defer then
      local d = run.deferred
      if not d then d = {}; run.deferred = d end
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
  local function take(spec, res)
    follow(run, spec, res, add)
    local sends = res.sends
    if sends then
      pushes = pushes or {}
      for i = 1, #sends do pushes[#pushes + 1] = sends[i] end
    end
  end
  if cmd then take(nil, cmd) end
  for i = 1, #tasks do
    local res = results[i]
    if res.status == "done" then take(nodes[tasks[i].node], res) end
  end
  if not pulls[1] and not pushes and run.deferred then
    for name in pairs(run.deferred) do pulls[#pulls + 1] = name end
    run.deferred = nil
  end
  if pulls[2] then table_sort(pulls) end
  return make_plan(run.step + 1, pulls, pushes, run.observed)
end

--[[ plan_start(run) -> plan | nil, err
The first plan of a run: START's edges and routers on the input state. ]]
function _M.plan_start(run)
  local start = run.app.start
  local res = nil
  if start.branches[1] then
    res = { status = "done" }
    local err = branch.route(run, start, run.values, res, {
      node = START, task_id = task_id(run.step + 1, START), config = run.cfg, ns = run.ns,
      step = run.step + 1,
    })
    if err then return nil, err end
  elseif not run.observed then
    -- START's plain edges always lead to the same plan
    local sp = start.plan
    if not sp then
      local pulls = {}
      for _, e in ipairs(start.edges) do
        if e ~= END then pulls[#pulls + 1] = e end
      end
      table_sort(pulls)
      sp = make_plan(0, pulls, nil, false)
      start.plan = sp
    end
    return sp
  end
  local pulls, seen = {}, {}
  local function add(name)
    if name ~= END and not seen[name] then
      seen[name] = true
      pulls[#pulls + 1] = name
    end
  end
  for _, e in ipairs(start.edges) do add(e) end
  if res and res.route then for _, e in ipairs(res.route) do add(e) end end
  table_sort(pulls)
  return make_plan(run.step + 1, pulls, res and res.sends, run.observed)
end

--[[ plan_after(run, spec, res) -> plan of the step after `spec` ran with
result res (update_state's as_node): its edges, joins and routes. ]]
function _M.plan_after(run, spec, res)
  local pulls, seen = {}, {}
  follow(run, spec, res, function(n)
    if n ~= END and not seen[n] then seen[n] = true; pulls[#pulls + 1] = n end
  end)
  table_sort(pulls)
  return make_plan(run.step + 2, pulls, res.sends, true)
end

--[[ plan_of_targets(run, res) -> plan: the nodes and Sends of a caller's
Command.to, for the step after run.step. ]]
function _M.plan_of_targets(run, res)
  local pulls, seen = {}, {}
  for _, name in ipairs(res.route or {}) do
    if not seen[name] then seen[name] = true; pulls[#pulls + 1] = name end
  end
  table_sort(pulls)
  return make_plan(run.step + 1, pulls, res.sends, run.observed)
end

--[[ restore_plan(run, next_list) -> plan, from a checkpoint's `next`
(the step after run.step); raises when it names a node the graph lacks. ]]
function _M.restore_plan(run, next_list, checkpoint_id)
  local plan = {}
  local step = run.step + 1
  for i, e in ipairs(next_list or {}) do
    if not run.nodes[e.node] then
      error("checkpoint " .. tostring(checkpoint_id) .. " plans node '" .. tostring(e.node) ..
        "', which this graph does not have", 0)
    end
    plan[i] = { node = e.node, send = e.send, arg = e.arg, id = task_id(step, e.node, e.send) }
  end
  return plan
end

---------------------------------------------------------------------------
-- the barrier

--[[ apply_input(run, values, input) -> new values (a copy): the caller's
input through the reducers; raises on a key that is not a string. ]]
function _M.apply_input(run, values, input)
  local reds = run.reducers
  local written = run.written
  local new = {}
  for k, v in pairs(values) do new[k] = v end
  for k, v in pairs(input) do
    if type(k) ~= "string" then
      error("state keys must be strings, got a " .. type(k) .. " key", 0)
    end
    local over, ov = is_overwrite(v)
    local red = reds[k]
    if over then new[k] = ov
    elseif red then new[k] = red(new[k], v) else new[k] = v end
    if written then written[k] = true end
  end
  return new
end

--[[ The writes `l` of one step to key k (in plan order) through its reducer
red (nil: `last`), from `old`. An Overwrite replaces the value, and the
writes after it in the step are dropped (LangGraph's rule); two Overwrites
are an error naming the writers. ]]
local function fold(k, red, old, l, writers, label)
  local first_over = nil
  for j = 1, #l do
    if is_overwrite(l[j]) then
      if first_over then
        error("state key '" .. k .. "' got two Overwrites in the same step (from " ..
          label(writers[first_over]) .. " and " .. label(writers[j]) .. ")", 0)
      end
      first_over = j
    end
  end
  if not first_over then
    if red == nil then return l[1] end
    if l[2] == nil then return red(old, l[1]) end
    local b = batch[red]
    if b then return b(old, l) end
    local v = old
    for j = 1, #l do v = red(v, l[j]) end
    return v
  end
  local v = old
  for j = 1, first_over - 1 do v = red and red(v, l[j]) or l[j] end
  local _, ov = is_overwrite(l[first_over])
  return ov
end

-- "'node'" or "'node' (send 3)", for messages
local function task_label(t)
  if t.send then return "'" .. t.node .. "' (send " .. t.send .. ")" end
  return "'" .. t.node .. "'"
end
_M.task_label = task_label

local function bad_key(k, who)
  error(who .. " returned an update with a " .. type(k) .. " key; state keys are strings", 0)
end

--[[ apply_writes(run, tasks, results, cmd) -> new values | raises a message
(a reducer failed, or two writes to a `last` key). Writes are applied in
plan order, the caller's Command first. ]]
function _M.apply_writes(run, tasks, results, cmd)
  local reds = run.reducers
  local new
  local copy = run.copy_on_write
  if not copy then
    -- a Send packet carrying the state itself must keep this step's state
    local values = run.values
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
    -- old snapshots are still referenced (stream events, a checkpoint
    -- kept for the end of the run)
    new = {}
    for k, v in pairs(run.values) do new[k] = v end
  else
    new = run.values
  end
  -- the keys written, for the async writer's copy of the state
  local written = run.written
  local n = #tasks
  if n == 1 and not cmd then
    local up = results[1].update
    if up then
      for k, v in pairs(up) do
        if type(k) ~= "string" then bad_key(k, "node '" .. tasks[1].node .. "'") end
        if written then written[k] = true end
        local red = reds[k]
        -- only a table can be an Overwrite: no call for the others
        local over, ov = false, nil
        if type(v) == "table" then over, ov = is_overwrite(v) end
        if over then new[k] = ov
        elseif red then new[k] = red(new[k], v) else new[k] = v end
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
  local function label(w) return type(w) == "number" and task_label(tasks[w]) or w end
  for _, k in ipairs(keys) do
    local l = lists[k]
    local red = reds[k]
    if red == nil and l[2] ~= nil then
      local w = writers[k]
      error("state key '" .. k .. "' was written by " .. label(w[1]) .. " and " .. label(w[2]) ..
        " in the same step, but its reducer is `last`; declare a reducer for '" .. k ..
        "' in the schema (e.g. mg.reducers.append)", 0)
    end
    new[k] = fold(k, red, new[k], l, writers[k], label)
    if written then written[k] = true end
  end
  return new
end

--[[ local_state(run, update) -> a copy of the state with one task's update
applied: what that task's routers see. ]]
function _M.local_state(run, update)
  local s = {}
  for k, v in pairs(run.values) do s[k] = v end
  if update then
    local reds = run.reducers
    for k, v in pairs(update) do
      local over, ov = is_overwrite(v)
      local r = reds[k]
      if over then s[k] = ov
      elseif r then s[k] = r(s[k], v) else s[k] = v end
    end
  end
  return s
end

---------------------------------------------------------------------------
-- a task's result as pending writes (what a saver keeps of a finished task)

local function by_channel(a, b) return a[1] < b[1] end

--[[ to_writes(res [, resume] [, scratch]) -> list of {channel, value}
The state update by key (sorted), then the engine's channels: __route__,
__send__, __ran__, __failed__, __chain__ (a fallback chain's failures),
__attempts__ (when more than one), or __interrupt__ (with __resume__) or
__error__. A resumed run reads its earlier tasks' records back from these.
scratch: a table of the caller's; the list and the update's pairs are made
in it, reusing what the last call left there. ]]
function _M.to_writes(res, resume, scratch)
  local w
  if scratch then
    w = scratch.list
    if w then
      for i = #w, 1, -1 do w[i] = nil end
    else
      w = {}
      scratch.list = w
    end
  else
    w = { nil, nil }   -- room for the usual few
  end
  local st = res.status
  if st == "done" then
    local up = res.update
    if up then
      local n = 0
      if scratch then
        for k, v in pairs(up) do
          n = n + 1
          local p = scratch[n]
          if p then p[1], p[2] = k, v else p = { k, v }; scratch[n] = p end
          w[n] = p
        end
      else
        for k, v in pairs(up) do n = n + 1; w[n] = { k, v } end
      end
      if n == 2 then
        -- the usual pair of keys: no sort call, no comparator calls
        if w[2][1] < w[1][1] then w[1], w[2] = w[2], w[1] end
      elseif n > 2 then
        table_sort(w, by_channel)
      end
    end
    if res.route then w[#w + 1] = { "__route__", res.route } end
    if res.sends then
      local s = {}
      for i, p in ipairs(res.sends) do s[i] = { node = p.node, arg = p.arg } end
      w[#w + 1] = { "__send__", s }
    end
    if res.ran then w[#w + 1] = { "__ran__", res.ran } end
    if res.failed then w[#w + 1] = { "__failed__", true } end
    if res.chain then
      local c = {}
      for i, x in ipairs(res.chain) do c[i] = { node = x.node, error = x.error, attempts = x.attempts } end
      w[#w + 1] = { "__chain__", c }
    end
    if res.attempts and res.attempts > 1 then w[#w + 1] = { "__attempts__", res.attempts } end
  elseif st == "interrupt" then
    if resume then w[#w + 1] = { "__resume__", resume } end
    local list = {}
    for i, it in ipairs(res.interrupts) do
      list[i] = { id = it.id, value = it.value, node = it.node, ns = it.ns }
    end
    w[#w + 1] = { "__interrupt__", list }
  else
    w[#w + 1] = { "__error__", tostring(res.error) }   -- stored as its message
  end
  return w
end

--[[ from_writes(writes [, t, step]) -> result record, finished
A finished task's record, or (finished false) a partial one holding the
error, interrupt and resume values of an unfinished task. With t (the task)
a finished one also carries what its writes tell of the task: the node that
ran, whether it failed, its fallback chain and attempts (not its time). ]]
function _M.from_writes(writes, t, step)
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
    elseif ch == "__chain__" then
      res.chain = v
    elseif ch == "__attempts__" then
      res.attempts = v
    elseif ch == "__done__" then
      finished = true
    else
      res.update = res.update or {}
      res.update[ch] = v
      finished = true
    end
  end
  if res.status ~= "done" then finished = false end
  if finished and t then
    res.node, res.id, res.send, res.step = t.node, t.id, t.send, step
    res.attempts = res.attempts or 1
    if res.failed then
      local errs = res.update and res.update.errors
      res.error = type(errs) == "table" and type(errs[1]) == "table" and errs[1].error or nil
    end
  end
  return res, finished
end

local STATUS = { done = "ok", error = "error", interrupt = "interrupted" }

--[[ task_record(res) -> what the engine tells about a task (engine/task.lua
result record), as a table of its own for user code:
  { id, node, send, step, ran, status = "ok" | "failed" | "error" | "interrupted",
    attempts, duration, error, cached, chain = { {node, error, attempts, duration} } }
(duration is nil for a task of a resumed run's earlier steps: times are not
saved.) ]]
function _M.task_record(res)
  local chain = nil
  if res.chain then
    chain = {}
    for i, c in ipairs(res.chain) do
      chain[i] = { node = c.node, error = c.error, attempts = c.attempts, duration = c.duration }
    end
  end
  return { id = res.id, node = res.node, send = res.send, step = res.step, ran = res.ran or res.node,
    status = res.failed and "failed" or STATUS[res.status] or res.status,
    attempts = res.attempts, duration = res.duration,
    error = res.error ~= nil and text.error_message(res.error) or nil,
    cached = res.cached, chain = chain }
end

-- pending writes of a saver tuple grouped by task id
function _M.group_writes(tuple)
  local by = {}
  for _, w in ipairs(tuple.pending_writes or {}) do
    local l = by[w[1]]
    if not l then l = {}; by[w[1]] = l end
    l[#l + 1] = { w[2], w[3] }
  end
  return by
end

---------------------------------------------------------------------------

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

return _M
