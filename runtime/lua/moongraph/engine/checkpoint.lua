--[[
moongraph.engine.checkpoint — the checkpoint a run saves after each step,
and a run restored from one.

A checkpoint record:
  { v = 1, id, ts, step, values, next = { {node, send, arg}, ... },
    barriers = { [join key] = {sources seen} } | nil,
    deferred = { node names } | nil }

A resumed run reads the records of its earlier tasks (ctx.previous_tasks)
back from the pending writes of its checkpoints, back to the one its input
made.

Ids are fixed-width hex of (milliseconds since the epoch * 1024 +
sequence), always above every id already in the thread, so ids sort in
creation order even across processes and clock steps.
]]

local type, pairs, ipairs, next, tonumber, pcall = type, pairs, ipairs, next, tonumber, pcall
local table_sort = table.sort
local string_format = string.format
local os_time, os_date = os.time, os.date

local tasks = require "moongraph.tasks"
local algo = require "moongraph.engine.algo"
local writer = require "moongraph.engine.writer"
local events = require "moongraph.engine.events"

local _M = {}

local wall0, mono0, last_int = nil, nil, 0
local id_high, id_high_hex = nil, nil
local HEX2 = {}
for i = 0, 255 do HEX2[i] = string_format("%02x", i) end

-- new_id(run) -> a checkpoint id above run.last_id and every id made here,
-- and its creation time in milliseconds since the epoch
function _M.new_id(run)
  local now = tasks.now()
  if not wall0 then wall0, mono0 = os_time() * 1000, now end
  local ms = wall0 + ((now - mono0) * 1000 // 1 | 0)   -- floor, as an integer
  local v = ms * 1024
  if v <= last_int then v = last_int + 1 end
  local after = run.last_id
  -- an id made here is below last_int already: only another's is read
  if after and after ~= run.own_id then
    after = tonumber(after, 16)
    if after and v <= after then v = after + 1 end
  end
  last_int = v
  -- the upper 12 hex digits change every 64 ms: formatted then only
  local high = v >> 16
  if high ~= id_high then id_high, id_high_hex = high, string_format("%012x", high) end
  local low = v & 0xffff
  local id = id_high_hex .. HEX2[low >> 8] .. HEX2[low & 0xff]
  run.last_id, run.own_id = id, id
  return id, ms
end

-- the UTC time as checkpoints show it, formatted once per second
local ts_second, ts_text = nil, nil
local function timestamp(ms)
  local t = ms // 1000
  if t ~= ts_second then ts_second, ts_text = t, os_date("!%Y-%m-%dT%H:%M:%SZ", t) end
  return ts_text
end

--[[ shared_list(run, node, which) -> the `next` list {{node = node}}
(which "next") or the metadata `ran` list {node} (which "ran") of a step
with that one task, made once per node. Only for runs without a stream,
where these tables go to the saver alone (which copies what it keeps and
never writes into what it is given). ]]
function _M.shared_list(run, node, which)
  local spec = run.nodes[node]
  local lists = spec.saved_lists
  if not lists then
    lists = { next = { { node = node } }, ran = { node } }
    spec.saved_lists = lists
  end
  return lists[which]
end

--[[ save(run, plan, source, ran)
A checkpoint of the run's state before `plan`, parented on run.cp_id;
metadata {source = "input"|"loop"|"update", step, ran = node names}, and
the keys of the run's cfg.metadata. ]]
function _M.save(run, plan, source, ran)
  local next_list
  local only = not plan[2] and plan[1]
  if only and not only.send and not run.sink then
    local lists = run.nodes[only.node].saved_lists
    next_list = lists and lists.next or _M.shared_list(run, only.node, "next")
  else
    next_list = {}
    for i, t in ipairs(plan) do
      if t.send then
        next_list[i] = { node = t.node, send = t.send, arg = t.arg }
      else
        next_list[i] = { node = t.node }
      end
    end
  end
  local barriers, deferred = nil, nil
  if run.barriers and next(run.barriers) then
    barriers = {}
    for k, set in pairs(run.barriers) do
      local l = {}
      for s in pairs(set) do l[#l + 1] = s end
      table_sort(l)
      barriers[k] = l
    end
  end
  if run.deferred and next(run.deferred) then
    deferred = {}
    for n in pairs(run.deferred) do deferred[#deferred + 1] = n end
    table_sort(deferred)
  end
  local id, ms = _M.new_id(run)
  local cp, md
  local scratch = run.writer.reuse and not run.sink and run.cp_scratch
  if scratch then
    -- the saver kept a copy of the last ones: these tables are free again
    cp, md = scratch[1], scratch[2]
    cp.id, cp.ts, cp.step, cp.values = id, timestamp(ms), run.step, run.values
    cp.next, cp.barriers, cp.deferred = next_list, barriers, deferred
    md.source, md.step, md.ran = source, run.step, ran
  else
    cp = {
      v = 1, id = id, ts = timestamp(ms), step = run.step, values = run.values,
      next = next_list, barriers = barriers, deferred = deferred,
    }
    local own = run.metadata
    if own then
      -- the run's own metadata (cfg.metadata) first: the engine's keys win
      md = {}
      for k, v in pairs(own) do md[k] = v end
      md.source, md.step, md.ran = source, run.step, ran
    else
      md = { source = source, step = run.step, ran = ran }
    end
    if run.writer.reuse and not run.sink then run.cp_scratch = { cp, md } end
  end
  local parent = run.cp_id
  run.cp_parent = parent
  -- writer.current_cfg(run), without the call when it is made already
  local c = run.cp_cfg
  if not (c and c.checkpoint_id == parent) then c = writer.current_cfg(run) end
  local got = writer.put(run, "put", c, cp, md)
  if run.writer.mode ~= "exit" then run.saved_id = id end
  run.cp_id = id
  if got then writer.adopt_cfg(run, got) end
  local sink = run.sink
  if sink and sink.modes.debug then
    events.emit(run, "debug", nil, nil, { type = "checkpoint", step = run.step, id = id,
      values = run.values, next = next_list, metadata = md })
  end
  if sink and sink.modes.checkpoints then
    local names = {}
    for i, e in ipairs(next_list) do names[i] = e.node end
    local parent = run.cp_parent
    events.emit(run, "checkpoints", nil, nil, {
      config = writer.cfg(run, id), values = run.values, next = names, metadata = md,
      created_at = cp.ts,
      parent_config = parent and writer.cfg(run, parent) or nil,
    })
  end
end

-- The records of the run's tasks before tuple: for each earlier checkpoint
-- of the run (following parents through the saver, back to the one its
-- input made), the results its planned tasks left in its pending writes.
local function run_records(run, tuple)
  local steps = {}
  local at, hops = tuple, 0
  while hops < 1000 do
    local md = at.metadata
    if type(md) == "table" and (md.source == "input" or md.source == "update") then break end
    local parent = at.parent_config and at.parent_config.checkpoint_id
    if not parent then break end
    local ok, got = pcall(run.saver.get, run.saver, { thread_id = run.thread_id,
      checkpoint_ns = run.ns, checkpoint_id = parent })
    if not ok or not got then break end
    local cp = got.checkpoint
    local step = (cp.step or -1) + 1
    local by = algo.group_writes(got)
    local list = {}
    for _, e in ipairs(cp.next or {}) do
      local t = { node = e.node, send = e.send, id = algo.task_id(step, e.node, e.send) }
      local w = by[t.id]
      if w then
        local res, finished = algo.from_writes(w, t, step)
        if finished then list[#list + 1] = res end
      end
    end
    steps[#steps + 1] = list
    at, hops = got, hops + 1
  end
  local records = {}
  for i = #steps, 1, -1 do
    for _, r in ipairs(steps[i]) do records[#records + 1] = r end
  end
  return records
end

--[[ restore(run, tuple [, with_records]) -> plan
The run as the saved checkpoint left it: values, step, join barriers,
deferred nodes, the plan of the next step, and (with_records: a run that
goes on) the records of its earlier tasks. ]]
function _M.restore(run, tuple, with_records)
  local cp = tuple.checkpoint
  run.values = cp.values or {}
  run.step = cp.step or -1
  run.cp_id = cp.id
  run.saved_id = cp.id
  run.barriers, run.deferred = nil, nil
  if cp.barriers then
    run.barriers = {}
    for k, l in pairs(cp.barriers) do
      local set = {}
      for _, s in ipairs(l) do set[s] = true end
      run.barriers[k] = set
    end
  end
  if cp.deferred then
    run.deferred = {}
    for _, n in ipairs(cp.deferred) do run.deferred[n] = true end
  end
  run.records = with_records and run_records(run, tuple) or nil
  return algo.restore_plan(run, cp.next, cp.id)
end

return _M
