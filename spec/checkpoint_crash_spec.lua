-- A run killed with SIGKILL in the middle of a superstep resumes in a new
-- process and re-runs only the tasks whose writes were not saved.
local child = require "graph_child"

local SCRIPT = [=[
local mg = require "moongraph"
local G = require "moongraph.graph"
local dir, countfile, mode, durability = arg[1], arg[2], arg[3], arg[4]

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

local saver = G.checkpoint.file(dir)
local g = G.new { log = G.reducers.append }
g:add_node("fan", function() count("fan") end)
g:add_node("a", function() count("a"); return { log = "a" } end)
g:add_node("b", function() count("b"); return { log = "b" } end)
g:add_node("killer", function(_, ctx)
  count("killer")
  if mode == "crash" then
    -- once the writes of a and b are on disk, die without any cleanup
    for _ = 1, 2000 do
      local tup = saver:get { thread_id = ctx.config.thread_id }
      local have = {}
      for _, w in ipairs(tup and tup.pending_writes or {}) do have[w[1]] = true end
      if have[ctx.step .. ":a"] and have[ctx.step .. ":b"] then
        os.execute("kill -9 " .. my_pid())
      end
      mg.sleep(0.002)
    end
    error("the writes of a and b never reached the disk")
  end
  return { log = "killer" }
end)
g:add_node("final", function(s)
  count("final")
  return { result = table.concat(s.log, ",") }
end)
g:add_edge(G.START, "fan")
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

describe("crash recovery with the file saver", function()
  for _, durability in ipairs { "async", "sync" } do
    it("a run killed with kill -9 mid-step re-runs only unfinished tasks (durability " .. durability .. ")", function()
      local script = child.script(SCRIPT)
      local dir = child.tmpdir()
      local counts = os.tmpname()

      local out, kind, code = child.run(script, dir, counts, "crash", durability)
      assert.equal("signal", kind, out)
      assert.equal(9, code)
      assert.same({ "a", "b", "fan", "killer" }, (function()
        local l = child.lines(counts)
        table.sort(l)
        return l
      end)())

      out, kind, code = child.run(script, dir, counts, "resume", durability)
      assert.equal("exit", kind, out)
      assert.equal(0, code)
      assert.equal("RESULT a,b,killer\n", out)

      local n = {}
      for _, name in ipairs(child.lines(counts)) do n[name] = (n[name] or 0) + 1 end
      assert.same({ fan = 1, a = 1, b = 1, killer = 2, final = 1 }, n)
      os.remove(script)
      os.remove(counts)
      os.execute("rm -rf " .. dir)
    end)
  end
end)
