-- moongraph submit [--redis URL] [--thread ID] [--user ID] [--job ID] [--script NAME]
--                  [--input JSON] [--set KEY=VALUE]... [--multitask-strategy S]
--                  [--follow] [--json] [MESSAGE]
-- moongraph submit --attach JOB_ID [--last-id ID] [--json]
--
-- Enqueues a job for `moongraph worker` and prints its id; with --follow it
-- then prints the job's events as they arrive: the answer's tokens on
-- stdout, the nodes' progress on stderr (--json: every event as one JSON
-- line {id, type, data} on stdout). --attach follows a job submitted
-- earlier, from the event after --last-id. A lost Redis connection is
-- retried from the last event received. Exit status: 0 answered, 1 failed
-- (or refused, or no event for --timeout seconds), 2 bad usage.
--
-- The job's input is the --input object, then each --set KEY=VALUE (a
-- string value), then MESSAGE as input.message; a later one replaces a key
-- an earlier one gave.
local json = require "moongraph.json"
local cjson = json.wire()
local cliargs = require "moongraph.args"

local USAGE = [=[
usage: moongraph submit [--redis URL] [--thread ID] [--user ID] [--job ID] [--script NAME]
                        [--input JSON] [--set KEY=VALUE]... [--prefix PREFIX]
                        [--multitask-strategy enqueue|reject|interrupt|rollback]
                        [--follow] [--json] [--timeout SEC] [MESSAGE]
       moongraph submit --attach JOB_ID [--last-id ID] [--json] [--timeout SEC]]=]

local HELP = [[
The job's input (a JSON object the script receives) is built from --input
JSON, then each --set KEY=VALUE (string values; repeatable), then MESSAGE as
the key "message"; a later one replaces a key an earlier one gave. At least
one of them is needed. --user defaults to $USER. When another job of the
same --thread runs, --multitask-strategy says what this one does: enqueue
(default: wait for it), reject, interrupt or rollback (stop it). Text must
be UTF-8 without NUL characters. docs/worker.md has the details.]]

local SPEC = {
  name = "moongraph submit", usage = USAGE, help = HELP,
  options = {
    redis = "string", thread = "string", user = "string", job = "string", script = "string",
    input = "string", set = "list", prefix = "string", follow = "flag", json = "flag",
    timeout = "number", attach = "string", ["last-id"] = "string",
    ["multitask-strategy"] = "string",
  },
  positional = { name = "message", label = "MESSAGE" },
}

