-- moongraph route [--prev-intent INTENT] [--location LOCATION] [--json] MESSAGE
--
-- Explains the Eco² routing decision for one message: the classifier's
-- scores, the keyword and transition adjustments, the routing rules that
-- fired and the nodes that would run (--json: the decision as the last line).
-- The rule tables are read on every run, so an edited rule counts at once.
--
-- main(args [, opts]) -> 0 done, 1 the message could not be classified,
-- 2 bad usage. opts: stdout, stderr (file-like), llm (default: from the
-- environment).
local args = require "moongraph.args"
local llm = require "moongraph.llm"
local text = require "moongraph.text"
local explain = require "scripts.eco.explain"
local routing = require "scripts.eco.routing"

local _M = {}

_M.SPEC = {
  name = "route",
  usage = "usage: route [--prev-intent INTENT] [--location LOCATION] [--json] MESSAGE",
  options = { ["prev-intent"] = "string", location = "string", json = "flag" },
  positional = { name = "message", label = "MESSAGE", required = true },
}

-- Strip Lua's "bad argument #n to 'f': " from a misuse error for a person.
local function plain(err)
  return (tostring(err):gsub("^bad argument #%d+ to '[%w_]+': ", ""))
end

function _M.main(argv, opts)
  opts = opts or {}
  local out, err = opts.stdout or io.stdout, opts.stderr or io.stderr
  local o, perr = args.parse(_M.SPEC, argv)
  if not o then return args.usage_error(_M.SPEC, perr, err) end
  if o.help then return args.help(_M.SPEC, out) end
  for _, v in ipairs { o.message, o.location } do
    local ok, at = text.check_utf8(v)
    if not ok then
      return args.usage_error(_M.SPEC, (v == o.message and "MESSAGE" or "--location") ..
        " is not valid UTF-8 (bad byte at position " .. at .. ")", err)
    end
  end
  if o.prev_intent and not routing.is_intent(o.prev_intent) then
    return args.usage_error(_M.SPEC, "unknown --prev-intent '" .. o.prev_intent .. "' (known: " ..
      table.concat(routing.INTENTS, ", ") .. ")", err)
  end
  local client = opts.llm
  if client == nil then
    local lerr
    client, lerr = llm.from_env()
    if lerr then err:write("route: no LLM: ", lerr, "; classifying offline\n") end
  end
  local ok, lines, e = pcall(explain.explain, o.message,
    { prev_intent = o.prev_intent, location = o.location, json = o.json, llm = client or nil })
  if not ok or not lines then
    err:write("route: ", plain(ok and e or lines), "\n")
    return 1
  end
  out:write(table.concat(lines, "\n"), "\n")
  return 0
end

return _M
