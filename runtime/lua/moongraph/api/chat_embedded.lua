--[[
moongraph.api.chat_embedded — the embedded backend of the Chat API: a
script's graph run in this process for each message, conversations and
job event logs in durable local files.

  local embedded = require "moongraph.api.chat_embedded"
  local b = assert(embedded.new{
    data = ".moongraph",                                   -- data directory
    scripts = { {name = "chat", path = "chat.lua"}, ... },
    llm = client,                  -- the run's config.llm (nil: offline)
    concurrency = 64,              -- runs at once
    job_timeout = 600,             -- seconds a run may take
  })
  local job, status, msg = b:submit(user, { message =, conversation_id =, context =, script = })
  local log = b:events(user, job_id)          -- moongraph.api.joblog log | nil, 404, msg
  b:conversations(user, { limit =, offset = })   b:conversation(user, id)   b:delete(user, id)

Layout under <data>/chat:

  jobs/<job_id>.json            a job: conversation, user, script, input, status
  events/<job_id>.log           its events (moongraph.api.joblog), ids 1, 2, ...
  conversations/<id>.json       a conversation: owner, title, messages
  checkpoints/                  the conversations' checkpoints (checkpoint.file),
                                thread id = conversation id: the graph's state
                                between turns is the conversation's memory

A message is accepted once its job and the conversation holding it are
written (atomic replace + fsync): submit returns only then. The messages
of one conversation run one after the other, in the order they came; a
process that stops mid-run picks its unfinished jobs up at the next start
(from the conversation's last checkpoint when the run had begun, so only
unfinished steps run again) and appends to the same event logs.

A job's outcome is stored before its stream says so: the answer (or the
failure) goes into the conversation, then the job's record, then the
`answer`/`error` and `done` events into its log. A write that fails (a
full disk) is tried again, every STORE_RETRY seconds at most, until it
goes through, while the conversation's later messages wait their turn;
a job whose record is final but whose log has no `done` (the process
stopped in between) gets its last events at the next start.

Events (the worker's, docs/worker.md): node_start, node_end, token,
answer, error, done; every job ends with exactly one done. A job belongs
to the user who sent it and a conversation to the user who started it:
anyone else is answered as for an id that does not exist.
]]

local mg = require "moongraph"
local json = require "moongraph.json"
local chat = require "moongraph.api.chat"
local ids = require "moongraph.ids"
local joblog = require "moongraph.api.joblog"
local scripts = require "moongraph.worker.scripts"
local job_ids = require "moongraph.worker.job"
local text = require "moongraph.text"
local public_error = require "moongraph.public_error"
local store = require("moongraph.core").store
local cjson = json.wire()

local type, tostring, tonumber, pairs, ipairs, setmetatable, pcall, error =
  type, tostring, tonumber, pairs, ipairs, setmetatable, pcall, error
local string_format, math_floor, table_sort, table_remove =
  string.format, math.floor, table.sort, table.remove
local error_message = text.error_message

local _M = {}
local B = {}
B.__index = B

_M.CONCURRENCY = 64
_M.JOB_TIMEOUT = 600
_M.STORE_RETRY = 30       -- seconds between tries of a write that fails, at most

---------------------------------------------------------------- helpers

local wall_base, mono_base
local function wall()
  if not wall_base then wall_base, mono_base = os.time(), mg.now() end
  return wall_base + (mg.now() - mono_base)
end

