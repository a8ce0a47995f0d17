-- moongraph.worker.runner — one job, from delivery to acknowledgement.
--
--   outcome = runner.run(W, entry, js)
--     W: the worker (redis, db, queue, memory, scripts, saver, cfg, log,
--        metrics, llm); entry: {id, fields, deliveries}; js: the job's slot
--        record ({ id, task, phase }, shared with the lease renewer).
--   outcome: "done" | "failed" | "dead" | "duplicate" | "released"
--
-- The order of things is what makes a job run once:
--
--   1. decode; a bad job (or one with an unknown script, or delivered more
--      than max_deliveries times) goes to the dead-letter stream, its
--      listeners get error + done, and it is acknowledged;
--   2. a job that already has a row in job_results only finishes its events
--      and is acknowledged (a duplicate delivery, or a worker that died
--      after storing the result);
--   3. otherwise its run starts, or resumes from the checkpoints of thread
--      "job:<job_id>" when an earlier attempt left some (only unfinished
--      tasks run again); a new run gets the conversation memory as input;
--   4. the result, and for an answered turn the conversation memory, are
--      stored in one Postgres transaction (insert-once on job_id);
--   5. then the Redis side: recent-message cache, answer and done events
--      (written once), XACK + XDEL, and the job's checkpoints are deleted.
--
-- Infrastructure failures before step 4 (Postgres or the checkpointer
-- unreachable) leave the job pending for a later attempt ("released");
-- steps 4 and 5 retry until they succeed or the job is cancelled (drain,
-- lost lease), and a later attempt picks up from step 2.

local mg = require "moongraph"
local job = require "moongraph.worker.job"
local events = require "moongraph.worker.events"
local results = require "moongraph.worker.results"
local memory = require "moongraph.worker.memory"
local checkpointer = require "moongraph.worker.checkpointer"

local type, tostring, pairs, ipairs, pcall, setmetatable, error =
  type, tostring, pairs, ipairs, pcall, setmetatable, error
local floor, min = math.floor, math.min

local _M = {}

local function ms(sec) return floor(sec * 1e6 + 0.5) / 1000 end

local function first_line(e)
  return (tostring(e):gsub("\nstack traceback:.*$", ""))
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
    list[#list + 1] = { "answer", { answer = row.answer or "", thread_id = row.thread_id,
                                     intent = extra and extra.intent or nil } }
  elseif row.error then
    list[#list + 1] = { "error", { error = row.error, node = extra and extra.node or nil } }
  end
  list[#list + 1] = { "done", { status = row.status, job_id = row.job_id,
                                duration_ms = extra and extra.duration_ms or nil } }
  return list
end

local function finish_events(W, key, list)
  return events.finish(W.redis, key, list, { maxlen = W.cfg.events_maxlen, ttl = W.cfg.events_ttl })
end

local function ack(W, log, entry)
  persist(log, "XACK", function() return W.queue:ack(entry.id) end)
end

-- A job that cannot run: dead-letter it (with the reason), tell its
-- listeners when it has a usable job_id, acknowledge.
local function dead(W, entry, reason, job_id, js)
  local log = W.log:with { entry_id = entry.id, job_id = job_id }
  js.phase = "finishing"
  log:warn("job refused: dead-lettered", { reason = reason, deliveries = entry.deliveries })
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

-- The input of a new run: the script's own hook, or the default (see
-- moongraph.worker.scripts).
local function build_input(script, j, mem)
  local mod = script.module
  if type(mod.worker_input) == "function" then return mod.worker_input(j, mem) end
  local loc = j.user_location or mem.location
  local input
  if type(mod.input) == "function" then
    input = mod.input(j.message, { location = loc })
  else
    input = { message = j.message, user_location = loc }
  end
  if mem.intent ~= nil then input.intent = mem.intent end
  if mem.turn and mem.turn > 0 then input.turn = mem.turn end
  if mem.messages and #mem.messages > 0 then input.messages = mem.messages end
  if mem.summary ~= nil then input.summary = mem.summary end
  return input
end

local function extract(script, state)
  local mod = script.module
  if type(mod.worker_result) == "function" then return mod.worker_result(state) end
  local answer = state.answer
  if answer ~= nil and type(answer) ~= "string" then answer = tostring(answer) end
  local keep = {}
  for k, v in pairs(state) do
    if k ~= "messages" and k ~= "summary" then keep[k] = v end
  end
  return answer, keep
