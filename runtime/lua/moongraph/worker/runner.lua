-- moongraph.worker.runner — one job, from delivery to acknowledgement.
--
--   outcome = runner.run(W, entry, js)
--     W: the worker (redis, db, queue, scripts, saver, cfg, key, log,
--        metrics, llm); entry: {id, fields, deliveries}; js: the job's slot
--        record ({ id, task, phase, lease, preempted, stop_run, acking },
--        shared with the lease renewer).
--   outcome: "done" | "failed" | "rejected" | "preempted" | "dead" | "duplicate" | "released"
--
-- The order of things is what makes a job run once:
--
--   1. decode; a bad job (or one with an unknown script, or delivered more
--      than max_deliveries times) goes to the dead-letter stream, its
--      listeners get error + done, and it is acknowledged;
--   2. a job that already has a row in job_results only finishes its
--      events and is acknowledged (a duplicate delivery, or a worker that
--      died after storing the result); the script's `forget` hook runs;
--   2b. the job takes its conversation's lease (moongraph.multitask; one job
--      of a thread_id at a time, by its multitask_strategy) and claims the
--      thread's fence in Postgres with the lease's token — for a first
--      delivery of an `enqueue` job (the default) that statement also does
--      the reading of step 2; a job that cannot have the lease (reject) or
--      is stopped by a later one (interrupt, rollback) is stored with that
--      status and reason in step 4;
--   3. otherwise its run starts, or resumes from the checkpoints of thread
--      "job:<job_id>" when an earlier attempt left some (only unfinished
--      tasks run again; a first delivery has none and reads none: should
--      one exist after all (Redis lost the delivery count), the run starts
--      over, and a checkpoint it writes conflicts, after which the job reads
--      the saved one and resumes); a new run's input is the job's input, or
--      what the script's `input` hook builds from it. A run is not resumed
--      when another job of the thread stored its result since it began (it
--      read the thread's memory before that turn): it starts over;
--   4. the result (what the `result` hook makes of the final state) and
--      whatever the `record` hook writes are stored in one Postgres
--      transaction, insert-once on job_id and refused if the thread's fence
--      moved past this job's token: `record` runs exactly once per job; the
--      job's checkpoints are deleted in that transaction when the saver
--      keeps them in the same database (checkpointer.in_results_db);
--   5. then the `committed` hook (caches), the thread is released, answer
--      and done events (written once), XACK + XDEL, and the job's
--      checkpoints are deleted (those step 4 did not).
--
-- A run of the LangGraph API (a job with a `run` field,
-- moongraph.worker.langgraph) goes through the same steps, except that its
-- run goes on the thread's own checkpoints (kept, unless its thread is
-- temporary), without the script's hooks; an earlier attempt that started
-- it makes a later one continue from the thread's last checkpoint; step 4
-- also writes its run and thread rows; serve can cancel it while it runs.
--
-- Infrastructure that is away for a moment (a restart, a failover) is
-- waited for in place before step 4, with backoff, up to the job's
-- deadline (job_timeout from its start); only then is the job left pending
-- for a later attempt ("released"). Steps 4 and 5 retry until they succeed
-- or the job is cancelled (drain, lost lease), and a later attempt picks
-- up from step 2.

local errors = require "moongraph.errors"
local mg = require "moongraph"
local json = require "moongraph.json"
local cjson = json.wire()
local job = require "moongraph.worker.job"
local events = require "moongraph.worker.events"
local results = require "moongraph.worker.results"
local checkpointer = require "moongraph.worker.checkpointer"
local lg = require "moongraph.worker.langgraph"
local error_message = require("moongraph.text").error_message
local public_error = require "moongraph.public_error"
local to_utf8 = require("moongraph.text").to_utf8
local loop = require("moongraph.core").loop

local type, tostring, pairs, ipairs, pcall, setmetatable, error =
  type, tostring, pairs, ipairs, pcall, setmetatable, error
local floor, min = math.floor, math.min

local _M = {}

-- Attempts at storing the result while the `record` hook fails (or a
-- statement it sent fails at the commit, for a reason other than the
-- database being away); then the job is stored as failed without it.
_M.RECORD_ATTEMPTS = 3

local function ms(sec) return floor(sec * 1e6 + 0.5) / 1000 end

-- An error's message without the traceback, as text PostgreSQL stores
-- (invalid UTF-8 as U+FFFD, NUL spelled out).
local function first_line(e)
  return (to_utf8(error_message(e)):gsub("%z", "\\u0000"))
end

-- The run of `tup` against this delivery's claim, by the count of the
-- thread's results each found (a run's checkpoints keep its claim's):
-- "moved" when the thread stored another job's result since the run began,
-- "later" when a later delivery of this job (under a later lease) saved
-- it, so this one was overtaken; nil otherwise (and for checkpoints of an
-- earlier version, which keep no count: they are resumed).
local function since_run(tup, commits)
  local md = tup.metadata
  local then_ = type(md) == "table" and md.thread_commits or nil
  if commits == nil or then_ == nil or then_ == commits then return nil end
  return then_ < commits and "moved" or "later"
