-- moongraph.repl: the interactive prompt.
--
-- Each entry runs in its own task, so waiting primitives (mg.sleep,
-- http.get, ...) work at the prompt and tasks spawned there live on between
-- entries. Incomplete statements continue on the next line (as lua.c does);
-- `=expr` and bare expressions print their values. Ctrl-C cancels the
-- running entry and keeps the prompt.

local core = require "moongraph.core"
local pretty = require "moongraph.pretty"
local loop = core.loop

local _M = {}

local function history_path()
  local p = os.getenv("MOONGRAPH_HISTORY")
  if p then return p end
  local home = os.getenv("HOME")
  return home and (home .. "/.moongraph_history") or nil
end

-- Compile one entry: an expression first (so `1+1` prints 2), then a
-- statement. Returns fn, or nil, "incomplete", or nil, message.
function _M.compile(src)
  local expr = src:gsub("^%s*=", "")
  local fn = load("return " .. expr, "=stdin")
  if fn then return fn end
  local err
  fn, err = load(src, "=stdin")
  if fn then return fn end
  if err:find("<eof>", 1, true) then return nil, "incomplete" end
  return nil, err
end

local function print_results(res)
  if res.n == 0 then return end
  local out = {}
  for i = 1, res.n do out[i] = pretty.format(res[i]) end
  io.stdout:write(table.concat(out, "\t"), "\n")
end

-- Run one compiled entry in a task and print what it returns.
function _M.eval(fn)
  local ok, res = pcall(loop.run_keeping_tasks, function()
    return table.pack(fn())
  end)
  if ok then
    print_results(res)
  elseif res == "cancelled" then
    io.stderr:write("(cancelled)\n")
  else
    io.stderr:write(tostring(res), "\n")
  end
  io.stdout:flush()
  return ok
end

function _M.start(file)
  local rl = require "moongraph.repl_core"   -- line editing: built into the binary
  loop.install_interrupt()
  _G.mg = require "moongraph"
  local tty = rl.isatty(0)
  local hist = history_path()
  if tty and hist then rl.load_history(hist) end
  if file then
    local chunk, err = loadfile(file)
    if not chunk then
      io.stderr:write("moongraph: ", err, "\n")
      return 1
    end
    _M.eval(chunk)
  end
  if tty then
    io.stdout:write("moongraph ", core.version, " (", _VERSION, ")  Ctrl-D exits, Ctrl-C cancels\n")
  end
  while true do
    local line = rl.readline("> ")
    if not line then break end
    local src = line
    local fn, err = _M.compile(src)
    while not fn and err == "incomplete" do
      local more = rl.readline(">> ")
      if not more then break end
      src = src .. "\n" .. more
      fn, err = _M.compile(src)
    end
    if src:match("%S") then rl.add_history(src) end
    if fn then
      _M.eval(fn)
    elseif err and err ~= "incomplete" then
      io.stderr:write(err, "\n")
    end
  end
  if tty then
    io.stdout:write("\n")
    if hist then rl.save_history(hist) end
  end
  return 0
end

return _M