end

local function transient(err)
  local s = tostring(err)
  return s:find("^checkpointer ") ~= nil
end

-- Run the graph, streaming its events; returns state | nil, err.
local function run_graph(W, script, input, cfg, em, log, attempt)
  local starts = {}
  local last_state = nil
  local metrics = W.metrics
  local log_nodes = log:enabled("info")
  local function body()
    for ev in script.app:stream(input, cfg) do
      local mode = ev.mode
      if mode == "messages" then
        if type(ev.data) == "string" then
          em:push("token", { node = ev.node, text = ev.data })
        end
      elseif mode == "tasks" then
        local d = ev.data
        local k = (ev.ns or "") .. "|" .. tostring(d.id)
        if d.event == "start" then
          starts[k] = mg.now()
          em:push("node_start", { node = d.name, task_id = d.id, ns = ev.ns ~= "" and ev.ns or nil,
                                  attempt = attempt })
        else
          local t0 = starts[k]
          starts[k] = nil
          local dur = t0 and (mg.now() - t0) or 0
          metrics:observe("node", d.name, dur)
          local status = d.status
          local rec = { node = d.name, task_id = d.id, status = status, duration_ms = ms(dur),
                        ns = ev.ns ~= "" and ev.ns or nil, ran = d.ran }
          if d.error ~= nil then rec.error = first_line(d.error) end
          em:push("node_end", rec)
          if log_nodes then
            log:info("node finished", { node = d.name, task_id = d.id, status = status,
                                        duration_ms = rec.duration_ms, error = rec.error })
          end
        end
      elseif mode == "values" and (ev.ns == nil or ev.ns == "") then
        last_state = ev.data
      end
    end
    if last_state == nil then
      -- a resumed run that had nothing left to do emits no values
      local snap, serr = script.app:get_state { thread_id = cfg.thread_id }
      if not snap then error("checkpointer get failed: " .. tostring(serr), 0) end
      last_state = snap.values
    end
    return last_state
  end
  local ok, state, err = mg.timeout(W.cfg.job_timeout, function()
    local sok, s = pcall(body)
    if not sok then return nil, s end
    return s
  end)
  if not ok then
    if state == "timeout" then return nil, "the job timed out after " .. W.cfg.job_timeout .. " s" end
    return nil, state
  end
  if state == nil then return nil, err end
  return state
end

