-- moongraph submit [--redis URL] [--thread ID] [--user ID] [--location L]
--                  [--job ID] [--script NAME] [--follow] [--json] "message"
-- moongraph submit --attach JOB_ID [--last-id ID] [--json]
--
-- Enqueues a job for `moongraph worker` and prints its id; with --follow it
-- then prints the job's events as they arrive: the answer's tokens on
-- stdout, the nodes' progress on stderr (--json: every event as one JSON
-- line {id, type, data} on stdout). --attach follows a job submitted
-- earlier, from the event after --last-id. A lost Redis connection is
-- retried from the last event received. Exit status: 0 answered, 1 failed
-- (or refused, or no event for --timeout seconds), 2 bad usage.
local cjson = require("cjson.safe").new()

local USAGE = [[
usage: moongraph submit [--redis URL] [--thread ID] [--user ID] [--location LOCATION]
                        [--job ID] [--script NAME] [--prefix PREFIX]
                        [--follow] [--json] [--timeout SEC] MESSAGE
       moongraph submit --attach JOB_ID [--last-id ID] [--json] [--timeout SEC]
]]

local function parse(args)
  local o = { redis = os.getenv("MOONGRAPH_REDIS_URL"), timeout = 300, prefix = "moongraph" }
  if o.redis == "" then o.redis = nil end
  o.redis = o.redis or "redis://127.0.0.1:6379/0"
  local valued = {
    ["--redis"] = "redis", ["--thread"] = "thread", ["--user"] = "user", ["--location"] = "location",
    ["--job"] = "job", ["--script"] = "script", ["--attach"] = "attach", ["--last-id"] = "last_id",
    ["--timeout"] = "timeout", ["--prefix"] = "prefix",
  }
  local i = 1
  while i <= #args do
    local a = args[i]
    if valued[a] then
      local v = args[i + 1]
      if v == nil or v == "" then return nil, a .. " needs a value" end
      o[valued[a]] = v
      i = i + 2
    elseif a == "--follow" then
      o.follow = true; i = i + 1
    elseif a == "--json" then
      o.json = true; i = i + 1
    elseif a == "-h" or a == "--help" then
      o.help = true; i = i + 1
    elseif a:sub(1, 2) == "--" then
      return nil, "unknown option " .. a
    elseif o.message then
      return nil, "one message only (quote it)"
    else
      o.message = a; i = i + 1
    end
  end
  if o.help then return o end
  o.timeout = tonumber(o.timeout)
  if not o.timeout or o.timeout <= 0 then return nil, "--timeout: positive number of seconds expected" end
  if o.attach then
    if o.message then return nil, "--attach follows an existing job: no MESSAGE" end
    o.follow = true
  elseif not o.message or not o.message:find("%S") then
    return nil, "missing MESSAGE"
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
    if not o then
      io.stderr:write("moongraph submit: ", perr, "\n", USAGE)
      return 2
    end
    if o.help then io.stdout:write(USAGE) return 0 end
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
      local sok, id, entry = pcall(c.submit, c, {
        message = o.message, thread_id = o.thread, user_id = o.user or os.getenv("USER") or "cli",
        job_id = o.job, user_location = o.location, script = o.script,
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