end

-- Retry fn() -> ok | nil, err with backoff until it succeeds; the task may
-- be cancelled meanwhile (drain, lost lease).
local function persist(log, what, fn)
  local delay = 0.05
  while true do
    local ok, err = fn()
    if ok then return ok end
    log:warn(what .. " failed; retrying", { error = tostring(err), retry_in = delay })
    mg.sleep(delay)
    delay = min(delay * 2, 2)
  end
end
_M.persist = persist

-- The events that end a job (written once, with done last).
local function final_events(row, extra)
  local list = {}
  if row.status == "done" then
    local data = {}
    for k, v in pairs(extra and extra.event or {}) do data[k] = v end
    data.answer, data.thread_id = row.answer or "", row.thread_id
    list[#list + 1] = { "answer", data }
  elseif row.error then
    -- of a failure the client learns which node failed, the error itself
    -- is the worker's log's; a refusal or a preemption is the worker's own
    -- words, which it says as they are
    local said = row.status == "failed" and public_error.message(row.error, "job " .. row.job_id) or row.error
    list[#list + 1] = { "error", { error = said, node = extra and extra.node or nil } }
  end
  list[#list + 1] = { "done", { status = row.status, job_id = row.job_id,
                                duration_ms = extra and extra.duration_ms or nil } }
  return list
end

local function finish_events(W, key, list)
  return events.finish(W.redis, key, list, { maxlen = W.cfg.events_maxlen, ttl = W.cfg.events_ttl })
end

-- Acknowledge the entry. js.acking is set first: from then on the entry
-- leaves this consumer's pending list by our own hand, and the lease
-- renewer must not take its absence for a claim by another worker.
local function ack(W, log, entry, js)
  js.acking = true
  persist(log, "XACK", function() return W.queue:ack(entry.id) end)
end

-- A job that cannot run: dead-letter it (with the reason), tell its
-- listeners when it has a usable job_id, acknowledge.
-- Give the job's thread to the next job (no retry: the lease expires
-- anyway after its ttl).
-- Store the job's result once (results.commit): true, the stored row
-- (row.inserted says whether this attempt inserted it) | nil, FENCED when
-- the thread's fence moved past this job's token | nil, err to try again.
local FENCED = {}
local function commit_result(W, row, also, fence, cleanup)
  local ok, inserted, stored = pcall(results.commit, W.db, row, also, fence, cleanup)
  if ok and inserted ~= nil then
    row.inserted = inserted
    return true, stored
  end
  local err = ok and stored or inserted
  if errors.has(err, "stale") then return nil, FENCED end
  return nil, err
end

local function release_thread(js)
  local l = js.lease
  if not l then return end
  js.lease = nil
  pcall(l.release, l)
end

-- Errors of an infrastructure that is away for a moment (a restart, a
-- failover, a full pool): worth retrying in place. The client that made
-- the error knows (its retryable), also through the wraps of a node's or a
-- checkpointer's failure.
local transient = errors.retryable
_M.transient = transient

-- Attempts at a step whose error is not known to be transient (a
-- checkpointer failing for another reason) before the job gives up.
_M.OTHER_ATTEMPTS = 3

-- Retry fn() -> v | nil, err in place while its error is transient (or,
-- for `other` errors, up to OTHER_ATTEMPTS times), with backoff, until the
-- job's deadline or the worker's drain: v | nil, err.
local function retry(W, log, what, deadline, fn, other)
  local delay, attempts = 0.05, 1
  while true do
    local v, err = fn()
    if v ~= nil or err == nil then return v, err end
    local again = transient(err) or (other and attempts < _M.OTHER_ATTEMPTS)
    if not again or W.stopping or mg.now() + delay > deadline then return nil, err end
    log:warn(what .. " failed; retrying", { error = first_line(err), retry_in = delay, attempt = attempts })
    mg.sleep(delay)
    delay = min(delay * 2, 2)
    attempts = attempts + 1
  end
end

-- A LangGraph run refused before it ran: its row says error and its thread
-- is left as it was (busy only while another run of it is pending). Tried
-- for a moment only: the job's events already tell join and wait, so a
-- database that stays down costs only the row.
local function refuse_run(W, log, j, reason)
  local ok, err = retry(W, log, "marking the refused run", mg.now() + 2, function()
    return W.db:transaction(function(tx)
      local r, rerr = lg.record(tx, j, { status = "error", error = { error = "JobRefused", message = reason } })
      if not r then error(rerr, 0) end
      return true
    end)
  end, true)
  if not ok then log:warn("the refused run's row is left as it was", { error = first_line(err) }) end
end

