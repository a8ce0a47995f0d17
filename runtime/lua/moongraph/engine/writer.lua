--[[
moongraph.engine.writer — how a run's checkpoints and pending writes reach
its saver, by durability mode:

  sync   each write is awaited before the run goes on
  async  one writer task per run issues the writes in order while the run
         goes on; the run waits for all of them at its end. A saver with
         put_batch gets the writes in batches of one call each (one
         transaction, one round trip): a batch goes once the run has
         queued nothing new for GATHER_PASSES turns of the scheduler (it
         waits on something outside the process, or it ended), so the steps
         a run computes in a row share one batch. A saver whose calls never
         yield (yields = false) is called at once, as with sync
  exit   the latest checkpoint of each namespace and its writes are kept in
         memory and saved when the run (or subgraph run) ends (a run that
         made no checkpoint: its writes to the one it started from)

With `drop_unsaved` (the run's cfg.drop_unsaved) the root run's writes not
yet issued when it ends are dropped instead of saved (async: the queue;
exit: the final checkpoint); writes already on their way complete. For a
caller that makes the run's outcome durable itself and then deletes the
thread (the worker stores a job's result): a crash before that costs what a
crash at the run's end would. `on_save` (the run's cfg.on_first_save) is
called once, when the first write is handed to the saver: a run that never
called it left nothing in the saver, and such a caller has nothing to delete.

A writer belongs to the root run and is shared by its subgraph runs. The
first saver failure is kept in writer.err and ends the run; later writes
are dropped.

  writer.new(saver, mode, thread_id, drop_unsaved, on_save) -> w
                                     (w.reuse: the tables of a write may be
                                     reused once put returns)
  writer.put(run, op, cfg, a, b)     op "put" (checkpoint, metadata) or
                                     "put_writes" (task id, writes); what
                                     the saver returned when it was called
                                     at once
  writer.save_writes(run, task_id, writes)
  (a saver's optional put_batch(list) takes a list of {op =, a =, b =, c =}
  in order: async and exit use it)
  writer.flush(run) -> true | nil, err     every write of run done
  writer.drain(w)                           (async) the queue issued and done
  writer.close(run)
  writer.settle(saver, thread_id)           wait for writes still on their way
                                            from earlier (cancelled) runs

A run cancelled while a write is on its way (an async writer's queue, a
file write on the thread pool, a query sent) does not take that write back:
it lands a little later. So that the next run on the same thread reads the
head those writes leave, and does not find a checkpoint appearing under it,
writes to a saver that yields run in tasks of their own; one that outlives
its run (an async writer still emptying its queue, a write the run was
cancelled waiting for) is kept per thread, and a root run settles its
thread before it reads the head. A saver
whose calls never yield (memory) sets `yields = false` and is called
inline: a task cannot be cancelled in the middle of such a call.
]]

local type, tostring, pcall, ipairs, pairs, next, setmetatable =
  type, tostring, pcall, ipairs, pairs, next, setmetatable

-- the most writes one put_batch call carries
local BATCH = 64
-- turns of the scheduler without a new write before a batch goes: a run
-- that computes queues a write every few turns (a node's task starts, runs,
-- hands its result back; a fan-out's tasks take a few more); one waiting on
-- I/O queues none
local GATHER_PASSES = 8

local errors = require "moongraph.errors"
local tasks = require "moongraph.tasks"
local json = require "moongraph.json"
local copy, copy_state = json.copy, json.copy_state

local _M = {}

function _M.new(saver, mode, thread_id, drop_unsaved, on_save)
  return { saver = saver, mode = mode, thread_id = thread_id, err = nil, q = nil, task = nil, limit = 1,
           drop_unsaved = drop_unsaved or false, dropping = false, on_save = on_save,
           -- the tables a write hands over are done with once put returns:
           -- the saver is called at once and keeps copies (keeps_copies)
           reuse = saver.yields == false and saver.keeps_copies == true and mode ~= "exit" }
end

-- saver -> thread_id -> { [task] = true }: write tasks that outlived their run
local inflight = setmetatable({}, { __mode = "k" })

local function track(saver, thread_id, task)
  local by_thread = inflight[saver]
  if not by_thread then by_thread = {}; inflight[saver] = by_thread end
  local set = by_thread[thread_id]
  if not set then set = {}; by_thread[thread_id] = set end
  set[task] = true
end

-- Wait until every write task of this saver and thread has ended.
function _M.settle(saver, thread_id)
  local by_thread = inflight[saver]
  local set = by_thread and by_thread[thread_id]
  if not set then return end
  local t = next(set)
  while t do
    if not t:done() then t:join() end
    set[t] = nil
    t = next(set)
  end
  if by_thread[thread_id] == set then by_thread[thread_id] = nil end
end

-- a saver call that raised (ok false) or returned nil, err
local function failed(w, op, ok, r1, r2)
  w.err = errors.saver_failed(op, ok and r2 or r1)
end

-- a write is about to be handed to the saver: the first one calls on_save
local function saving(w)
  local f = w.on_save
  if f then
    w.on_save = nil
    pcall(f)
  end
end

local function saver_call_here(w, op, a, b, c)
  saving(w)
  local ok, r1, r2 = pcall(w.saver[op], w.saver, a, b, c)
  if not ok or r1 == nil then failed(w, op, ok, r1, r2) end
end

-- fn(w, ...) from the run's own task (sync, exit): in a task of its own
-- when the saver yields, so that cancelling the run leaves a write that
-- settle() can still wait for.
local function detached(fn, w, ...)
  if w.saver.yields == false or not w.thread_id then return fn(w, ...) end
  local t = tasks.spawn(fn, w, ...)
  -- tracked while the run waits: if the run is cancelled meanwhile, the
  -- task stays in the set until a settle() sees it end
  track(w.saver, w.thread_id, t)
  t:join()
  local set = inflight[w.saver][w.thread_id]
  if set then set[t] = nil end
end

local function saver_call(w, op, a, b, c)
  detached(saver_call_here, w, op, a, b, c)
end

-- A batch that fails (a lost connection, a restarting server) is sent
-- again after these pauses: it is idempotent (upserts; a saver takes a
-- checkpoint it already has as the latest). A conflict is not retried.
local RETRY = { 0.05, 0.25, 1 }

local function batch_call(w, list)
  saving(w)
  for attempt = 1, #RETRY + 1 do
    local ok, r1, r2 = pcall(w.saver.put_batch, w.saver, list)  -- in the writer task
    if ok and r1 ~= nil then return end
    local err = ok and r2 or r1
    if not ok or attempt > #RETRY or errors.has(err, "conflict") then
      failed(w, "put_batch", true, nil, err)
      return
    end
    tasks.sleep(RETRY[attempt])
  end
end

--[[ The async writer of a saver with put_batch: whatever the run queued
while the previous batch was on its way goes in the next one, in order. ]]
local function gather(w, q)
  local n, quiet = q:len(), 0
  while quiet < GATHER_PASSES and n < BATCH and not w.dropping do
    tasks.sleep(0)
    local m = q:len()
    if m > n then quiet = 0 else quiet = quiet + 1 end
    n = m
  end
end

local function batch_loop(w)
  local q = w.q
  while true do
    local job = q:get()
    if job == nil then return end
    if not job.flush then
      gather(w, q)
    end
    local list, flushes = {}, nil
    while job do
      if job.flush then
        flushes = flushes or {}
        flushes[#flushes + 1] = job.flush
      elseif not w.err then
        list[#list + 1] = job
      end
      if #list >= BATCH or q:len() == 0 then break end
      job = q:get()
    end
    if list[1] and not w.dropping then batch_call(w, list) end
    if flushes then
      for i = 1, #flushes do flushes[i]:put(true) end
    end
  end
end

--[[ The async writer: issues the run's writes in order. A saver that sets
`concurrent_writes = n` gets up to n writes in flight at once (the file
saver's fsyncs then share journal commits); two writes to the same target
(the same task's writes of one checkpoint) still complete in order. Order
between different targets does not matter for recovery: a later checkpoint
already holds the results of every pending write of the earlier ones. ]]
local function writer_loop(w)
  local q = w.q
  local limit = w.limit
  local inflight, busy, done = 0, {}, nil
  local function one(job)
    saver_call_here(w, job.op, job.a, job.b, job.c)
    busy[job.key] = nil
    done:put(true)
  end
  while true do
    local job = q:get()
    if job == nil then
      -- closed: the task ends when its last write has
      while inflight > 0 do done:get(); inflight = inflight - 1 end
      return
    end
    if job.flush then
      while inflight > 0 do done:get(); inflight = inflight - 1 end
      job.flush:put(true)
    elseif not w.err and not w.dropping then
      if limit <= 1 then
        saver_call_here(w, job.op, job.a, job.b, job.c)
      else
        done = done or tasks.queue()
        while inflight >= limit or busy[job.key] do
          done:get()
          inflight = inflight - 1
        end
        busy[job.key] = true
        inflight = inflight + 1
        tasks.spawn(one, job)
      end
    end
  end
end

-- The saver config of checkpoint `id` in the run's namespace.
function _M.cfg(run, id)
  return { thread_id = run.thread_id, checkpoint_ns = run.ns, checkpoint_id = id }
end

-- The config of the run's current checkpoint (run.cp_id), made once per
-- checkpoint: the writes of the step after it and the checkpoint that
-- follows it name the same one. Nothing writes into it.
local function current_cfg(run)
  local c = run.cp_cfg
  if c and c.checkpoint_id == run.cp_id then return c end
  c = _M.cfg(run, run.cp_id)
  run.cp_cfg = c
  return c
end
_M.current_cfg = current_cfg

-- got: what the saver's put of checkpoint run.cp_id returned. When it is
-- the config current_cfg would make, it serves as that one.
function _M.adopt_cfg(run, got)
  if type(got) == "table" and got.checkpoint_id == run.cp_id and got.thread_id == run.thread_id and
    got.checkpoint_ns == run.ns and got.head_id == nil then
    run.cp_cfg = got
  end
end

--[[ snapshot_values(run, values) -> a copy of the run's values for the
async writer | nil (a value cannot be saved). A key no write reached since
the run's last snapshot (run.written, which the engine marks) and that
holds the very value it held then keeps that snapshot's copy, without a
walk: nodes treat the state as read only and return their changes
(docs/graphs.md), so such a value is unchanged. Any other key is copied
against its last copy, whose unchanged parts keep their identity. Either
way a value unchanged since the last snapshot is the very table it was
then, and a saver can skip re-encoding it. ]]
local function snapshot_values(run, values)
  local src = run.snap_src
  if not src then
    src = {}
    run.snap_src, run.written = src, {}
  end
  local c = copy_state(values, run.snap, src, run.written)
  if c == nil then
    -- src may be part updated: start over, and the value as copy takes it
    run.snap, run.snap_src, run.written = nil, nil, nil
    return copy(values)
  end
  run.snap = c
  return c
end

--[[ snapshot(run, cp) -> the checkpoint cp as the async writer keeps it, and
whether its values are a copy: its values copied (snapshot_values), and the
Send args in its `next` list. The rest of cp, and the metadata, the engine
made for this checkpoint alone and never changes. ]]
local function snapshot(run, cp)
  local s = {}
  for k, v in pairs(cp) do s[k] = v end
  local values = type(cp.values) == "table" and snapshot_values(run, cp.values) or nil
  if values ~= nil then s.values = values end
  local next_list = cp.next
  if type(next_list) == "table" then
    for i = 1, #next_list do
      if next_list[i].send then
        s.next = copy(next_list) or next_list
        break
      end
    end
  end
  return s, values ~= nil
end

function _M.put(run, op, a, b, c)
  local w = run.writer
  if w.err then return end
  local mode = w.mode
  if op == "put" and run.fork_head and mode ~= "exit" then
    -- a fork: the saver checks that the namespace's latest checkpoint is
    -- still the one this run saw (head_id), not the one it extends
    a = { thread_id = a.thread_id, checkpoint_ns = a.checkpoint_ns, checkpoint_id = a.checkpoint_id,
      head_id = run.fork_head }
    run.fork_head = nil
  end
  local saver = w.saver
  if saver.yields == false and mode ~= "exit" then
    -- a saver whose calls never yield is done at once: a writer task
    -- would only add a queue and two task switches per write
    saving(w)
    local ok, r1, r2 = pcall(saver[op], saver, a, b, c)
    if not ok or r1 == nil then failed(w, op, ok, r1, r2) end
    if ok then return r1 end
  elseif mode == "sync" then
    saver_call(w, op, a, b, c)
  elseif mode == "async" then
    if not w.q then
      local n = w.saver.concurrent_writes
      w.limit = type(n) == "number" and n >= 1 and n or 1
      w.q = tasks.queue()
      w.task = tasks.spawn(type(w.saver.put_batch) == "function" and batch_loop or writer_loop, w)
    end
    -- the run's data as it is now: the run goes on, and its nodes may
    -- change tables this write holds before the writer task reaches it (a
    -- value that cannot be saved goes as it is: the saver names it)
    local owned = nil
    if op == "put" then
      b, owned = snapshot(run, b)
    elseif type(c) == "table" then
      c = copy(c) or c
    end
    -- the target, for a writer that has several writes in flight: a
    -- checkpoint, or one task's writes for a checkpoint
    local key = nil
    if w.limit > 1 then
      key = op == "put" and b.id or (a.checkpoint_ns .. "\0" .. a.checkpoint_id .. "\0" .. b)
    end
    -- (owned: the values are copies nobody changes, see put_batch)
    w.q:put { op = op, a = a, b = b, c = c, key = key, owned = owned }
  else -- exit: remember the latest checkpoint of this namespace and its writes
    local ex = run.exit
    if op == "put" then
      ex.put = { a, b, c }
      ex.writes = {}
    else
      ex.writes[#ex.writes + 1] = { a, b, c }
    end
  end
end

-- A task's writes, as pending writes of the checkpoint the step started from.
function _M.save_writes(run, task_id, writes)
  local c = run.cp_cfg
  if not (c and c.checkpoint_id == run.cp_id) then c = current_cfg(run) end
  local w = run.writer
  if w.reuse then
    -- put's path for a saver called at once, without the call
    if w.err then return end
    saving(w)
    local saver = w.saver
    local ok, r1, r2 = pcall(saver.put_writes, saver, c, task_id, writes)
    if not ok or r1 == nil then failed(w, "put_writes", ok, r1, r2) end
    return
  end
  _M.put(run, "put_writes", c, task_id, writes)
end

-- async: wait until the writer has issued and finished every queued write
function _M.drain(w)
  local reply = tasks.queue()
  w.q:put { flush = reply }
  reply:get()
end

--[[ flush(run) -> true | nil, err: every write of this run issued and done
(for a subgraph run under `exit`: its buffered checkpoint and writes saved). ]]
function _M.flush(run)
  local w = run.writer
  if not w then return true end
  if w.mode == "exit" then
    local ex = run.exit
    if run.root and w.drop_unsaved then
      ex.put, ex.writes = nil, {}
    end
    -- the latest checkpoint and the writes since; or, for a run that made
    -- no checkpoint (a resumed one stopped again in the step it resumed),
    -- the writes to the checkpoint it resumed from (its resume value, a new
    -- interrupt, the results of the tasks that finished)
    local p, writes = ex.put, ex.writes
    ex.put, ex.writes = nil, {}
    if p then
      -- the parent is the last checkpoint actually saved in this namespace
      p[1] = _M.cfg(run, run.saved_id)
      if run.fork_head then
        p[1].head_id = run.fork_head
        run.fork_head = nil
      end
    end
    if p or writes[1] then
      if type(w.saver.put_batch) == "function" then
        -- all of it together
        local list = {}
        if p then list[1] = { op = "put", a = p[1], b = p[2], c = p[3] } end
        for _, wr in ipairs(writes) do
          list[#list + 1] = { op = "put_writes", a = wr[1], b = wr[2], c = wr[3] }
        end
        detached(batch_call, w, list)
      else
        if p then saver_call(w, "put", p[1], p[2], p[3]) end
        for _, wr in ipairs(writes) do
          if w.err then break end
          saver_call(w, "put_writes", wr[1], wr[2], wr[3])
        end
      end
    end
  elseif w.mode == "async" and w.q and run.root then
    if w.drop_unsaved then w.dropping = true end
    _M.drain(w)
  end
  if w.err then return nil, w.err end
  return true
end

function _M.close(run)
  local w = run.writer
  if w and run.root and w.q then
    w.q:close()
    w.q = nil
    -- a run cancelled with writes still queued: they go on after it
    if w.thread_id and not w.task:done() then track(w.saver, w.thread_id, w.task) end
  end
end

return _M
