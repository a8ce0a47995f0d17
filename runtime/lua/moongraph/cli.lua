-- moongraph.cli: the command line of the `moongraph` executable.
--
-- `run FILE`, `-e CODE`, `repl`, `--version` and `help` are handled here.
-- Any other NAME is a command of moongraph.commands: a runtime command
-- (moongraph.cmd.NAME) or one an application declares in its
-- scripts/APP/commands.lua. Its module's `main(args)` runs inside a task and
-- returns the exit status. Unknown commands and bad flags print the usage and
-- exit 2; a script error prints its traceback and exits 1.

local core = require "moongraph.core"
local commands = require "moongraph.commands"
local loop = core.loop

local _M = {}

local USAGE = [[
usage: moongraph COMMAND [ARGS...]

  run FILE [ARGS...]   run a Lua script (global `arg` as in lua)
  -e CODE              run a Lua chunk
  repl [FILE]          interactive prompt (runs FILE first when given)
  --version            print the version
  help                 this text
]]

local function usage(out)
  out:write(USAGE)
  out:write("\nruntime commands:\n")
  for _, c in ipairs(commands.runtime()) do
    out:write(string.format("  %-20s %s\n", c.name, c.summary))
  end
  local ok, apps = pcall(loop.run, commands.apps)
  if not ok then
    out:write("\n(application commands could not be listed: ", tostring(apps), ")\n")
    return
  end
  local app = nil
  for _, c in ipairs(apps) do
    if c.app ~= app then
      app = c.app
      out:write("\n", app, " (scripts/", app, "/):\n")
    end
    out:write(string.format("  %-20s %s\n", c.name, c.summary))
  end
end

local function bad_usage(msg)
  io.stderr:write("moongraph: ", msg, "\n")
  usage(io.stderr)
  return 2
end

-- Run fn(...) as the main task; the process lives until every task is done.
local function run_main(fn, ...)
  loop.install_interrupt()
  local ok, err_or_code = pcall(loop.run_to_completion, fn, ...)
  local flushed, ferr = io.stdout:flush()
  if not ok then
    if err_or_code == "cancelled" then
      io.stderr:write("moongraph: interrupted\n")
      return 130
    end
    io.stderr:write("moongraph: ", tostring(err_or_code), "\n")
    return 1
  end
  local code = math.type(err_or_code) == "integer" and err_or_code or 0
  if not flushed and code == 0 then
    io.stderr:write("moongraph: error writing to standard output: ", tostring(ferr), "\n")
    return 1
  end
  return code
end

local function script_args(argv, first)
  local a = { [-1] = argv[0] }
  a[0] = argv[first]
  for i = first + 1, #argv do a[i - first] = argv[i] end
  return a
end

function _M.main(argv)
  local cmd = argv[1]
  if cmd == nil then
    if require("moongraph.repl_core").isatty(0) then
      return require("moongraph.repl").start()
    end
    return bad_usage("missing command")
  end
  if cmd == "--version" or cmd == "-v" or cmd == "version" then
    io.stdout:write("moongraph ", core.version, " (", _VERSION, ")\n")
    return 0
  elseif cmd == "help" or cmd == "--help" or cmd == "-h" then
    usage(io.stdout)
    return 0
  elseif cmd == "run" then
    local file = argv[2]
    if not file then return bad_usage("run: missing FILE") end
    local chunk, err = require("moongraph.chunkcache").loadfile(file)
    if not chunk then
      io.stderr:write("moongraph: ", err, "\n")
      return 1
    end
    local a = script_args(argv, 2)
    _G.arg = a
    return run_main(chunk, table.unpack(a, 1, #a))
  elseif cmd == "-e" then
    local code = argv[2]
    if not code then return bad_usage("-e: missing CODE") end
    local chunk, err = load(code, "=(command line)")
    if not chunk then
      io.stderr:write("moongraph: ", err, "\n")
      return 1
    end
    _G.arg = script_args(argv, 2)
    return run_main(chunk)
  elseif cmd == "repl" then
    return require("moongraph.repl").start(argv[2])
  elseif cmd:sub(1, 1) == "-" then
    return bad_usage("unknown option '" .. cmd .. "'")
  end
  if not cmd:match("^[%w_]+$") then
    return bad_usage("unknown command '" .. cmd .. "'")
  end
  local found, c = pcall(loop.run, commands.find, cmd)
  if not found then
    io.stderr:write("moongraph: ", tostring(c), "\n")
    return 1
  end
  if not c then
    return bad_usage("unknown command '" .. cmd .. "' (application commands are declared in " ..
      "scripts/APP/commands.lua beside the modules: the working directory, the moongraph " ..
      "binary's directory or MOONGRAPH_PATH)")
  end
  local ok, mod = pcall(require, c.module)
  if not ok then
    io.stderr:write("moongraph: ", tostring(mod), "\n")
    return 1
  end
  if type(mod) ~= "table" or type(mod.main) ~= "function" then
    io.stderr:write("moongraph: command '", cmd, "': module ", tostring(c.module),
      " does not return a table with main(args)\n")
    return 1
  end
  local rest = {}
  for i = 2, #argv do rest[#rest + 1] = argv[i] end
  return run_main(mod.main, rest)
end

return _M