-- j: the job as normalized, when it got that far.
local function dead(W, entry, reason, job_id, js, j)
  release_thread(js)
  local log = W.log:with { entry_id = entry.id, job_id = job_id }
  js.phase = "finishing"
  log:warn("job refused: dead-lettered", { reason = reason, deliveries = entry.deliveries })
  if j and j.run then refuse_run(W, log, j, reason) end
  if job_id then
    local key = W.cfg.keys.events .. job_id
    persist(log, "error events", function()
      local r, err = finish_events(W, key, {
        { "error", { error = reason } },
        { "done", { status = "dead", job_id = job_id } },
      })
      if r == nil then return nil, err end
      return true
    end)
  end
  js.acking = true
  persist(log, "dead-letter", function()
    return W.queue:dead(entry.id, entry.fields, reason, { deliveries = entry.deliveries or 1 })
  end)
  W.metrics:inc("jobs_dead")
  return "dead"
end

local function release(W, log, why)
  log:warn("job left pending for a later attempt", { reason = why })
  W.metrics:inc("jobs_released")
  return "released"
end

-- release, for a job whose run began: the events it queued are still
-- sent, a second later
local function release_run(W, log, em, why)
  mg.timeout(1, em.flush, em)
  return release(W, log, why)
end

-- This worker stalled past its thread's lease and a later job of the
-- thread went ahead: nothing of this attempt is stored.
local function overtaken(W, log, js, em)
  js.lease = nil
  return release_run(W, log, em, "the thread's lease passed to a later job while this one ran (stalled worker)")
end

-- What the hooks of one delivery share: the worker's connections, a key
-- helper, the job's log, the LLM client, and `scratch` (a table the hooks
-- may use to hand things to the later hooks of the same delivery).
local function hook_env(W, log)
  return { redis = W.redis, db = W.db, key = W.key, prefix = W.cfg.prefix,
           log = log, llm = W.llm, scratch = {} }
end

-- The input of a new run: input | nil, err (leave the job for a later
-- attempt) | raises (the script refuses the job).
local function build_input(script, j, env)
  local hook = script.hooks.input
  if not hook then return j.input end
  local input, err = hook(j, env)
  if input == nil then
    if err ~= nil then return nil, tostring(err) end
    error("the input hook returned no input", 0)
  end
  return input
end

-- What to store: { answer, state, event } | raises.
local function extract(script, state, j)
  local hook = script.hooks.result
  if not hook then
    local a = state.answer
    return { answer = type(a) == "string" and a or nil, state = state }
  end
  local r = hook(state, j)
  if type(r) ~= "table" then
    error("the result hook must return a table {answer=, state=}, got " .. type(r), 0)
  end
  if r.answer ~= nil and type(r.answer) ~= "string" then
    error("the result hook's answer must be a string or nil, got " .. type(r.answer), 0)
  end
  if r.state ~= nil and type(r.state) ~= "table" then
    error("the result hook's state must be a table or nil, got " .. type(r.state), 0)
  end
  if r.event ~= nil then
    if type(r.event) ~= "table" then
      error("the result hook's event must be a table or nil, got " .. type(r.event), 0)
    end
    local _, eerr = cjson.encode(r.event)
    if eerr then error("the result hook's event cannot be written as JSON: " .. tostring(eerr), 0) end
  end
  return { answer = r.answer, state = r.state == nil and state or r.state, event = r.event }
end

-- Run a hook that follows the commit (committed, forget): retried while
-- it returns nil, err (Redis away); one that raises is logged, not retried.
local function after_hook(log, what, fn, ...)
  local args = table.pack(...)
  persist(log, what, function()
    local ok, r, err = pcall(fn, table.unpack(args, 1, args.n))
    if not ok then
      log:error(what .. " raised; not retried", { error = error_message(r) })
      return true
    end
    if r == nil and err ~= nil then return nil, err end
    return true
  end)
end

-- Run body() -> v in a child task for at most `limit` seconds: v | nil, err.
-- The lease renewer stops it (js.stop_run) when a later job of the thread
-- interrupts or rolls it back.
local function run_child(W, js, limit, body)
  local child = loop.limit(mg.spawn(function()
    local sok, s = pcall(body)
    if not sok then return nil, s end
    return s
  end), mg.now() + limit)
  local guard <close> = setmetatable({}, { __close = function()
    js.stop_run = nil
    if not child:done() then child:cancel() end
  end })
  js.stop_run = function() if not child:done() then child:cancel() end end
  local ok, state, err = child:join(limit)
  if js.preempted then return nil, "preempted" end
  if not ok then
    if state == "timeout" then return nil, "the job timed out after " .. W.cfg.job_timeout .. " s" end
    return nil, state
  end
  if state == nil then return nil, err end
  return state
end

