-- Explain how a message is classified and routed.
--
--   lua5.4 scripts/eco/route.lua [--prev-intent I] [--location L] [--json] "message"
--
-- Without an LLM this uses the offline classifier. --json adds the decision
-- as one JSON object on the last line of output.

local root = (arg and arg[0] or ""):match("^(.-)scripts[/\\]eco[/\\]route%.lua$") or ""
package.path = (root ~= "" and root or "./") .. "?.lua;" .. package.path

local explain = require "scripts.eco.explain"

local usage = "usage: route.lua [--prev-intent INTENT] [--location LOCATION] [--json] MESSAGE"

local opts, message = {}, nil
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--prev-intent" or a == "--location" then
    local v = arg[i + 1]
    if not v then
      io.stderr:write(a, " needs a value\n", usage, "\n")
      os.exit(2)
    end
    opts[a == "--prev-intent" and "prev_intent" or "location"] = v
    i = i + 2
  elseif a == "--json" then
    opts.json = true
    i = i + 1
  elseif a == "-h" or a == "--help" then
    print(usage)
    os.exit(0)
  elseif a:sub(1, 2) == "--" then
    io.stderr:write("unknown option ", a, "\n", usage, "\n")
    os.exit(2)
  elseif message then
    io.stderr:write("one message only (quote it)\n", usage, "\n")
    os.exit(2)
  else
    message = a
    i = i + 1
  end
end
if not message or not message:find("%S") then
  io.stderr:write(usage, "\n")
  os.exit(2)
end

local ok, lines, err = pcall(explain.explain, message, opts)
if not ok or not lines then
  local msg = tostring(ok and err or lines):gsub("^bad argument #%d+ to '[%w_]+': ", "")
  io.stderr:write("route: ", msg, "\n")
  os.exit(1)
end
io.stdout:write(table.concat(lines, "\n"), "\n")
