-- The `chat` command: one turn of the Eco² chat pipeline from the terminal.
--
--   moongraph chat [--thread ID] [--location LOC] [--trace FILE] [--json]
--                  [--multitask-strategy enqueue|reject] MESSAGE
--
-- The answer streams to stdout as it is produced; the steps of the run
-- (which nodes ran, which of them in parallel, and how long each took) go to
-- stderr as each step finishes. Turns are checkpointed in files under
-- $MOONGRAPH_STATE_DIR (default ./.moongraph/threads), so a later call with
-- the same --thread continues the conversation: the previous intent feeds
-- the transition boost, the location and the history are kept. Without
-- --thread a new thread is started and its id printed.
--
-- One turn of a thread runs at a time: a turn started while another
-- process runs one on the same --thread waits for it (saying so on
-- stderr), or with --multitask-strategy reject is refused (exit 1). The
-- lock is a file lock under the state directory (moongraph.multitask.file),
-- released by the kernel if the process dies.
--
-- --json ends stdout with one line holding the final state: thread_id,
-- turn, intent, additional_intents, confidence, routing, nodes_run,
-- contexts (node -> its result, or {ok = false, error = ...}), errors,
-- answer, answer_source, quality, timings and more (the message history
-- itself is left out; history_messages counts it). When a fail_close node
-- ends the run, the user gets a plain message, the JSON line carries
-- `error` and `failed_node`, and the exit status is 1.
--
-- main(args, opts) -> exit status (0 done, 1 the run failed, 2 bad usage).
-- opts: stdout, stderr (file-like), llm (a moongraph.llm client or nil),
-- state_dir, clock (for the weather node), now (seconds, for thread ids).
local mg = require "moongraph"
local args = require "moongraph.args"
local llm_mod = require "moongraph.llm"
local ids = require "moongraph.ids"
local public_error = require "moongraph.public_error"
local text = require "moongraph.text"
local chat = require "scripts.eco.chat"
local json = require "moongraph.json"
local aggregator = require "nodes.aggregator"
local multitask = require "moongraph.multitask"

local type, ipairs, pairs, tostring, tonumber, pcall, setmetatable =
  type, ipairs, pairs, tostring, tonumber, pcall, setmetatable
local concat, sort, format = table.concat, table.sort, string.format

local _M = {}

_M.SPEC = {
  name = "chat",
  usage = "usage: chat [--thread ID] [--location LOCATION] [--trace FILE] [--json]\n" ..
          "            [--multitask-strategy enqueue|reject] MESSAGE",
  options = { thread = "string", location = "string", trace = "string", json = "flag",
              ["multitask-strategy"] = "string" },
  positional = { name = "message", label = "MESSAGE", required = true },
}

function _M.state_dir()
  local d = os.getenv("MOONGRAPH_STATE_DIR")
  if d and d ~= "" then return d end
  return ".moongraph/threads"
end

-- parse(argv) -> options | nil, message: the shared parser, then what a
-- turn needs (an id the file saver can use, UTF-8 text).
function _M.parse(argv)
  local o, err = args.parse(_M.SPEC, argv)
  if not o or o.help then return o, err end
  if o.thread then
    local ok, ierr = ids.check(o.thread, "--thread")
    if not ok then return nil, ierr end
  end
  local mts = o.multitask_strategy
  if mts ~= nil and mts ~= "enqueue" and mts ~= "reject" then
    return nil, "--multitask-strategy: enqueue (wait for the turn running on the thread) or reject expected" ..
      " (interrupt and rollback need `moongraph worker`)"
  end
  for _, name in ipairs { "message", "location" } do
    local v = o[name]
    local ok, at = true, nil
    if v then ok, at = text.check_utf8(v) end
    if not ok then
      return nil, format("%s is not valid UTF-8 (bad byte at position %d)",
        name == "message" and "MESSAGE" or "--location", at)
    end
  end
  return o
end

-- The trace file must be writable before the run spends anything on it.
local function check_trace_path(path)
  local f, err = io.open(path, "w")
  if not f then return nil, err end
  f:close()
  return true
end

-- lock_thread(dir, thread, strategy, errw) -> lease | nil, message: the
-- thread's turn lock under DIR/.locks, waiting for a turn running in
-- another process (enqueue) or refusing (reject).
function _M.lock_thread(dir, thread, strategy, errw)
  local locks = dir .. "/.locks"
  local ok, err = require("moongraph.core").store.mkdir(locks)
  if not ok then return nil, "cannot make the lock directory: " .. tostring(err) end
  local coord = multitask.file(locks)
  local lease, lerr = coord:acquire(thread, {
    strategy = strategy or "enqueue",
    on_wait = function()
      errw:write(format("· thread %s is busy: another chat turn is running on it; waiting for it to end\n", thread))
      if errw.flush then errw:flush() end
    end,
  })
  if lease then return lease end
  if lerr == "busy" then
    return nil, format("thread %s is busy: another chat turn is running on it (--multitask-strategy reject)", thread)
  end
  return nil, "cannot lock thread " .. thread .. ": " .. tostring(lerr)