-- Run the graph for at most `limit` seconds, streaming its events;
-- returns state | nil, err.
local function run_graph(W, js, script, input, cfg, em, log, attempt, limit)
  local metrics = W.metrics
  local log_nodes = log:enabled("info")
  -- the run's node and token events, handed over as it makes them (in its
  -- own task: the emitter queues them and never waits)
  cfg.on_event = function(ev)
    local mode = ev.mode
    if mode == "messages" then
      if type(ev.data) == "string" then
        em:token(ev.node, ev.data)
      end
    elseif mode == "tasks" then
      local d = ev.data
      if d.event == "start" then
        em:push("node_start", { node = d.name, task_id = d.id, ns = ev.ns ~= "" and ev.ns or nil,
                                attempt = attempt })
      else
        local dur = d.duration or 0
        metrics:observe("node", d.name, dur)
        local status = d.status
        local rec = { node = d.name, task_id = d.id, status = status, duration_ms = ms(dur),
                      ns = ev.ns ~= "" and ev.ns or nil, ran = d.ran }
        if d.error ~= nil then rec.error = error_message(d.error) end
        em:push("node_end", rec)
        if log_nodes then
          log:info("node finished", { node = d.name, task_id = d.id, status = status,
                                      duration_ms = rec.duration_ms, error = rec.error })
        end
      end
    end
  end
  -- the final state (with __interrupt__ when the run paused)
  local function body()
    local state, err = script.app:invoke(input, cfg)
    if state == nil then error(err, 0) end
    return state
  end
  return run_child(W, js, limit, body)
end

-- Take the lease of the job's thread (its conversation), by the job's
-- multitask_strategy: lease | nil, "busy" | "timeout" | "preempted", info
-- | nil, err (Redis, after retrying in place up to the deadline).
local function take_thread(W, j, js, log, deadline)
  local delay = 0.05
  local announced = false
  while true do
    js.phase = "waiting"
    local l, e, info = W.threads:acquire(j.thread_id, {
      run_id = j.job_id, strategy = j.multitask_strategy or "enqueue",
      timeout = math.max(0, deadline - mg.now()),
      on_preempt = function(why) W:preempt(js, why) end,
      on_wait = function(holder)
        if not announced then
          announced = true
          log:info("the thread is busy: the job waits for its turn", { thread_id = j.thread_id, holder = holder })
        end
      end,
    })
    if l then return l end
    if e == "busy" or e == "timeout" or e == "preempted" then return nil, e, info end
    if not transient(e) or W.stopping or mg.now() + delay > deadline then return nil, e end
    log:warn("taking the thread's lease failed; retrying", { error = first_line(e), retry_in = delay })
    mg.sleep(delay)
    delay = min(delay * 2, 2)
  end
end

-- What is stored for a job another job of its thread interrupted or
-- rolled back.
local function preempted_outcome(info)
  if info.cancel then
    return { status = info.strategy == "rollback" and "rolled_back" or "interrupted", no_record = true,
             error = "cancelled (" .. info.strategy .. ")" }
  end
  if info.strategy == "rollback" then
    return { status = "rolled_back", no_record = true,
             error = ("rolled back: job %s of the same thread asked for multitask_strategy rollback")
               :format(tostring(info.by)) }
  end
  return { status = "interrupted",
           error = ("interrupted by job %s of the same thread (multitask_strategy interrupt)"):format(tostring(info.by)) }
end

-- The outcome (and counter jobs_<outcome>) of a stored status.
local OUTCOMES = { failed = "failed", rejected = "rejected", interrupted = "done",
                   rolled_back = "preempted" }

-- The run's status in the LangGraph API for a job stopped before or while
-- it ran.
local FORCED_RUN_STATUS = { interrupted = "interrupted", rolled_back = "interrupted" }

