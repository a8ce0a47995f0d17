-- Run a Lua script in a separate lua5.4 process that can load moongraph
-- from this checkout (crash and cross-process specs).
local tmp = require "tmp"

local _M = {}

local root
local function repo_root()
  if not root then
    local p = io.popen("pwd")
    root = p:read("l")
    p:close()
  end
  return root
end

-- script(body) -> path of a temporary script: body with package paths set
-- (removed when the test ends, like everything of spec/support/tmp.lua)
function _M.script(body)
  local r = repo_root()
  local libdir = os.getenv("MOONGRAPH_LIBDIR") or "lib"
  if libdir:sub(1, 1) ~= "/" then libdir = r .. "/" .. libdir end
  local header = string.format(
    "package.path = %q .. package.path\npackage.cpath = %q .. package.cpath\n",
    r .. "/runtime/lua/?.lua;" .. r .. "/runtime/lua/?/init.lua;",
    libdir .. "/?.so;")
  return tmp.file(header .. body, "script.lua", "child")
end

-- run(path, ...) -> output, exit kind ("exit"|"signal"), code
function _M.run(path, ...)
  local args = {}
  for i, a in ipairs { ... } do args[i] = string.format("%q", tostring(a)) end
  local p = io.popen("exec lua5.4 " .. path .. " " .. table.concat(args, " ") .. " 2>&1")
  local out = p:read("a")
  local _, kind, code = p:close()
  return out, kind, code
end

-- a new empty directory, removed when the test ends
function _M.tmpdir()
  return tmp.dir("child")
end

function _M.lines(path)
  local out = {}
  local f = io.open(path)
  if not f then return out end
  for l in f:lines() do out[#out + 1] = l end
  f:close()
  return out
end

-- The kill -9 scenario, for any durable saver. A child process runs
-- START -> fan -> {a, b, killer} -> final; in "crash" mode, killer waits
-- until the writes of a and b are saved, then kills its own process; in
-- "resume" mode the thread is continued. Every node run is counted.
--   lua5.4 SCRIPT SAVER TARGET COUNTFILE MODE DURABILITY
-- SAVER is "file" (TARGET a directory) or "postgres" (TARGET a URL).
local CRASH_SCRIPT = [=[
local mg = require "moongraph"
local kind, target, countfile, mode, durability = arg[1], arg[2], arg[3], arg[4], arg[5]

local function count(name)
  local f = assert(io.open(countfile, "a"))
  f:write(name, "\n")
  f:close()
end

local function my_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("l"):match("^(%d+)")
  f:close()
  return pid
end

local saver = mg.checkpoint[kind](target)
local g = mg.graph { log = mg.reducers.append }
g:add_node("fan", function() count("fan") end)
g:add_node("a", function() count("a"); return { log = "a" } end)
g:add_node("b", function() mg.sleep(0.01); count("b"); return { log = "b" } end)
g:add_node("killer", function(_, ctx)
  count("killer")
  if mode == "crash" then
    -- once the writes of a and b are saved, die without any cleanup
    for _ = 1, 2000 do
      local tup = saver:get { thread_id = ctx.config.thread_id }
      local have = {}
      for _, w in ipairs(tup and tup.pending_writes or {}) do have[w[1]] = true end
      if have[ctx.step .. ":a"] and have[ctx.step .. ":b"] then
        os.execute("kill -9 " .. my_pid())
      end
      mg.sleep(0.005)
    end
    error("the writes of a and b never reached the saver")
  end
  return { log = "killer" }
end)
g:add_node("final", function(s)
  count("final")
  return { result = table.concat(s.log, ",") }
end)
g:add_edge(mg.START, "fan")
for _, n in ipairs { "a", "b", "killer" } do g:add_edge("fan", n) end
g:add_edge({ "a", "b", "killer" }, "final")
local app = g:compile { checkpointer = saver, durability = durability }

mg.run(function()
  local out, err
  if mode == "crash" then
    out, err = app:invoke({}, { thread_id = "job-1" })
  else
    out, err = app:invoke(nil, { thread_id = "job-1" })
  end
  print(out and ("RESULT " .. out.result) or ("ERROR " .. tostring(err)))
end)
]=]

-- crash_and_resume(saver, target, durability) -> a table with the crash
-- run's {out, kind, code} and sorted node list, the resume run's {out,
-- kind, code}, and `runs`, how often each node ran over both processes.
function _M.crash_and_resume(saver, target, durability)
  local script = _M.script(CRASH_SCRIPT)
  local counts = tmp.path("counts", "child")
  local r = {}
  r.crash = table.pack(_M.run(script, saver, target, counts, "crash", durability))
  r.crashed_nodes = _M.lines(counts)
  table.sort(r.crashed_nodes)
  r.resume = table.pack(_M.run(script, saver, target, counts, "resume", durability))
  r.runs = {}
  for _, name in ipairs(_M.lines(counts)) do r.runs[name] = (r.runs[name] or 0) + 1 end
  tmp.remove(script)
  tmp.remove(counts)
  return r
end

return _M