end

local function new_thread_id(now)
  local t = now or os.time()
  return format("t%s-%04x", os.date("%Y%m%d-%H%M%S", math.floor(t)), math.random(0, 0xffff))
end

local function fmt_ms(x)
  if x >= 100 then return format("%.0f ms", x) end
  if x >= 10 then return format("%.1f ms", x) end
  return format("%.2f ms", x)
end

-- A short description of what a node produced, from the state after its step.
local function outcome(ev, state)
  if ev.status == "error" then return "failed: " .. tostring(ev.error) end
  if ev.status == "cancelled" then return "cancelled (timeout)" end
  local node = ev.node
  local c = type(state.contexts) == "table" and state.contexts[node]
  local extra = ev.fallback_of and (" (fallback of " .. ev.fallback_of .. ")") or ""
  if ev.chain_of then extra = " (fallback chain for " .. ev.chain_of .. ")" end
  if type(c) == "table" then
    if c.ok then
      local src = c.source ~= "sample" and c.source or nil
      return "ok" .. (c.sample and ", sample data" or "") .. (src and (", " .. src) or "") .. extra
    elseif c.unavailable then
      return "unavailable" .. extra
    elseif c.error then
      return "failed: " .. tostring(c.error) .. extra
    end
  end
  if node == "intent" then
    local s = tostring(state.intent)
    if type(state.additional_intents) == "table" and #state.additional_intents > 0 then
      s = s .. " + " .. concat(state.additional_intents, " + ")
    end
    return format("%s (%s, confidence %.2f%s)", s, tostring(state.intent_source),
      tonumber(state.confidence) or 0,
      state.prev_intent and ((state.transition_boost or 0) > 0
        and format(", boost +%.2f from %s", state.transition_boost, state.prev_intent)
        or ", previous " .. state.prev_intent) or "")
  elseif node == "aggregator" and type(state.aggregate) == "table" then
    local a = state.aggregate
    return format("arrived %s; missing %s; next %s",
      #a.collected > 0 and concat(a.collected, ", ") or "none",
      #a.missing > 0 and (function()
        local l = {}
        for i, m in ipairs(a.missing) do
          l[i] = m.node .. " (" .. m.status .. (m.reason and (": " .. tostring(m.reason)) or "") .. ")"
        end
        return concat(l, ", ")
      end)() or "none", a.next)
  elseif node == "answer" then
    return tostring(state.answer_source) .. (state.answer_error and (" (" .. tostring(state.answer_error) .. ")") or "")
  elseif node == "feedback" and type(state.quality) == "table" then
    local q = state.quality
    local function f(x) return x and format("%.2f", x) or "-" end
    return format("overall %s (faithfulness %s, groundedness %s, context %s, answer %s; %s)",
      f(q.overall), f(q.faithfulness), f(q.groundedness), f(q.context_relevance),
      f(q.answer_relevance), tostring(q.method))
  elseif node == "summarize" then
    local s = format("%s tokens in context", tostring(state.context_tokens))
    if type(state.summary) == "table" and state.summary.compressed_at == state.turn then
      s = s .. format(", compressed from %s", tostring(state.summary.tokens_before))
    end
    return s
  end
  return "ok" .. extra
end