--[[ A LangGraph run (moongraph.worker.langgraph), from step 3 on: the run
goes on the thread's own checkpoints, which stay; its events have the
LangGraph API's names; its run and thread rows are written with the
result. `forced`: the job cannot run (its thread refused it or a later run
stopped it). ]]
local function run_langgraph(W, entry, js, j, script, log, key, deadline, forced, t_start)
  local cfg = W.cfg
  local app = script.app
  local em = events.emitter(W.redis, key, { maxlen = cfg.events_maxlen, log = log, metrics = W.metrics,
                                            interval = cfg.events_interval, any_type = true })
  local guard <close> = setmetatable({}, { __close = function() em:abandon() end })
  local o, from
  if not forced then
    local snap, serr = retry(W, log, "reading the thread's checkpoint", deadline, function()
      local ok, sn, e = pcall(app.get_state, app, { thread_id = j.thread_id })
      if not ok then return nil, sn end
      if not sn then return nil, e end
      return sn
    end, true)
    if not snap then return release(W, log, "checkpointer: " .. first_line(serr)) end
    local how
    how, from = retry(W, log, "starting the run", deadline, function()
      return lg.begin(W.db, j.job_id, snap.config and snap.config.checkpoint_id or "")
    end)
    if how == nil then return release(W, log, "postgres: " .. first_line(from)) end
    if how == "stopped" then
      forced = { status = "interrupted", error = "cancelled before it started" }
    else
      local watcher = lg.watch_cancel(W.redis, lg.cancel_key(cfg.prefix, j.job_id), function(action)
        if js.preempted then return end
        js.preempted = { by = "cancel", strategy = action, cancel = true }
        log:info("run cancelled", { action = action })
        if js.stop_run then js.stop_run() end
      end)
      local stop_watch <close> = setmetatable({}, { __close = function()
        if not watcher:done() then watcher:cancel() end
      end })
      log:info(how == "resumed" and "run resumed from the thread's checkpoint" or "run started", {
        deliveries = entry.deliveries, script = script.name, thread_id = j.thread_id })
      js.phase = "running"
      local iok, input = pcall(lg.input, j)
      if not iok then
        o = lg.outcome(app, j, "error", first_line(input), em)
      else
        if how == "resumed" then input = nil end
        local body = lg.body(app, j, input, lg.config(j, W.llm, how == "resumed"), em)
        local ok, rerr = run_child(W, js, math.max(0, deadline - mg.now()), body)
        if js.preempted then
          forced = preempted_outcome(js.preempted)
        elseif ok then
          o = lg.outcome(app, j, "success", nil, em)
        elseif transient(rerr) or W.stopping then
          return release_run(W, log, em, first_line(rerr))
        else
          o = lg.outcome(app, j, "error", first_line(rerr), em)
        end
      end
    end
  end
  local job_status
  if forced then
    log:info("run stopped by its thread", { status = forced.status, reason = forced.error })
    job_status = forced.status
    local run_status = FORCED_RUN_STATUS[forced.status]
    if forced.status == "rolled_back" then
      persist(log, "rolling the thread back", function()
        return lg.rollback(W.saver, app, j.thread_id, from)
      end)
    end
    if run_status then
      o = lg.outcome(app, j, run_status, forced.error, nil,
        forced.status == "rolled_back" and "UserRollback" or "UserInterrupt")
    else
      o = { status = "error", error = { error = "BusyError", message = forced.error } }
    end
  else
    job_status = o.status == "success" and "done" or "failed"
  end
  local why = job.unstorable(o.output, "output")
  if why then
    o.output, o.thread = nil, nil
    o.status, job_status = "error", "failed"
    o.error = { error = "GraphError", message = why .. "; text must be UTF-8 without NUL" }
  end

  -- 4. the result, with the run's and its thread's rows, once
  local row = {
    job_id = j.job_id, thread_id = j.thread_id, user_id = j.user_id, worker = cfg.consumer,
    deliveries = entry.deliveries or 1, status = job_status,
    error = o.detail or (o.error and o.error.message) or (forced and forced.error) or nil,
    state = o.output or {},
  }
  local fence = js.lease and { thread_id = j.thread_id, token = js.lease.token } or nil
  local fenced, gone = false, false
  js.phase = "storing"
  persist(log, "storing the result", function()
    local done, err = commit_result(W, row, function(tx)
      local rok, rerr = lg.record(tx, j, o)
      if rok then gone = rerr end
      return rok, not rok and rerr or nil
    end, fence)
    if done then return true end
    if err == FENCED then
      fenced = true
      return true
    end
    return nil, err
  end)
  js.phase = "finishing"
  if fenced then return overtaken(W, log, js, em) end

  -- 5. the Redis side
  release_thread(js)
  em:flush()
  em:close()
  persist(log, "final events", function()
    local r, err = finish_events(W, key, lg.final_events(o, j.job_id, job_status))
    if r == nil then return nil, err end
    return true
  end)
  ack(W, log, entry, js)
  local outcome = OUTCOMES[job_status] or "done"
  if forced and forced.status == "interrupted" then outcome = "preempted" end
  W.metrics:inc("jobs_" .. outcome)
  local duration = mg.now() - t_start
  W.metrics:observe("job", outcome, duration)
  if j.run.temporary or (gone and row.inserted) then
    pcall(mg.checkpoint.settle, W.saver, j.thread_id)
    pcall(W.saver.delete_thread, W.saver, j.thread_id)
  end
  log:info("run done", { status = o.status, duration_ms = ms(duration), duplicate = not row.inserted or nil })
  return outcome
end