local function iso(t)
  local s = math_floor(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", s) .. string_format(".%03dZ", math_floor((t - s) * 1000))
end

local function ms(sec) return math_floor(sec * 1e6 + 0.5) / 1000 end

local function read_json(path)
  local body, err, code = store.read(path)
  if not body then return nil, err, code end
  local v, derr = cjson.decode(body)
  if v == nil then return nil, path .. ": " .. tostring(derr) end
  return v
end

local function write_json(path, v)
  local body, err = json.encode(v, { name = "record", valid_utf8 = true })
  if not body then return nil, err end
  return store.write(path, body)
end

local function report(what, err)
  io.stderr:write("moongraph serve: ", what, ": ", error_message(err), "\n")
  io.stderr:flush()
end

-- Do fn() -> ok | nil, err until it succeeds: a store that fails now (a
-- full disk) is tried again after 0.5, 1, 2 ... STORE_RETRY seconds.
-- Stops early (false) when gone() says the work is moot.
local function until_stored(what, fn, gone)
  local wait = 0.5
  while true do
    local ok, err = fn()
    if ok then return true end
    report(what .. " (trying again in " .. wait .. " s)", err)
    mg.sleep(wait)
    if gone and gone() then return false end
    wait = math.min(wait * 2, _M.STORE_RETRY)
  end
end

local title_of = chat.title

-- A mutex per name (mg.queue holding one token).
local function lock(self, name)
  local q = self.locks[name]
  if not q then
    q = mg.queue()
    q:put(true)
    self.locks[name] = q
  end
  q:get()
  return setmetatable({}, { __close = function() q:put(true) end })
end

---------------------------------------------------------------- start-up

function _M.new(opts)
  if type(opts) ~= "table" then error("bad argument #1 to 'new': options table expected", 2) end
  if type(opts.data) ~= "string" or opts.data == "" then
    error("bad argument #1 to 'new': data (a directory) expected", 2)
  end
  if type(opts.scripts) ~= "table" or #opts.scripts == 0 then
    error("bad argument #1 to 'new': scripts (a list of {name, path}) expected", 2)
  end
  local root = opts.data .. "/chat"
  for _, d in ipairs { "jobs", "events", "conversations", "checkpoints" } do
    local ok, err = store.mkdir(root .. "/" .. d)
    if not ok then return nil, "cannot create " .. root .. "/" .. d .. ": " .. tostring(err) end
  end
  local saver = mg.checkpoint.file(root .. "/checkpoints")
  local reg = scripts.new(opts.scripts, saver)
  local ok, err = reg:load()
  if not ok then return nil, err end
  local logs, lerr = joblog.open(root .. "/events")
  if not logs then return nil, lerr end
  local n = opts.concurrency or _M.CONCURRENCY
  local slots = mg.queue()
  for _ = 1, n do slots:put(true) end
  local self = setmetatable({
    root = root, saver = saver, scripts = reg, logs = logs, llm = opts.llm,
    job_timeout = opts.job_timeout or _M.JOB_TIMEOUT,
    slots = slots, convs = {}, jobs = {}, pending = {}, running = {}, locks = {},
  }, B)
  ok, err = self:_load()
  if not ok then return nil, err end
  return self
end

function B:_path(kind, id)
  return self.root .. "/" .. kind .. "/" .. id .. ".json"
end

-- The answer/error and done events of a job whose record is final, when
-- its log lacks them (the process stopped between the two writes).
function B:_finish_log(j)
  local log, err = self.logs:get(j.job_id)
  if err then return nil, err end
  if not log or log.finished then return true end
  local c = self.convs[j.conversation_id]
  local msg
  for _, m in ipairs(c and c.messages or {}) do
    if m.job_id == j.job_id and m.role == "assistant" then msg = m end
  end
  if j.status == "failed" then
    log, err = self.logs:create(j.job_id)
    if not log then return nil, err end
    local ok, aerr = log:append("error", { error = msg and msg.error or "the run failed" })
    if not ok then return nil, aerr end
  elseif msg then
    log, err = self.logs:create(j.job_id)
    if not log then return nil, err end
    local ok, aerr = log:append("answer", { answer = type(msg.content) == "string" and msg.content or "",
      conversation_id = j.conversation_id })
    if not ok then return nil, aerr end
  end
  local ok, derr = log:append("done", { status = j.status, job_id = j.job_id, conversation_id = j.conversation_id })
  if not ok then return nil, derr end
  return true
end

-- Read the conversations and jobs; queue the jobs that have not finished.
function B:_load()
  for _, name in ipairs(store.list(self.root .. "/conversations") or {}) do
    local id = name:match("^(.+)%.json$")
    if id then
      local c, err = read_json(self:_path("conversations", id))
      if not c then return nil, "conversation " .. id .. ": " .. tostring(err) end
      for _, msg in ipairs(c.messages or {}) do
        -- (messages stored by earlier versions name their location at the top)
        if msg.user_location ~= nil and msg.context == nil then
          msg.context, msg.user_location = { user_location = msg.user_location }, nil
        end
      end
      self.convs[id] = c
    end
  end
  local unfinished = {}
  for _, name in ipairs(store.list(self.root .. "/jobs") or {}) do
    local id = name:match("^(.+)%.json$")
    if id then
      local j, err = read_json(self:_path("jobs", id))
      if not j then return nil, "job " .. id .. ": " .. tostring(err) end
      self.jobs[id] = j
      if j.status == "queued" then
        unfinished[#unfinished + 1] = j
      else
        local ok, ferr = self:_finish_log(j)
        if not ok then return nil, "job " .. id .. ": " .. tostring(ferr) end
      end
    end
  end
  table_sort(unfinished, function(a, b)
    if a.ts ~= b.ts then return a.ts < b.ts end
    return a.job_id < b.job_id
  end)
  for _, j in ipairs(unfinished) do
    local c = self.convs[j.conversation_id]
    if c and not c.deleted then
      self:_enqueue(j)
    else
      self.jobs[j.job_id] = nil
      store.remove(self:_path("jobs", j.job_id))
    end
  end
  return true
end

---------------------------------------------------------------- running

local function final_state(self, thread)
  local ok, saved = pcall(self.saver.get, self.saver, { thread_id = thread })
  if not ok or type(saved) ~= "table" then return nil end
  return saved.checkpoint
end

-- Run the graph, appending its events; -> state | nil, err
local function run_graph(self, script, j, log)
  local cfg = {
    thread_id = j.conversation_id, modes = { "values", "tasks", "messages" }, llm = self.llm,
    job_id = j.job_id, conversation_id = j.conversation_id, user_id = j.user,
  }
  local input = j.input
  if log.last > 0 then
    -- this job's run had begun before a restart: continue it from its checkpoint
    local cp = final_state(self, j.conversation_id)
    if cp and not (cp.next and cp.next[1]) then return cp.values or {} end
    if cp then input = nil end
  end
  local last_state
  local attempt = (j.attempt or 0) + 1
  if log.last > 0 then
    -- a run began before the restart (the first one's count is never
    -- written): the events of this one say so, so a client can tell its
    -- tokens from the ones the stopped run had sent
    attempt = math.max(attempt, 2)
    j.attempt = attempt
    local ok, werr = write_json(self:_path("jobs", j.job_id), j)
    if not ok then report("job " .. j.job_id, werr) end
  end
  j.attempt = attempt
  local function body()
    for ev in script.app:stream(input, cfg) do
      local mode = ev.mode
      if mode == "messages" then
        if type(ev.data) == "string" then log:append("token", { node = ev.node, text = ev.data }) end
      elseif mode == "tasks" then
        local d = ev.data
        local ns = ev.ns ~= "" and ev.ns or nil
        if d.event == "start" then
          log:append("node_start", { node = d.name, task_id = d.id, ns = ns, attempt = attempt })
        else
          local rec = { node = d.name, task_id = d.id, status = d.status, ns = ns, ran = d.ran,
                        duration_ms = ms(d.duration or 0) }
          if d.error ~= nil then rec.error = error_message(d.error) end
          log:append("node_end", rec)
        end
      elseif mode == "values" and (ev.ns == nil or ev.ns == "") then
        last_state = ev.data
      end
    end
    if last_state == nil then
      local cp = final_state(self, j.conversation_id)
      last_state = cp and cp.values or {}
    end
    return last_state
  end
  local ok, state, err = mg.timeout(self.job_timeout, function()
    local sok, s = pcall(body)
    if not sok then return nil, s end
    return s
  end)
  if not ok then
    if state == "timeout" then return nil, "the run timed out after " .. self.job_timeout .. " s" end
    return nil, state
  end
  if state == nil then return nil, err end
  return state
end

-- What the script's result hook (a pure function of the state) makes of it.
local function extract(script, state, j)
  local hook = script.hooks.result
  if not hook then
    local a = state.answer
    return { answer = type(a) == "string" and a or nil }
  end
  local ok, r = pcall(hook, state, { job_id = j.job_id, thread_id = j.conversation_id,
                                     user_id = j.user, script = j.script, input = j.input })
  if not ok then return nil, "the result hook failed: " .. error_message(r) end
  if type(r) ~= "table" then return nil, "the result hook must return a table" end
  local a = r.answer
  if a ~= nil and type(a) ~= "string" then a = tostring(a) end
  return { answer = a, event = type(r.event) == "table" and r.event or nil }
end

-- The outcome of a job whose log has its done already although its record
-- is not final (what an earlier version left after a write had failed):
-- read back from the log's last events.
local function outcome_of_log(log)
  local out = { status = "failed", error = "the run's outcome was lost" }
  for _, e in ipairs(log:after(0)) do
    local d = cjson.decode(e.data)
    if type(d) == "table" then
      if e.type == "answer" then
        out = { status = "done", answer = type(d.answer) == "string" and d.answer or nil }
      elseif e.type == "error" then
        out = { status = "failed", error = tostring(d.error) }
      elseif e.type == "done" and type(d.status) == "string" and out.status ~= "failed" then
        out.status = d.status
      end
    end
  end
  return out
end

-- Run the job's graph -> {status, answer, extra, node, error (the detail)}
function B:_outcome(j, log)
  local script = self.scripts:get(j.script)
  local state, err
  if not script then
    err = "unknown script '" .. tostring(j.script) .. "'"
  else
    state, err = run_graph(self, script, j, log)
  end
  if state then
    local r, xerr = extract(script, state, j)
    if r then
      return { status = state.__interrupt__ ~= nil and "interrupted" or "done", answer = r.answer, extra = r.event }
    end
    err = xerr
  end
  return { status = "failed", error = error_message(err), node = public_error.node(err) }
end

function B:_run(j)
  local t0 = mg.now()
  local log, lerr = self.logs:create(j.job_id)
  if not log then
    report("job " .. j.job_id, lerr)
    return
  end
  local o
  if log.finished then
    o = outcome_of_log(log)
  else
    o = self:_outcome(j, log)
  end
  local conv = self.convs[j.conversation_id]
  if not conv or conv.deleted then return end
  local status, answer, extra, node = o.status, o.answer, o.extra, o.node
  -- what the client is told of a failure: never the error itself (paths,
  -- upstream addresses); that goes to the server's log under the job id
  local public
  if status == "failed" then
    report("job " .. j.job_id .. " failed", o.error)
    public = public_error.message(o.error, "job " .. j.job_id)
  end
  local now = wall()
  local msg = { role = "assistant", content = answer or json.null, job_id = j.job_id, status = status,
                error = public, created_at = iso(now) }
  for k, v in pairs(extra or {}) do if msg[k] == nil then msg[k] = v end end
  local function gone() return conv.deleted end
  -- the outcome is stored before anyone is told: conversation, job, log.
  -- The conversation takes the answer once it is on disk (a message
  -- submitted meanwhile is kept: each try starts from what it holds then).
  if not until_stored("conversation " .. conv.id, function()
    local guard <close> = lock(self, j.conversation_id)
    if conv.deleted then return true end
    for _, m in ipairs(conv.messages) do
      if m.job_id == j.job_id and m.role == "assistant" then return true end
    end
    local saved = {}
    for k, v in pairs(conv) do saved[k] = v end
    saved.messages = json.array()
    for i, m in ipairs(conv.messages) do saved.messages[i] = m end
    saved.messages[#saved.messages + 1] = msg
    saved.updated_at, saved.ts = iso(now), now
    local ok, err = write_json(self:_path("conversations", conv.id), saved)
    if not ok then return nil, err end
    conv.messages, conv.updated_at, conv.ts = saved.messages, saved.updated_at, saved.ts
    return true
  end, gone) or conv.deleted then return end
  j.status, j.finished_at = status, iso(now)
  if not until_stored("job " .. j.job_id, function()
    return write_json(self:_path("jobs", j.job_id), j)
  end, gone) then return end
  if log.finished then return end
  local last
  if status == "failed" then
    last = { "error", { error = public, node = node } }
  else
    local data = {}
    for k, v in pairs(extra or {}) do data[k] = v end
    data.answer, data.conversation_id = answer or "", j.conversation_id
    last = { "answer", data }
  end
  local done = { status = status, job_id = j.job_id, conversation_id = j.conversation_id,
                 duration_ms = ms(mg.now() - t0) }
  if not until_stored("events of job " .. j.job_id, function() return log:append(last[1], last[2]) end, gone) then
    return
  end
  until_stored("events of job " .. j.job_id, function() return log:append("done", done) end, gone)
end

-- The jobs of one conversation run one after the other.
function B:_drain(conv_id)
  local list = self.pending[conv_id]
  while list and #list > 0 do
    local j = table_remove(list, 1)
    self.slots:get()
    local guard <close> = setmetatable({}, { __close = function() self.slots:put(true) end })
    local ok, err = pcall(self._run, self, j)
    if not ok then io.stderr:write("moongraph serve: job ", j.job_id, ": ", error_message(err), "\n") end
    list = self.pending[conv_id]
  end
  self.pending[conv_id] = nil
  self.running[conv_id] = nil
end

function B:_enqueue(j)
  local list = self.pending[j.conversation_id]
  if not list then
    list = {}
    self.pending[j.conversation_id] = list
  end
  list[#list + 1] = j
  if not self.running[j.conversation_id] then
    self.running[j.conversation_id] = mg.spawn(self._drain, self, j.conversation_id)
  end
end

---------------------------------------------------------------- the API

-- submit(user, m) -> job | nil, status, message
-- m: message (string), conversation_id?, context? (an object), script?
function B:submit(user, m)
  local script = self.scripts:get(m.script)
  if not script then return nil, 404, "unknown script '" .. tostring(m.script) .. "'" end
  local now = wall()
  local conv
  if m.conversation_id then
    conv = self.convs[m.conversation_id]
    if not conv or conv.deleted or conv.user ~= user then
      return nil, 404, "conversation '" .. m.conversation_id .. "' not found"
    end
  else
    conv = { id = job_ids.new_id("c"), user = user, title = title_of(m.message),
             created_at = iso(now), ts = now, messages = json.array() }
  end
  local input = { message = m.message, context = m.context }
  local j = { job_id = job_ids.new_id("j"), conversation_id = conv.id, user = user,
              script = script.name, input = input, status = "queued", created_at = iso(now), ts = now }
  local guard <close> = lock(self, conv.id)
  if conv.deleted then return nil, 404, "conversation '" .. conv.id .. "' not found" end
  local ok, err = write_json(self:_path("jobs", j.job_id), j)
  if not ok then return nil, 503, "the message could not be stored: " .. tostring(err) end
  local n = #conv.messages
  conv.messages[n + 1] = { role = "user", content = m.message, job_id = j.job_id, created_at = iso(now),
                           context = m.context }
  local before_u, before_ts = conv.updated_at, conv.ts
  conv.updated_at, conv.ts = iso(now), now
  ok, err = write_json(self:_path("conversations", conv.id), conv)
  if not ok then
    conv.messages[n + 1] = nil
    conv.updated_at, conv.ts = before_u, before_ts
    store.remove(self:_path("jobs", j.job_id))
    return nil, 503, "the message could not be stored: " .. tostring(err)
  end
  self.convs[conv.id] = conv
  self.jobs[j.job_id] = j
  local log, lerr = self.logs:create(j.job_id)
  if not log then return nil, 503, tostring(lerr) end
  self:_enqueue(j)
  return { job_id = j.job_id, conversation_id = conv.id, status = "queued" }
end

function B:job(user, job_id)
  local j = ids.valid(job_id) and self.jobs[job_id]
  if not j or j.user ~= user then return nil, 404, "job '" .. tostring(job_id) .. "' not found" end
  return j
end

-- events(user, job_id) -> log | nil, status, message
function B:events(user, job_id)
  local j, st, msg = self:job(user, job_id)
  if not j then return nil, st, msg end
  local log, err = self.logs:get(job_id)
  if not log then
    if err then return nil, 503, err end
    return nil, 404, "job '" .. job_id .. "' not found"
  end
  return log
end

-- subscribe(user, job_id, last_id) -> sub | nil, status, message.
-- sub:next(timeout) -> the events after the last one returned (a list,
-- empty when none came within timeout seconds) | nil, "gone" (the job was
-- deleted). Events: {id = "N", type =, data = <JSON text>}.
local Sub = {}
Sub.__index = Sub

function Sub:next(timeout)
  local log = self.log
  if log.removed then return nil, "gone" end
  if not log:wait(self.after, timeout) then return {} end
  if log.removed then return nil, "gone" end
  local out = {}
  for i, e in ipairs(log:after(self.after)) do
    out[i] = { id = tostring(e.id), type = e.type, data = e.data }
    self.after = e.id
  end
  -- a reader already past done: nothing more will come
  if #out == 0 and log.finished then self.ended = true end
  return out
end

function B:subscribe(user, job_id, last_id)
  local after = 0
  if last_id ~= nil and last_id ~= "" then
    after = last_id:find("^%d+$") and tonumber(last_id) or nil
    if not after then return nil, 400, "Last-Event-ID must be the id of an event of this stream (a number)" end
  end
  local log, st, msg = self:events(user, job_id)
  if not log then return nil, st, msg end
  return setmetatable({ log = log, after = after }, Sub)
end

local function summary(c)
  local last = c.messages[#c.messages]
  return { id = c.id, title = c.title, created_at = c.created_at, updated_at = c.updated_at or c.created_at,
           messages = #c.messages,
           last_message = last and type(last.content) == "string" and title_of(last.content) or json.null }
end

-- conversations(user, {limit, offset}) -> { items, total, limit, offset, next_offset }
function B:conversations(user, page)
  local list = {}
  for _, c in pairs(self.convs) do
    if c.user == user and not c.deleted then list[#list + 1] = c end
  end
  table_sort(list, function(a, b)
    if a.ts ~= b.ts then return a.ts > b.ts end
    return a.id > b.id
  end)
  local items = json.array()
  local off, lim = page.offset, page.limit
  for i = off + 1, math.min(#list, off + lim) do items[#items + 1] = summary(list[i]) end
  return { items = items, total = #list, limit = lim, offset = off,
           next_offset = off + lim < #list and off + lim or json.null }
end

function B:conversation(user, id)
  local c = ids.valid(id) and self.convs[id]
  if not c or c.deleted or c.user ~= user then return nil, 404, "conversation '" .. tostring(id) .. "' not found" end
  local out = summary(c)
  out.messages = c.messages
  out.message_count = #c.messages
  return out
end

-- delete(user, id) -> true | nil, status, message. The conversation's
-- messages, jobs, event logs and checkpoints (its memory) go; a deleted
-- conversation stays known to its owner (deleting again succeeds).
function B:delete(user, id)
  local c = ids.valid(id) and self.convs[id]
  if not c or c.user ~= user then return nil, 404, "conversation '" .. tostring(id) .. "' not found" end
  if c.deleted then return true end
  local guard <close> = lock(self, id)
  if c.deleted then return true end
  c.deleted = true
  local t = self.running[id]
  if t and t ~= mg.current() and not t:done() then pcall(t.cancel, t) end
  self.running[id], self.pending[id] = nil, nil
  local jobs = {}
  for _, m in ipairs(c.messages) do if m.job_id then jobs[m.job_id] = true end end
  for jid in pairs(jobs) do
    self.logs:remove(jid)
    self.jobs[jid] = nil
    store.remove(self:_path("jobs", jid))
  end
  pcall(self.saver.delete_thread, self.saver, id)
  local tomb = { id = id, user = user, deleted = true, deleted_at = iso(wall()), ts = c.ts,
                 messages = json.array() }
  self.convs[id] = tomb
  local ok, err = write_json(self:_path("conversations", id), tomb)
  if not ok then return nil, 503, "the conversation could not be deleted: " .. tostring(err) end
  return true
end

function B:script_names()
  return self.scripts:names()
end

return _M