-- The job's input from --input, --set and MESSAGE | nil, message.
local function build_input(o)
  local input = {}
  if o.input then
    local v, err = json.decode(o.input)
    if v == nil then return nil, "--input: " .. tostring(err) end
    if type(v) ~= "table" or json.is_array(v) or v[1] ~= nil then
      return nil, "--input: a JSON object expected (e.g. '{\"message\": \"hi\"}')"
    end
    input = v
  end
  for _, kv in ipairs(o.set or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if not k then return nil, "--set: KEY=VALUE expected, got '" .. kv .. "'" end
    input[k] = v
  end
  if o.message ~= nil then input.message = o.message end
  return input
end

local function parse(args)
  local o, err = cliargs.parse(SPEC, args)
  if not o then return nil, err end
  if o.help then return o end
  o.redis = o.redis or os.getenv("MOONGRAPH_REDIS_URL")
  if o.redis == "" then o.redis = nil end
  o.redis = o.redis or "redis://127.0.0.1:6379/0"
  o.prefix = o.prefix or "moongraph"
  o.timeout = o.timeout or 300
  if o.timeout <= 0 then return nil, "--timeout: positive number of seconds expected" end
  if o.attach then
    if o.message or o.input or o.set then
      return nil, "--attach follows an existing job: no MESSAGE, --input or --set"
    end
    o.follow = true
  else
    if o.message ~= nil and not o.message:find("%S") then return nil, "MESSAGE is empty" end
    if o.multitask_strategy and not require("moongraph.multitask").known(o.multitask_strategy) then
      return nil, "--multitask-strategy: enqueue, reject, interrupt or rollback expected"
    end
    if o.message == nil and not o.input and not o.set then
      return nil, "missing MESSAGE (or --input JSON, --set KEY=VALUE)"
    end
    o.job_input, err = build_input(o)
    if not o.job_input then return nil, err end
  end
  if o.last_id and not o.last_id:match("^%d+%-%d+$") then
    return nil, "--last-id: a stream id (MS-SEQ) expected"
  end
  return o
end

local function printer(o)
  local out, err = io.stdout, io.stderr
  local in_answer = false
  local started = {}
  return function(ev)
    if o.json then
      out:write(cjson.encode { id = ev.id, type = ev.type, data = ev.data }, "\n")
      out:flush()
      return
    end
    local d = type(ev.data) == "table" and ev.data or {}
    if ev.type == "node_start" then
      local k = tostring(d.ns or "") .. "|" .. tostring(d.task_id)
      if started[k] then
        if in_answer then out:write("\n"); out:flush(); in_answer = false end
        err:write(string.format("· %s runs again (attempt %s): a worker stopped in the middle of it\n",
          tostring(d.node), tostring(d.attempt)))
      end
      started[k] = true
    elseif ev.type == "token" then
      out:write(d.text or "")
      out:flush()
      in_answer = true
    elseif ev.type == "node_end" then
      if in_answer then out:write("\n"); out:flush(); in_answer = false end
      err:write(string.format("· %-17s %-9s %8.2f ms%s\n", tostring(d.node), tostring(d.status),
        tonumber(d.duration_ms) or 0, d.error and ("  " .. tostring(d.error)) or ""))
    elseif ev.type == "error" then
      if in_answer then out:write("\n"); in_answer = false end
      err:write("moongraph submit: the job failed: ", tostring(d.error), "\n")
    elseif ev.type == "done" then
      if in_answer then out:write("\n"); in_answer = false end
      out:flush()
      err:write(string.format("· done: %s%s\n", tostring(d.status),
        d.duration_ms and string.format(" in %.1f ms", d.duration_ms) or ""))
    end
  end
end

return {
  main = function(args)
    local o, perr = parse(args)
    if not o then return cliargs.usage_error(SPEC, perr) end
    if o.help then return cliargs.help(SPEC) end
    local ok, uerr = require("moongraph.redis").parse_url(o.redis)
    if not ok then
      io.stderr:write("moongraph submit: --redis: ", uerr, "\n")
      return 2
    end
    local client = require "moongraph.worker.client"
    local c, cerr = client.connect(o.redis, { prefix = o.prefix })
    if not c then
      io.stderr:write("moongraph submit: ", tostring(cerr), "\n")
      return 1
    end
    local job_id = o.attach
    if not job_id then
      local user = o.user or os.getenv("USER")
      if user == "" then user = nil end
      local sok, id, entry = pcall(c.submit, c, {
        input = o.job_input, thread_id = o.thread, user_id = user or "cli",
        job_id = o.job, script = o.script, multitask_strategy = o.multitask_strategy,
      })
      if not sok then
        io.stderr:write("moongraph submit: ", (tostring(id):gsub("^bad argument #1 to 'submit' %((.*)%)$", "%1")), "\n")
        return 2
      end
      if not id then
        io.stderr:write("moongraph submit: ", tostring(entry), "\n")
        return 1
      end
      job_id = id
      if not o.follow or not o.json then io.stdout:write(job_id, "\n") io.stdout:flush() end
      if not o.follow then return 0 end
    end
    local warned = false
    local last, done, last_id = c:follow(job_id, {
      last_id = o.last_id, on_event = printer(o), idle_timeout = o.timeout,
      on_retry = function(e)
        if not warned then
          io.stderr:write("moongraph submit: connection lost (", tostring(e), "); reconnecting\n")
          warned = true
        end
      end,
    })
    c:close()
    if not last then
      io.stderr:write("moongraph submit: gave up following job ", job_id, ": ", tostring(done),
        " (resume with --attach ", job_id, " --last-id ", tostring(last_id), ")\n")
      return 1
    end
    local status = type(done.data) == "table" and done.data.status
    return status == "done" and 0 or 1
  end,
}