function _M.run(W, entry, js)
  local t_start = mg.now()
  local cfg = W.cfg
  local j, reason, jid = job.decode(entry.fields)
  if not j then return dead(W, entry, "bad job: " .. reason, jid, js) end
  local script = W.scripts:get(j.script)
  if not script then
    return dead(W, entry, "unknown script '" .. tostring(j.script) .. "'", j.job_id, js, j)
  end
  local hooks = script.hooks
  local log = W.log:with { job_id = j.job_id, entry_id = entry.id }
  local env = hook_env(W, log)
  local key = cfg.keys.events .. j.job_id

  -- (infrastructure that is away for a moment is waited for in place, up
  -- to the job's deadline, rather than leaving the job for claim_idle)
  local deadline = t_start + cfg.job_timeout

  -- 2. already answered? A first delivery of an `enqueue` job asks with
  -- its fence claim; the other strategies act on the thread's other jobs
  -- when they take the lease, so they ask before
  local first = (entry.deliveries or 1) == 1
  local ask_with_claim = first and (j.multitask_strategy or "enqueue") == "enqueue"
  local function duplicate(existing)
    release_thread(js)
    js.phase = "finishing"
    log:info("job already has a result: finishing it", { deliveries = entry.deliveries })
    if hooks.forget and not j.run then after_hook(log, "the forget hook", hooks.forget, j, env) end
    local list
    if j.run then
      local failed = existing.status ~= "done" and existing.status ~= "interrupted"
        and existing.status ~= "rolled_back"
      list = lg.final_events({ error = failed and { error = "GraphError",
        message = public_error.message(existing.error, "run " .. j.job_id) } or nil },
        j.job_id, existing.status)
    else
      list = final_events(existing)
    end
    persist(log, "final events", function()
      local r, err = finish_events(W, key, list)
      if r == nil then return nil, err end
      return true
    end)
    ack(W, log, entry, js)
    W.metrics:inc("jobs_duplicate")
    pcall(W.saver.delete_thread, W.saver, checkpointer.thread(j.job_id))
    return "duplicate"
  end
  if not ask_with_claim then
    local existing, gerr = retry(W, log, "reading the job's result", deadline, function()
      local row, err = results.get(W.db, j.job_id)
      if row then return row end
      if err then return nil, err end
      return false
    end)
    if existing == nil then return release(W, log, "postgres: " .. tostring(gerr)) end
    if existing then return duplicate(existing) end
  end
  if (entry.deliveries or 1) > cfg.max_deliveries then
    return dead(W, entry, ("delivered %d times without finishing (max %d)")
      :format(entry.deliveries, cfg.max_deliveries), j.job_id, js, j)
  end

  -- the thread: one job of a conversation at a time (moongraph.multitask);
  -- a job that cannot run is stored with the reason (`forced`)
  local forced = nil
  local thread_commits = nil   -- the thread's count of results, as the claim found it
  local lease, lerr, linfo = take_thread(W, j, js, log, deadline)
  if lease then
    js.lease = lease
    -- fence: from now on a stalled earlier holder cannot commit. The
    -- script's prefetch reads go with it (one round trip); should they fail
    -- (the hook raising, or a statement of theirs failing for another
    -- reason than the database being away), it goes without them and the
    -- input hook reads for itself.
    local prefetch = hooks.prefetch and not j.run
    local function without_prefetch(err)
      log:warn("the prefetch hook failed: claiming the thread without it", { error = first_line(err) })
      prefetch = false
      env.scratch = {}
    end
    local claim, cerr = retry(W, log, "claiming the thread", deadline, function()
      local reads = nil
      if prefetch then
        -- (what it reads elsewhere, before the claim takes a connection)
        local ok, r = pcall(hooks.prefetch, j, env)
        if ok and r ~= nil and type(r) ~= "function" then
          ok, r = false, "it must return nil or a function(tx), got " .. type(r)
        end
        if ok then reads = r else without_prefetch(r) end
      end
      local c, e, x = results.claim(W.db, j.thread_id, lease.token, ask_with_claim and j.job_id or nil, reads)
      if c == nil and reads and (x == "reads" or not transient(e)) then
        without_prefetch(e)
        c, e, x = results.claim(W.db, j.thread_id, lease.token, ask_with_claim and j.job_id or nil)
      end
      if c == nil then return nil, e end
      return { claimed = c, stored = e, commits = x }
    end)
    if claim == nil then return release(W, log, "postgres: " .. first_line(cerr)) end
    if claim.stored then return duplicate(claim.stored) end
    if not claim.claimed then
      js.lease = nil
      return release(W, log, "a later job of the thread holds it")
    end
    thread_commits = claim.commits
  elseif lerr == "busy" then
    forced = { status = "rejected", no_record = true,
               error = ("the thread '%s' is busy with job %s (multitask_strategy reject)")
                 :format(j.thread_id, tostring(linfo and linfo.holder)) }
  elseif lerr == "timeout" then
    forced = { status = "failed", no_record = true,
               error = ("the thread '%s' stayed busy (job %s) until the job's deadline")
                 :format(j.thread_id, tostring(linfo and linfo.holder)) }
  elseif lerr == "preempted" then
    forced = preempted_outcome(linfo)
  else
    return release(W, log, "thread lease: " .. first_line(lerr))
  end

  if j.run then return run_langgraph(W, entry, js, j, script, log, key, deadline, forced, t_start) end

  -- 3. start or resume the run; a run stopped by a transient failure (its
  -- checkpointer away) resumes here from its last checkpoint
  local thread = checkpointer.thread(j.job_id)
  local read_checkpoint = false
  local em = events.emitter(W.redis, key, { maxlen = cfg.events_maxlen, log = log, metrics = W.metrics,
                                            interval = cfg.events_interval })
  local guard <close> = setmetatable({}, { __close = function() em:abandon() end })
  local run_cfg = {
    thread_id = thread, stream_mode = { "tasks", "messages" }, llm = W.llm,
    durability = cfg.durability,
    -- what the run has not saved when it ends is superseded by the result
    -- (step 4), which also deletes the thread
    drop_unsaved = true,
    job_id = j.job_id, conversation_id = j.thread_id, user_id = j.user_id,
    -- kept with each checkpoint: a later delivery that finds the thread's
    -- count moved does not resume the run (below)
    metadata = thread_commits and { thread_commits = thread_commits } or nil,
  }
  -- whether the job's thread may hold checkpoints to delete: an earlier
  -- attempt's, or this one's once its run hands the saver a write
  local saved = not first
  run_cfg.on_first_save = function() saved = true end
  local input, built = nil, false
  local state, rerr
  local delay, failures = 0.05, 0
  local none_yet = first   -- a first delivery: no earlier attempt saved anything
  while not forced do
    if js.preempted then break end
    local tup, terr = false, nil
    if none_yet then
      none_yet = false
    else
      if failures > 0 and js.lease then
        -- the run's checkpointer failed, maybe in a conflict with a later
        -- delivery of this job: this one goes on only while its lease is
        -- the last that claimed the thread (else its run would undo that
        -- delivery's work until its commit is refused)
        local held, ferr = retry(W, log, "checking the thread's fence", deadline, function()
          local c, e = results.claim(W.db, j.thread_id, js.lease.token)
          if c == nil then return nil, e end
          return c
        end)
        if held == nil then
          return release_run(W, log, em, "postgres: " .. first_line(ferr))
        end
        if not held then return overtaken(W, log, js, em) end
      end
      tup, terr = retry(W, log, "reading the job's checkpoint", deadline, function()
        local gok, t, e = pcall(W.saver.get, W.saver, { thread_id = thread })
        if not gok then return nil, t end
        if t == nil and e then return nil, e end
        return t or false
      end, true)
      local since = tup and since_run(tup, thread_commits)
      if since == "later" then return overtaken(W, log, js, em) end
      if since == "moved" then
        -- a later job of the thread stored its turn after this run read
        -- the thread's memory: the run starts over from a new input
        log:info("the thread moved on since the job's checkpoint: starting the job over", {
          thread_id = j.thread_id, commits = thread_commits })
        tup, terr = retry(W, log, "deleting the job's checkpoint", deadline, function()
          local dok, d, e = pcall(W.saver.delete_thread, W.saver, thread)
          if not dok then return nil, d end
          if not d then return nil, e end
          return false
        end, true)
      end
      if tup then read_checkpoint = true end
    end
    if tup == nil then
      return release_run(W, log, em, "checkpointer: " .. first_line(terr))
    end
    if not tup and not built then
      local iok, b, ierr = pcall(build_input, script, j, env)
      if not iok then
        return dead(W, entry, "the script refused the job: " .. first_line(b), j.job_id, js, j)
      end
      if b == nil then return release(W, log, "input hook: " .. first_line(ierr)) end
      input, built = b, true
    end
    if failures == 0 then
      log:info(tup and "job resumed from its checkpoint" or "job started", {
        deliveries = entry.deliveries, script = script.name, thread_id = j.thread_id })
    end
    js.phase = "running"
    if tup and not (tup.checkpoint.next and tup.checkpoint.next[1]) then
      -- the run had ended before the last attempt stopped: its final state
      state, rerr = tup.checkpoint.values or {}, nil
    else
      -- the engine starts from the tuple just read instead of reading it again
      run_cfg.checkpoint_tuple = tup
      state, rerr = run_graph(W, js, script, tup and nil or input, run_cfg, em, log, entry.deliveries or 1,
        math.max(0, deadline - mg.now()))
    end
    if state or not errors.has(rerr, "checkpointer") then break end
    -- the checkpointer failed under the run
    failures = failures + 1
    local again = transient(rerr) or failures < _M.OTHER_ATTEMPTS
    if not again or W.stopping or mg.now() + delay > deadline then
      if transient(rerr) or W.stopping then
        return release_run(W, log, em, first_line(rerr))
      end
      break   -- stored as the job's failure, with the checkpointer's reason
    end
    log:warn("the run's checkpointer failed; resuming from the last checkpoint", {
      error = first_line(rerr), retry_in = delay, attempt = failures })
    mg.sleep(delay)
    delay = min(delay * 2, 2)
  end

  if not forced and js.preempted then forced = preempted_outcome(js.preempted) end
  if forced then
    state, rerr = nil, nil
    log:info("job stopped by its thread", { status = forced.status, reason = forced.error })
  end

  -- 4. store the result (and what the record hook writes) once
  local row = {
    job_id = j.job_id, thread_id = j.thread_id, user_id = j.user_id,
    worker = cfg.consumer, deliveries = entry.deliveries or 1,
  }
  local extra = {}
  if forced then
    row.status, row.error, row.state = forced.status, forced.error, {}
  elseif state then
    local xok, res = pcall(extract, script, state, j)
    if not xok then
      row.status, row.error, row.state = "failed", "the result hook failed: " .. first_line(res), {}
    else
      row.status = state.__interrupt__ ~= nil and "interrupted" or "done"
      row.answer, row.state, extra.event = res.answer, res.state, res.event
      -- (text PostgreSQL refuses would fail the insert on every attempt)
      -- (the state is walked for the culprit only when its JSON shows one)
      local text, serr = json.encode(row.state, { name = "state" })
      local why = job.unstorable(row.answer, "answer")
        or ((not text or not job.storable_json(text)) and job.unstorable(row.state, "state"))
        or job.unstorable(extra.event, "event")
      if why then text, serr = nil, why .. "; text must be UTF-8 without NUL" end
      if text then
        row.state_text = text
      else
        row.status, row.error, row.state = "failed", "the final state cannot be stored as JSON: " .. serr, {}
        row.answer, extra.event = nil, nil
      end
    end
  else
    row.status, row.error, row.state = "failed", first_line(rerr), {}
    extra.node = public_error.node(rerr)
  end
  local stored
  local record = hooks.record
  if forced and forced.no_record then record = nil end
  local fence = js.lease and { thread_id = j.thread_id, token = js.lease.token } or nil
  local fenced = false
  local record_failures = 0
  -- the job's checkpoints go with the result when they live in its database
  local saver = W.saver
  local cleanup = nil
  -- writes of a cancelled run still on their way land first (and count in
  -- `saved`)
  mg.checkpoint.settle(saver, thread)
  local in_db = checkpointer.in_results_db(cfg.checkpoint) and type(saver.delete_thread_in) == "function"
  if saved and in_db then
    cleanup = function(tx) return saver:delete_thread_in(tx, thread) end
  end
  js.phase = "storing"
  persist(log, "storing the result", function()
    local hook_err = nil
    local also = record and function(tx)
      local ok, r, err = pcall(record, tx, j, state, row, env)
      if ok and not (r == nil and err ~= nil) then return true end
      hook_err = first_line(ok and err or r)
      return nil, "the record hook failed: " .. hook_err
    end or nil
    local done, got = commit_result(W, row, also, fence, cleanup)
    if done then
      stored = got
      return true
    end
    if got == FENCED then
      fenced = true
      return true
    end
    if also and not hook_err and not transient(got) then
      -- a statement the hook sent (tx:send) failed with the commit
      hook_err = first_line(got)
    end
    if hook_err then
      record_failures = record_failures + 1
      if record_failures >= _M.RECORD_ATTEMPTS then
        log:error("the record hook keeps failing: storing the job as failed without it",
          { error = hook_err, attempts = record_failures })
        record = nil
        row.status, row.error = "failed", "the record hook failed: " .. hook_err
        extra.event = nil
      end
    end
    return nil, got
  end)
  js.phase = "finishing"
  if fenced then return overtaken(W, log, js, em) end

  -- 5. the Redis side
  if row.inserted then
    if hooks.committed then after_hook(log, "the committed hook", hooks.committed, j, state, stored, env) end
  elseif hooks.forget then
    after_hook(log, "the forget hook", hooks.forget, j, env)
  end
  release_thread(js)
  em:flush()
  em:close()
  local duration = mg.now() - t_start
  extra.duration_ms = ms(duration)
  if not row.inserted then extra.event = nil end
  persist(log, "final events", function()
    local r, err = finish_events(W, key, final_events(stored, extra))
    if r == nil then return nil, err end
    return true
  end)
  ack(W, log, entry, js)
  local outcome = OUTCOMES[stored.status] or "done"
  if row.inserted and forced and forced.status == "interrupted" then outcome = "preempted" end
  W.metrics:inc("jobs_" .. outcome)
  W.metrics:observe("job", outcome, duration)
  -- (a thread no write of the job reached holds nothing to delete)
  if saved and not in_db then
    pcall(saver.delete_thread, saver, thread)
  elseif saved and (read_checkpoint or not first) and type(saver.uncache) == "function" then
    -- a read (here or in an earlier attempt) may have copied it to the cache
    pcall(saver.uncache, saver, thread)
  end
  if outcome == "failed" then
    log:warn("job failed", { error = stored.error, duration_ms = extra.duration_ms })
  else
    log:info("job done", { status = stored.status, duration_ms = extra.duration_ms,
                           duplicate = not row.inserted or nil })
  end
  return outcome
end

return _M
