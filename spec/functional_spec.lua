-- LangGraph's functional API: entrypoint and task, as documented at
--   https://docs.langchain.com/oss/python/langgraph/functional-api
--   https://docs.langchain.com/oss/python/langgraph/use-functional-api
--   https://langchain-ai.github.io/langgraph/reference/func (previous, final)

local mg = require "moongraph"
local child = require "graph_child"

describe("functional API", function()
  -- "Tasks return a future-like object that can be awaited or resolved
  -- synchronously", and calls made before waiting run in parallel.
  it("task calls run in parallel and return futures", function()
    local order = {}
    local slow = mg.task(function(name, d)
      mg.sleep(d)
      order[#order + 1] = name
      return name .. "!"
    end, { name = "slow" })
    local wf = mg.entrypoint {} (function(input)
      local a, b = slow("a", 0.02), slow("b", 0)
      return { a:result(), b:result(), input }
    end)
    local out = mg.run(function() return wf:invoke("in") end)
    assert.same({ "a!", "b!", "in" }, out)
    assert.same({ "b", "a" }, order)   -- b finished first: they overlapped
  end)

  it("a task's error is raised by result() and fails the entrypoint", function()
    local bad = mg.task(function() error("no such bin", 0) end)
    local wf = mg.entrypoint {} (function() return bad():result() end)
    local out, err = mg.run(function() return wf:invoke(1) end)
    assert.is_nil(out)
    assert.matches("no such bin", tostring(err))
  end)

  it("a task outside any entrypoint or node simply runs", function()
    local double = mg.task(function(x) return x * 2 end)
    assert.equal(8, mg.run(function() return double(4):result() end))
  end)

  -- "previous: the return value of the previous invocation on the same
  -- thread" (with a checkpointer).
  it("ctx.previous is what the thread's last run returned", function()
    local wf = mg.entrypoint { checkpointer = mg.checkpoint.memory() } (function(n, ctx)
      return (ctx.previous or 0) + n
    end)
    local a, b, c = mg.run(function()
      return wf:invoke(1, { thread_id = "sum" }), wf:invoke(2, { thread_id = "sum" }),
             wf:invoke(5, { thread_id = "other" })
    end)
    assert.equal(1, a)
    assert.equal(3, b)
    assert.equal(5, c)
  end)

  -- "entrypoint.final: return a value to the caller and save a different
  -- value for the next invocation".
  it("entrypoint.final returns one value and saves another as previous", function()
    local wf = mg.entrypoint { checkpointer = mg.checkpoint.memory() } (function(n, ctx)
      local total = (ctx.previous or 0) + n
      return mg.entrypoint.final { value = "total so far: " .. total, save = total }
    end)
    local a, b, state = mg.run(function()
      return wf:invoke(2, { thread_id = "t" }), wf:invoke(3, { thread_id = "t" }),
             wf:get_state { thread_id = "t" }
    end)
    assert.equal("total so far: 2", a)
    assert.equal("total so far: 5", b)
    assert.equal("total so far: 5", state.values)
  end)

  -- "Resuming after an interrupt: tasks that already completed are not
  -- re-run; their results are taken from the checkpoint."
  it("mg.interrupt pauses; on resume finished tasks are not run again", function()
    local runs = 0
    local draft = mg.task(function(topic) runs = runs + 1; return "essay on " .. topic end, { name = "draft" })
    local wf = mg.entrypoint { checkpointer = mg.checkpoint.memory() } (function(topic)
      local essay = draft(topic):result()
      local verdict = mg.interrupt { essay = essay, action = "approve?" }
      return { essay = essay, approved = verdict }
    end)
    local paused, done = mg.run(function()
      local p = wf:invoke("cats", { thread_id = "review" })
      return p, wf:invoke(mg.Command { resume = true }, { thread_id = "review" })
    end)
    assert.equal("essay on cats", paused.__interrupt__[1].value.essay)
    assert.same({ essay = "essay on cats", approved = true }, done)
    assert.equal(1, runs)
  end)

  it("stream gives the tasks' updates and the entrypoint's return value", function()
    local step = mg.task(function(x) return x + 1 end, { name = "step" })
    local wf = mg.entrypoint { name = "flow" } (function(x) return step(x):result() * 10 end)
    local events = mg.run(function()
      local evs = {}
      for ev in wf:stream(1, { stream_mode = { "updates", "values" } }) do evs[#evs + 1] = ev end
      return evs
    end)
    local updates, values = {}, {}
    for _, ev in ipairs(events) do
      if ev.mode == "updates" then updates[#updates + 1] = ev.data end
      if ev.mode == "values" then values[#values + 1] = ev.data end
    end
    assert.same({ { step = 2 }, { flow = 20 } }, updates)
    assert.same({ 20 }, values)
  end)

  it("a thread's second streamed run gives only its own return value", function()
    local wf = mg.entrypoint { checkpointer = mg.checkpoint.memory() } (function(x) return x * 10 end)
    local values = mg.run(function()
      assert.equal(10, wf:invoke(1, { thread_id = "again" }))   -- the thread has a previous value
      local out = {}
      for ev in wf:stream(2, { thread_id = "again", stream_mode = "values" }) do out[#out + 1] = ev.data end
      return out
    end)
    assert.same({ 20 }, values)
  end)

  it("misuse is named", function()
    assert.has_error(function() mg.task(42) end, "bad argument #1 to 'task': function expected, got number")
    assert.has_error(function() mg.task(function() end, { name = "a/b" }) end,
      "bad argument #2 to 'task': name must be a non-empty string without '/' or '#'")
    assert.has_error(function() mg.entrypoint {} (42) end,
      "bad argument #1 to entrypoint{...}: the workflow function expected, got number")
  end)
end)

-- An entrypoint killed with kill -9 while a task runs resumes in a new
-- process: the task that finished before the crash is not run again.
local CRASH = [=[
local mg = require "moongraph"
local dir, mode = arg[1], arg[2]
local function count(name)
  local f = assert(io.open(dir .. "/runs", "a")); f:write(name, "\n"); f:close()
end
local function my_pid()
  local f = assert(io.open("/proc/self/stat")); local pid = f:read("l"):match("^(%d+)"); f:close()
  return pid
end
local saver = mg.checkpoint.file(dir .. "/cp")
local fetch = mg.task(function(x) count("fetch"); return x * 2 end, { name = "fetch" })
local finish = mg.task(function(x, ctx_thread)
  count("finish")
  if mode == "crash" then
    -- once fetch's result is saved, die without any cleanup
    for _ = 1, 2000 do
      local saved = saver:get { thread_id = ctx_thread }
      for _, w in ipairs(saved and saved.pending_writes or {}) do
        if w[1]:match("/fetch#1$") then os.execute("kill -9 " .. my_pid()) end
      end
      mg.sleep(0.005)
    end
    error("fetch's result never reached the saver")
  end
  return x + 1
end, { name = "finish" })
local wf = mg.entrypoint { checkpointer = saver, durability = "sync" } (function(x, ctx)
  local doubled = fetch(x):result()
  return finish(doubled, ctx.config.thread_id):result()
end)
mg.run(function()
  local out, err
  if mode == "crash" then out, err = wf:invoke(20, { thread_id = "job" })
  else out, err = wf:invoke(nil, { thread_id = "job" }) end
  print(out and ("RESULT " .. out) or ("ERROR " .. tostring(err)))
end)
]=]

describe("functional API across a crash", function()
  it("a resumed entrypoint does not run the tasks that finished before kill -9", function()
    local dir = child.tmpdir()
    assert(os.execute("mkdir -p " .. dir))
    local script = child.script(CRASH)
    finally(function() os.remove(script); os.execute("rm -rf " .. dir) end)
    local out, kind, code = child.run(script, dir, "crash")
    assert.equal("signal", kind, out)
    assert.equal(9, code)
    out, kind, code = child.run(script, dir, "resume")
    assert.equal("exit", kind, out)
    assert.equal(0, code)
    assert.equal("RESULT 41\n", out)
    assert.same({ "fetch", "finish", "finish" }, child.lines(dir .. "/runs"))
  end)
end)