function _M.run(W, entry, js)
  local t_start = mg.now()
  local cfg = W.cfg
  local j, reason, jid = job.decode(entry.fields)
  if not j then return dead(W, entry, "bad job: " .. reason, jid, js) end
  local script = W.scripts:get(j.script)
  if not script then
    return dead(W, entry, "unknown script '" .. tostring(j.script) .. "'", j.job_id, js)
  end
  local log = W.log:with { job_id = j.job_id, entry_id = entry.id }
  local key = cfg.keys.events .. j.job_id

  -- 2. already answered?
  local existing, gerr = results.get(W.db, j.job_id)
  if gerr then return release(W, log, "postgres: " .. tostring(gerr)) end
  if existing then
    js.phase = "finishing"
    log:info("job already has a result: finishing it", { deliveries = entry.deliveries })
    persist(log, "memory cache", function() return W.memory:invalidate(j.thread_id) end)
    persist(log, "final events", function()
      local r, err = finish_events(W, key, final_events(existing))
      if r == nil then return nil, err end
      return true
    end)
    ack(W, log, entry)
    W.metrics:inc("jobs_duplicate")
    pcall(W.saver.delete_thread, W.saver, checkpointer.thread(j.job_id))
    return "duplicate"
  end
  if (entry.deliveries or 1) > cfg.max_deliveries then
    return dead(W, entry, ("delivered %d times without finishing (max %d)")
      :format(entry.deliveries, cfg.max_deliveries), j.job_id, js)
  end

  -- 3. start or resume the run
  local thread = checkpointer.thread(j.job_id)
  local gok, tup, terr = pcall(W.saver.get, W.saver, { thread_id = thread })
  if not gok or (tup == nil and terr) then
    return release(W, log, "checkpointer: " .. tostring(gok and terr or tup))
  end
  local mem, input = nil, nil
  if not tup then
    local merr
    mem, merr = W.memory:load(j.thread_id, j.user_id)
    if not mem then return release(W, log, "memory: " .. tostring(merr)) end
    local iok, built = pcall(build_input, script, j, mem)
    if not iok then
      return dead(W, entry, "the script refused the job: " .. first_line(built), j.job_id, js)
    end
    input = built
  end
  log:info(tup and "job resumed from its checkpoint" or "job started", {
    deliveries = entry.deliveries, script = script.name, thread_id = j.thread_id,
    memory = mem and mem.source or nil })

  local em = events.emitter(W.redis, key, { maxlen = cfg.events_maxlen, log = log, metrics = W.metrics })
  local guard <close> = setmetatable({}, { __close = function() em:abandon() end })
  local run_cfg = {
    thread_id = thread, modes = { "values", "tasks", "messages" }, llm = W.llm,
    durability = cfg.durability,
    job_id = j.job_id, conversation_id = j.thread_id, user_id = j.user_id,
  }
  js.phase = "running"
  local state, rerr
  if tup and not (tup.checkpoint.next and tup.checkpoint.next[1]) then
    -- the run had ended before the last attempt stopped: its final state
    state = tup.checkpoint.values or {}
  else
    state, rerr = run_graph(W, script, input, run_cfg, em, log, entry.deliveries or 1)
  end
  if not state and transient(rerr) then
    mg.timeout(1, em.flush, em)
    return release(W, log, first_line(rerr))
  end

  -- 4. store the result (and the turn) once
  local row = {
    job_id = j.job_id, thread_id = j.thread_id, user_id = j.user_id,
    worker = cfg.consumer, deliveries = entry.deliveries or 1,
  }
  local turn = nil
  local extra = {}
  if state then
    local xok, answer, keep = pcall(extract, script, state)
    if not xok then
      row.status, row.error, row.state = "failed", "worker_result failed: " .. first_line(answer), {}
    elseif state.__interrupt__ ~= nil then
      row.status, row.answer, row.state = "interrupted", answer, keep
    else
      row.status, row.answer, row.state = "done", answer, keep
      local prev_turn = mem and mem.turn or 0
      turn = {
        thread_id = j.thread_id, user_id = j.user_id, job_id = j.job_id,
        turn = math.tointeger(state.turn) or (prev_turn + 1),
        intent = type(state.intent) == "string" and state.intent or nil,
        location = type(state.user_location) == "string" and state.user_location or j.user_location,
        summary = type(state.summary) == "table" and state.summary or nil,
        message = j.message, answer = answer,
      }
      extra.intent = turn.intent
    end
  else
    row.status, row.error, row.state = "failed", first_line(rerr), {}
    extra.node = tostring(rerr):match("^node '([^']+)'")
  end
  local stored
  js.phase = "storing"
  persist(log, "storing the result", function()
    local ok, inserted, s = pcall(results.commit, W.db, row,
      turn and function(tx) return W.memory:record(tx, turn) end or nil)
    if not ok then return nil, inserted end
    if inserted == nil then return nil, s end
    stored = s
    row.inserted = inserted
    return true
  end)
  js.phase = "finishing"

  -- 5. the Redis side
  if row.inserted and turn and mem then
    local after = memory.after(mem, turn)
    persist(log, "memory cache", function() return W.memory:cache(j.thread_id, after) end)
  else
    persist(log, "memory cache", function() return W.memory:invalidate(j.thread_id) end)
  end
  em:flush()
  em:close()
  local duration = mg.now() - t_start
  extra.duration_ms = ms(duration)
  persist(log, "final events", function()
    local r, err = finish_events(W, key, final_events(stored, extra))
    if r == nil then return nil, err end
    return true
  end)
  ack(W, log, entry)
  pcall(W.saver.delete_thread, W.saver, thread)
  local outcome = stored.status == "failed" and "failed" or "done"
  W.metrics:inc(outcome == "failed" and "jobs_failed" or "jobs_done")
  W.metrics:observe("job", outcome, duration)
  if outcome == "failed" then
    log:warn("job failed", { error = stored.error, duration_ms = extra.duration_ms })
  else
    log:info("job done", { status = stored.status, duration_ms = extra.duration_ms,
                           duplicate = not row.inserted or nil })
  end
  return outcome
end

return _M
