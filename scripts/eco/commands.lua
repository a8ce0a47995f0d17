-- The `route` and `eval` commands, argument parsing included, so any front
-- end (the moongraph CLI, scripts/eco/route.lua, scripts/eco/eval_cli.lua)
-- runs the same code. Each takes the arguments after the command name and
-- returns the exit status: 0 done, 1 failure, 2 bad usage.
--
-- opts (all optional): stdout, stderr (file-like, with :write), llm (an LLM
-- client for intent.classify), is_tty (eval: stdout is a terminal, draw a
-- progress bar on stderr).

local explain = require "scripts.eco.explain"
local eval = require "scripts.eco.eval"
local intent = require "scripts.eco.intent"
local text = require "moongraph.text"

local _M = {}

_M.ROUTE_USAGE = "usage: route [--prev-intent INTENT] [--location LOCATION] [--json] MESSAGE"
_M.EVAL_USAGE = "usage: eval [--json] FILE.jsonl"

local function streams(opts)
  opts = opts or {}
  return opts.stdout or io.stdout, opts.stderr or io.stderr, opts
end

-- Strip Lua's "bad argument #n to 'f': " from a misuse error for a person.
local function plain(err)
  return (tostring(err):gsub("^bad argument #%d+ to '[%w_]+': ", ""))
end

-- route [--prev-intent I] [--location L] [--json] MESSAGE
function _M.route(args, opts)
  local out, err, o = streams(opts)
  local x = { llm = o.llm }
  local message
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--prev-intent" or a == "--location" then
      local v = args[i + 1]
      if not v then
        err:write("route: ", a, " needs a value\n", _M.ROUTE_USAGE, "\n")
        return 2
      end
      x[a == "--prev-intent" and "prev_intent" or "location"] = v
      i = i + 2
    elseif a == "--json" then
      x.json = true
      i = i + 1
    elseif a == "-h" or a == "--help" then
      out:write(_M.ROUTE_USAGE, "\n")
      return 0
    elseif a:sub(1, 2) == "--" then
      err:write("route: unknown option ", a, "\n", _M.ROUTE_USAGE, "\n")
      return 2
    elseif message then
      err:write("route: one message only (quote it)\n", _M.ROUTE_USAGE, "\n")
      return 2
    else
      message = a
      i = i + 1
    end
  end
  if not message or not message:find("%S") then
    err:write("route: missing MESSAGE\n", _M.ROUTE_USAGE, "\n")
    return 2
  end
  for _, v in ipairs { message, x.location } do
    local ok, at = text.check_utf8(v)
    if not ok then
      err:write("route: ", v == message and "MESSAGE" or "--location",
        " is not valid UTF-8 (bad byte at position ", at, ")\n")
      return 2
    end
  end
  if x.prev_intent and not intent.is_intent(x.prev_intent) then
    err:write("route: unknown --prev-intent '", x.prev_intent, "' (known: ",
      table.concat(intent.INTENTS, ", "), ")\n", _M.ROUTE_USAGE, "\n")
    return 2
  end
  local ok, lines, e = pcall(explain.explain, message, x)
  if not ok or not lines then
    err:write("route: ", plain(ok and e or lines), "\n")
    return 1
  end
  out:write(table.concat(lines, "\n"), "\n")
  return 0
end

-- eval [--json] FILE.jsonl
function _M.eval(args, opts)
  local out, err, o = streams(opts)
  local as_json, path = false, nil
  for _, a in ipairs(args) do
    if a == "--json" then
      as_json = true
    elseif a == "-h" or a == "--help" then
      out:write(_M.EVAL_USAGE, "\n")
      return 0
    elseif a:sub(1, 2) == "--" then
      err:write("eval: unknown option ", a, "\n", _M.EVAL_USAGE, "\n")
      return 2
    elseif path then
      err:write("eval: one file only\n", _M.EVAL_USAGE, "\n")
      return 2
    else
      path = a
    end
  end
  if not path then
    err:write("eval: missing FILE\n", _M.EVAL_USAGE, "\n")
    return 2
  end
  local lines, rerr = eval.read_lines(path)
  if not lines then
    err:write("eval: ", rerr, "\n")
    return 1
  end
  local report, e = eval.eval(lines, {
    is_tty = o.is_tty, llm = o.llm,
    write = function(s) err:write(s) end,
  })
  if not report then
    err:write("eval: ", path, ": ", e, "\n")
    return 1
  end
  out:write(as_json and (eval.json(report) .. "\n") or eval.text(report))
  return 0
end

return _M