-- The entries of one finished task for the step lines: each node of its
-- fallback chain that failed, then the node that produced the result, with
-- their times (from the engine's task record) and how they ended.
local function task_entries(d, start)
  local t0 = start and start.t0 or mg.now()
  local input = start and start.input
  local chain_of = type(input) == "table" and input.chain_of or nil
  local entries, prev = {}, nil
  for _, c in ipairs(d.chain or {}) do
    local t1 = t0 + (c.duration or 0)
    entries[#entries + 1] = { node = c.node, t0 = t0, t1 = t1, status = "error", error = c.error,
                              fallback_of = prev, chain_of = chain_of }
    prev, t0 = c.node, t1
  end
  local t1 = (start and start.t0 or t0) + (d.duration or 0)
  local status = d.status == "done" and not d.failed and "ok" or d.status == "interrupt" and "interrupt" or "error"
  entries[#entries + 1] = { node = d.ran or d.name, t0 = t0, t1 = t1 >= t0 and t1 or t0, status = status,
                            error = d.error, fallback_of = prev, chain_of = chain_of }
  return entries
end

-- Lines describing one finished step. A node that stood in for a failed
-- one (its fallback) ran in the same task and is shown under it.
local function step_lines(step, evs, state)
  sort(evs, function(a, b) return a.t0 < b.t0 end)
  local tasks, under = {}, {}
  for _, e in ipairs(evs) do
    if e.fallback_of then
      under[e.fallback_of] = under[e.fallback_of] or {}
      local l = under[e.fallback_of]
      l[#l + 1] = e
    else
      tasks[#tasks + 1] = e
    end
  end
  local function dur(e) return fmt_ms((e.t1 - e.t0) * 1000) end
  local lines = {}
  local function add_chain(node, indent)
    for _, f in ipairs(under[node] or {}) do
      lines[#lines + 1] = format("%s↳ %-15s %9s  %s", indent, f.node, dur(f), outcome(f, state))
      add_chain(f.node, indent .. "  ")
    end
  end
  if #tasks == 1 then
    local e = tasks[1]
    lines[1] = format("· step %d  %-17s %9s  %s", step, e.node, dur(e), outcome(e, state))
    add_chain(e.node, "          ")
    return lines
  end
  local t0, t1, sum = math.huge, -math.huge, 0
  for _, e in ipairs(evs) do
    if e.t0 < t0 then t0 = e.t0 end
    if e.t1 > t1 then t1 = e.t1 end
    sum = sum + (e.t1 - e.t0)
  end
  local names = {}
  for i, e in ipairs(tasks) do names[i] = e.node end
  lines[1] = format("· step %d  %d nodes in parallel: %s — step %s, sum of nodes %s",
    step, #tasks, concat(names, " ∥ "), fmt_ms((t1 - t0) * 1000), fmt_ms(sum * 1000))
  for _, e in ipairs(tasks) do
    lines[#lines + 1] = format("    ∥ %-17s %9s  %s", e.node, dur(e), outcome(e, state))
    add_chain(e.node, "        ")
  end
  return lines
end

local function copy_list(v)
  local out = json.array()
  if type(v) == "table" then for i, x in ipairs(v) do out[i] = x end end
  return out
end

-- The --json object of a final state.
function _M.json_state(state, extra)
  local o = {}
  for k, v in pairs(state) do
    if k ~= "messages" and k ~= "summary" then o[k] = v end
  end
  o.additional_intents = copy_list(state.additional_intents)
  o.nodes_run = copy_list(state.nodes_run)
  o.errors = copy_list(state.errors)
  o.routing = copy_list(state.routing)
  o.contexts = type(state.contexts) == "table" and state.contexts or {}
  if o.prev_intent == false then o.prev_intent = nil end
  if type(state.aggregate) == "table" then
    local a = {}
    for k, v in pairs(state.aggregate) do a[k] = v end
    a.collected, a.missing, a.samples = copy_list(a.collected), copy_list(a.missing), copy_list(a.samples)
    o.aggregate = a
  end
  o.history_messages = type(state.messages) == "table" and #state.messages or 0
  if type(state.summary) == "table" then
    local s = state.summary
    o.summary = { turns = s.turns, compressed_at = s.compressed_at, tiers = s.tiers,
                  tokens_before = s.tokens_before, tokens_after = s.tokens_after }
  end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- What the user reads when a fail_close node ends the run.
function _M.failure_message(err)
  local node = public_error.node(err)
  local what = node and aggregator.describe(node) or "파이프라인"
  return node, format("죄송합니다. %s 서비스에 문제가 있어 답변을 완성하지 못했어요. 잠시 후 다시 시도해 주세요.", what)
end

function _M.main(argv, opts)
  opts = opts or {}
  local out, errw = opts.stdout or io.stdout, opts.stderr or io.stderr
  local o, perr = _M.parse(argv)
  if not o then return args.usage_error(_M.SPEC, perr, errw) end
  if o.help then return args.help(_M.SPEC, out) end
  if o.trace then
    local ok, terr = check_trace_path(o.trace)
    if not ok then
      errw:write("chat: cannot write the trace file: ", tostring(terr), "\n")
      return 2
    end
  end
  local dir = opts.state_dir or _M.state_dir()
  local saver = mg.checkpoint.file(dir)
  local app = chat.build { checkpointer = saver }
  local thread = o.thread
  local new_thread = thread == nil
  if new_thread then thread = new_thread_id(opts.now) end
  -- one turn of a thread at a time, across processes
  local lease
  local release_guard <close> = setmetatable({}, { __close = function()
    if lease then lease:release() end
  end })
  if not new_thread then
    local lerr
    lease, lerr = _M.lock_thread(dir, thread, o.multitask_strategy, errw)
    if not lease then
      errw:write("moongraph chat: ", lerr, "\n")
      return 1
    end
  end
  local prev_intent, prev_turn
  if not new_thread then prev_intent, prev_turn = chat.previous_intent(app, thread) end
  local llm = opts.llm
  if llm == nil then
    local lerr
    llm, lerr = llm_mod.from_env()
    if lerr then errw:write("moongraph chat: no LLM: ", lerr, "; answering offline\n") end
  end
  errw:write(format("· moongraph chat · thread %s · turn %d%s · %s\n", thread, (prev_turn or 0) + 1,
    prev_intent and (" (previous intent " .. prev_intent .. ")") or "",
    llm and "LLM configured" or "offline: no LLM configured (offline classifier, extractive answer)"))

  local cfg = chat.config { thread_id = thread, llm = llm, trace = o.trace, clock = opts.clock,
                            stream_mode = { "values", "messages", "tasks" } }
  local input = chat.input(o.message, { location = o.location })
  local t_start = mg.now()
  local pending, started = {}, {}
  local state = {}
  local answer_open, answer_tail = false, ""
  local timings = json.array()
  local first_step = nil
  -- the first failed write to stdout (a full disk, a closed pipe): the
  -- answer did not reach the caller, so the command fails
  local out_err = nil
  local function flush_out()
    local fok, ferr = out:flush()
    if not fok then out_err = out_err or ferr end
  end

  local function flush_steps(upto)
    local steps = {}
    for s in pairs(pending) do if s <= upto then steps[#steps + 1] = s end end
    sort(steps)
    for _, s in ipairs(steps) do
      if answer_open then
        if answer_tail ~= "\n" then out:write("\n") end
        out:write("\n")
        flush_out()
        answer_open = false
      end
      first_step = first_step or s
      local rel = s - first_step + 1
      for _, l in ipairs(step_lines(rel, pending[s], state)) do errw:write(l, "\n") end
      for _, e in ipairs(pending[s]) do
        timings[#timings + 1] = { node = e.node, step = rel, ms = math.floor((e.t1 - e.t0) * 1e6 + 0.5) / 1000,
                                  status = e.status, fallback_of = e.fallback_of }
      end
      pending[s] = nil
    end
    if errw.flush then errw:flush() end
  end

  local ok, err = pcall(function()
    for ev in app:stream(input, cfg) do
      local mode = ev.mode
      if mode == "messages" and ev.node == "answer" then
        if not answer_open then
          answer_open = true
          out:write("\n")
        end
        out:write(ev.data)
        answer_tail = ev.data:sub(-1)
        flush_out()
      elseif mode == "tasks" and (ev.ns == nil or ev.ns == "") then
        local d = ev.data
        if d.event == "start" then
          started[d.id] = { t0 = d.time or mg.now(), input = d.input }
        else
          local s = ev.step + 1
          pending[s] = pending[s] or {}
          for _, e in ipairs(task_entries(d, started[d.id])) do
            local l = pending[s]
            l[#l + 1] = e
          end
          started[d.id] = nil
        end
      elseif mode == "values" then
        state = ev.data
        flush_steps(ev.step)
      end
    end
  end)
  local elapsed = (mg.now() - t_start) * 1000
  flush_steps(math.huge)

  -- the answer is only delivered when stdout took it
  local function finish(code)
    flush_out()
    if out_err then
      errw:write("moongraph chat: cannot write the answer to standard output: ", tostring(out_err), "\n")
      return 1
    end
    return code
  end

  if not ok then
    local e = text.error_message(err)
    if e:find("^trace: ") then
      -- the turn finished and was saved; only its trace file failed
      errw:write("moongraph chat: ", e, "\n")
      if o.json then
        out:write(json.encode_output(_M.json_state(state, { thread_id = thread, error = e,
          timings = timings, elapsed_ms = elapsed })), "\n")
      end
      finish(1)
      return 1
    end
    local node, msg = _M.failure_message(err)
    out:write(msg, "\n")
    errw:write("moongraph chat: the run ended: ", e, "\n")
    if o.json then
      out:write(json.encode_output(_M.json_state(state, {
        thread_id = thread, error = e,
        failed_node = node, message = msg, timings = timings, elapsed_ms = elapsed,
      })), "\n")
    end
    finish(1)
    return 1
  end
  errw:write(format("· done in %s · thread %s%s\n", fmt_ms(elapsed), thread,
    new_thread and (" · continue with: moongraph chat --thread " .. thread .. " \"...\"") or ""))
  if o.trace then errw:write("· Chrome trace written to ", o.trace, " (open in ui.perfetto.dev)\n") end
  if o.json then
    out:write(json.encode_output(_M.json_state(state, { thread_id = thread, timings = timings,
      elapsed_ms = math.floor(elapsed * 1000 + 0.5) / 1000 })), "\n")
  end
  return finish(0)
end

return _M
