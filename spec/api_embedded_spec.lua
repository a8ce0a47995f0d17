-- moongraph.api.embedded: the LangGraph API's embedded backend, driven
-- directly (decoded request tables in, response tables and events out).
local mg = require "moongraph"
local embedded = require "moongraph.api.embedded"
local tmp = require "tmp"

local SCRIPTS = { { name = "agent", path = "spec/fixtures/lgapi_agent.lua" } }

local function backend(dir)
  return assert(embedded.new { data = dir or tmp.dir("lgapi"), scripts = SCRIPTS })
end

local flows = require "langgraph_flows"
local drain, reach, names = flows.drain, flows.reach, flows.event_names

local function input(text, extra)
  local t = { messages = { { role = "user", content = text } } }
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

describe("api.embedded", function()
  it("lists each script as an assistant whose id is its name, and draws its graph", function()
    mg.run(function()
      local b = backend()
      local list = b:assistants_search {}
      assert.equal(1, #list)
      assert.equal("agent", list[1].assistant_id)
      assert.equal("agent", list[1].graph_id)
      assert.equal("agent", b:assistant("agent").name)
      local none, st = b:assistant("nope")
      assert.is_nil(none)
      assert.equal(404, st)
      local g = b:assistant_graph("agent")
      local ids = {}
      for _, n in ipairs(g.nodes) do ids[#ids + 1] = n.id end
      assert.same({ "__start__", "think", "ticks", "review", "__end__" }, ids)
      local edges = {}
      for _, e in ipairs(g.edges) do edges[#edges + 1] = e.source .. ">" .. e.target end
      assert.same({ "__start__>think", "think>ticks", "ticks>review", "review>__end__" }, edges)
    end)
  end)

  it("creates, finds, patches and deletes threads, and refuses a second with the same id", function()
    mg.run(function()
      local b = backend()
      local t = assert(b:thread_create(nil, { thread_id = "t-1", metadata = { team = "a" } }))
      assert.equal("t-1", t.thread_id)
      assert.equal("idle", t.status)
      local _, st = b:thread_create(nil, { thread_id = "t-1" })
      assert.equal(409, st)
      assert.equal("t-1", b:thread_create(nil, { thread_id = "t-1", if_exists = "do_nothing" }).thread_id)
      assert(b:thread_create(nil, { metadata = { team = "b" } }))
      local found = b:thread_search(nil, { metadata = { team = "a" } })
      assert.equal(1, #found)
      assert.equal("t-1", found[1].thread_id)
      assert.equal("x", b:thread_patch(nil, "t-1", { metadata = { extra = "x" } }).metadata.extra)
      assert.equal("a", b:thread_get(nil, "t-1").metadata.team)
      assert.is_true(b:thread_delete(nil, "t-1"))
      local gone, gst = b:thread_get(nil, "t-1")
      assert.is_nil(gone)
      assert.equal(404, gst)
      local _, bad = b:thread_create(nil, { thread_id = "has space" })
      assert.equal(422, bad)
    end)
  end)

  it("answers 404 for another user's thread, as for one that does not exist", function()
    mg.run(function()
      local b = backend()
      local t = assert(b:thread_create("alice", {}))
      assert.equal(t.thread_id, b:thread_get("alice", t.thread_id).thread_id)
      for _, op in ipairs {
        function() return b:thread_get("bob", t.thread_id) end,
        function() return b:thread_state("bob", t.thread_id) end,
        function() return b:thread_delete("bob", t.thread_id) end,
        function() return b:run_create("bob", t.thread_id, { assistant_id = "agent", input = input("hi") }) end,
      } do
        local v, st = op()
        assert.is_nil(v)
        assert.equal(404, st)
      end
      assert.equal(0, #b:thread_search("bob", {}))
      assert.equal(1, #b:thread_search("alice", {}))
    end)
  end)

  it("streams a run: metadata first, then values, updates, messages and custom events in order", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      local run = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("hi there"),
        stream_mode = { "values", "updates", "messages-tuple", "custom" } }))
      local evs = drain(run)
      assert.equal("metadata", evs[1].event)
      assert.equal(run.run_id, evs[1].data.run_id)
      assert.same({ "metadata", "values", "custom", "messages", "messages", "messages", "updates", "values",
        "updates", "values", "updates", "values" }, names(evs))
      local words = {}
      for _, e in ipairs(evs) do
        if e.event == "messages" then
          words[#words + 1] = e.data[1].content
          assert.equal("think", e.data[2].langgraph_node)
        end
      end
      assert.equal("echo: hi there ", table.concat(words))
      assert.same({ think = { steps = { "think" }, messages = { { role = "assistant", content = "echo: hi there" } } } },
        evs[7].data)
      assert.same({ "think", "ticks", "review" }, evs[#evs].data.steps)
      assert.equal("success", run.status)
      for i, e in ipairs(evs) do assert.equal(i, e.seq) end
      assert.equal("idle", b:thread_get(nil, t.thread_id).status)
    end)
  end)

  it("pauses at an interrupt (thread interrupted, interrupts in the state) and resumes with a command", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      local run = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent",
        input = input("hi", { ask = "ship it?" }), stream_mode = "values" }))
      local evs = drain(run)
      assert.same({ { id = "3:review/1", value = { question = "ship it?" } } }, evs[#evs].data.__interrupt__)
      local th = b:thread_get(nil, t.thread_id)
      assert.equal("interrupted", th.status)
      assert.equal("ship it?", th.interrupts["3:review"][1].value.question)
      local st = b:thread_state(nil, t.thread_id)
      assert.same({ "review" }, st.next)
      assert.equal("ship it?", st.interrupts[1].value.question)
      assert.equal("ship it?", b:run_output(run).__interrupt__[1].value.question)
      local resume = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", command = { resume = "yes" } }))
      local out = b:run_output(resume)
      assert.equal("yes", out.approved)
      assert.is_nil(out.__interrupt__)
      assert.equal("idle", b:thread_get(nil, t.thread_id).status)
    end)
  end)

  it("reports a failed run as an error event, run status error and thread status error", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      local run = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("hi", { fail = "boom" }) }))
      local evs = drain(run)
      assert.equal("error", evs[#evs].event)
      -- the client hears which node failed and the run it is logged under
      local said = "node 'review' failed (run " .. run.run_id .. ")"
      assert.equal(said, evs[#evs].data.message)
      assert.equal("error", run.status)
      assert.equal(said, b:run_output(run).__error__.message)
      assert.equal("error", b:thread_get(nil, t.thread_id).status)
    end)
  end)

  it("multitask reject answers 409 while the thread is busy; enqueue runs after the first", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      local first = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("one", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(first, "custom")   -- inside think: under sync durability its input is saved
      assert.equal("busy", b:thread_get(nil, t.thread_id).status)
      local none, st, msg = b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("two") })
      assert.is_nil(none)
      assert.equal(409, st)
      assert.matches("multitask_strategy", msg)
      local queued = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("three", { hold = false }),
        multitask_strategy = "enqueue" }))
      assert.equal("pending", queued.status)
      assert.is_true(b:run_cancel(nil, t.thread_id, first.run_id, "interrupt"))
      local out = b:run_output(queued)
      assert.equal("interrupted", first.status)
      assert.equal("success", queued.status)
      local texts = {}
      for _, m in ipairs(out.messages) do texts[#texts + 1] = m.content end
      -- the interrupted run's first step did not finish: only its input stayed
      assert.same({ "one", "three", "echo: three" }, texts)
    end)
  end)

  it("cancelling a queued run takes it out of the line: the runs behind it still run, in order", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      local first = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("one", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(first, "custom")
      local function enqueue(text)
        return assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input(text, { hold = false }),
          multitask_strategy = "enqueue" }))
      end
      local second, third, fourth = enqueue("two"), enqueue("three"), enqueue("four")
      assert.is_true(b:run_cancel(nil, t.thread_id, third.run_id, "interrupt"))
      assert.equal("interrupted", third.status)
      assert.is_true(b:run_cancel(nil, t.thread_id, first.run_id, "interrupt"))
      local out = b:run_output(fourth)
      assert.same({ "interrupted", "success", "interrupted", "success" },
        { first.status, second.status, third.status, fourth.status })
      local texts = {}
      for _, m in ipairs(out.messages) do texts[#texts + 1] = m.content end
      assert.same({ "one", "two", "echo: two", "four", "echo: four" }, texts)
      assert.equal("idle", b:thread_get(nil, t.thread_id).status)
    end)
  end)

  it("deleting a thread with queued runs ends them all; a new thread of the same id starts free", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, { thread_id = "q1" })
      local first = assert(b:run_create(nil, "q1", { assistant_id = "agent", input = input("one", { hold = 30 }),
        stream_mode = "custom" }))
      reach(first, "custom")
      local queued = assert(b:run_create(nil, "q1", { assistant_id = "agent", input = input("two", { hold = false }),
        multitask_strategy = "enqueue" }))
      assert.is_true(b:thread_delete(nil, t.thread_id))
      first:wait()
      queued:wait()
      assert.equal("interrupted", first.status)
      assert.equal("interrupted", queued.status)
      assert(b:thread_create(nil, { thread_id = "q1" }))
      local out = b:run_output(assert(b:run_create(nil, "q1", { assistant_id = "agent", input = input("fresh", { hold = false }) })))
      assert.equal("fresh", out.messages[1].content)
    end)
  end)

  it("multitask interrupt stops the running run (which ends with an error, not as a success); rollback takes the thread back to where it started", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      b:run_output(assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("base") })))
      local busy = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("lost", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(busy, "custom")
      local second = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("next", { hold = false }),
        multitask_strategy = "rollback" }))
      local out = b:run_output(second)
      assert.equal("interrupted", busy.status)
      -- the stopped run does not look like a success: its wait answers the
      -- error its stream ends with
      local stopped = b:run_output(busy).__error__
      assert.equal("UserRollback", stopped.error)
      assert.matches("multitask_strategy rollback", stopped.message)
      local evs = drain(busy)
      assert.equal("error", evs[#evs].event)
      local texts = {}
      for _, m in ipairs(out.messages) do texts[#texts + 1] = m.content end
      assert.same({ "base", "echo: base", "next", "echo: next" }, texts)
      local held = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("kept", { hold = 30 }),
        stream_mode = "custom", durability = "sync" }))
      reach(held, "custom")
      local third = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("after", { hold = false }),
        multitask_strategy = "interrupt" }))
      out = b:run_output(third)
      assert.equal("interrupted", held.status)
      assert.equal("UserInterrupt", b:run_output(held).__error__.error)
      texts = {}
      for _, m in ipairs(out.messages) do texts[#texts + 1] = m.content end
      assert.same({ "base", "echo: base", "next", "echo: next", "kept", "after", "echo: after" }, texts)
    end)
  end)

  it("runs a stateless run on a temporary thread that is gone afterwards", function()
    mg.run(function()
      local b = backend()
      local run = assert(b:run_create(nil, nil, { assistant_id = "agent", input = input("solo") }))
      local out = b:run_output(run)
      assert.equal("echo: solo", out.messages[2].content)
      assert.is_nil(b:thread_get(nil, run.thread_id))
      local again = assert(b:run(nil, nil, run.run_id))
      assert.equal(run.run_id, again.run_id)
      assert.equal("success", again.status)
      assert.equal(0, #b:thread_search(nil, {}))
    end)
  end)

  it("keeps threads, their state and history in the data directory across backends", function()
    local dir = tmp.dir("lgapi")
    local tid
    mg.run(function()
      local b = backend(dir)
      tid = b:thread_create(nil, { metadata = { k = "v" } }).thread_id
      b:run_output(assert(b:run_create(nil, tid, { assistant_id = "agent", input = input("remember") })))
    end)
    mg.run(function()
      local b = backend(dir)
      local th = assert(b:thread_get(nil, tid))
      assert.equal("v", th.metadata.k)
      assert.equal("echo: remember", th.values.messages[2].content)
      local st = b:thread_state(nil, tid)
      assert.same({ "think", "ticks", "review" }, st.values.steps)
      local hist = b:thread_history(nil, tid, { limit = 2 })
      assert.equal(2, #hist)
      assert.equal(st.checkpoint.checkpoint_id, hist[1].checkpoint.checkpoint_id)
      local old = b:thread_state(nil, tid, hist[2].checkpoint.checkpoint_id)
      assert.same({ "think", "ticks" }, old.values.steps)
    end)
  end)

  it("updates a thread's state as a node and refuses it while a run is going", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      local run = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("x", { ask = "?" }) }))
      b:run_output(run)
      local r = assert(b:thread_update_state(nil, t.thread_id, { values = { approved = "by hand" }, as_node = "review" }))
      assert.is_string(r.checkpoint.checkpoint_id)
      local st = b:thread_state(nil, t.thread_id)
      assert.equal("by hand", st.values.approved)
      assert.same({}, st.next)
      local _, bad = b:thread_update_state(nil, t.thread_id, { values = {}, as_node = "nope" })
      assert.equal(422, bad)
      local held = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("y", { hold = 30 }) }))
      local _, busy = b:thread_update_state(nil, t.thread_id, { values = { approved = "no" } })
      assert.equal(409, busy)
      b:run_cancel(nil, t.thread_id, held.run_id, "interrupt", true)
      assert.equal("interrupted", held.status)
    end)
  end)

  it("refuses a script whose graph does not keep the checkpointer build{} gets", function()
    mg.run(function()
      local path = tmp.file([[
        local mg = require "moongraph"
        return { build = function()
          local g = mg.graph {}
          g:add_node("a", function() return {} end)
          g:add_edge(mg.START, "a")
          return g:compile()
        end }
      ]], "nosaver.lua")
      local b, err = embedded.new { data = tmp.dir("lgapi"), scripts = { { name = "x", path = path } } }
      assert.is_nil(b)
      assert.matches("script 'x': build{checkpointer = saver} must compile the graph with that checkpointer", err)
    end)
  end)

  it("deletes a thread while its run is going: the run stops and the thread stays gone", function()
    local dir = tmp.dir("lgapi")
    mg.run(function()
      local b = backend(dir)
      local t = b:thread_create(nil, {})
      local run = assert(b:run_create(nil, t.thread_id, { assistant_id = "agent", input = input("x", { hold = 30 }),
        stream_mode = "custom" }))
      reach(run, "custom")
      assert.is_true(b:thread_delete(nil, t.thread_id))
      run:wait()
      assert.equal("interrupted", run.status)
      assert.is_nil(b:thread_get(nil, t.thread_id))
    end)
    mg.run(function()
      assert.equal(0, #backend(dir):thread_search(nil, {}))
    end)
  end)

  it("names a subgraph's events \"mode|namespace\" with stream_subgraphs, and leaves them out without", function()
    mg.run(function()
      local b = assert(embedded.new { data = tmp.dir("lgapi"),
        scripts = { { name = "nested", path = "spec/fixtures/lgapi_nested.lua" } } })
      local function custom_names(subgraphs)
        local run = assert(b:run_create(nil, nil, { assistant_id = "nested", input = {},
          stream_mode = { "custom" }, stream_subgraphs = subgraphs }))
        local out = {}
        for _, e in ipairs(drain(run)) do
          if e.event:match("^custom") then out[#out + 1] = e.event:gsub("|.*", "|ns") .. " " .. e.data.from end
        end
        return out
      end
      assert.same({ "custom|ns inner", "custom outer" }, custom_names(true))
      assert.same({ "custom outer" }, custom_names(false))
    end)
  end)

  it("refuses what it cannot do with 422 and unknown assistants with 404", function()
    mg.run(function()
      local b = backend()
      local t = b:thread_create(nil, {})
      local cases = {
        { 422, { assistant_id = "agent", stream_mode = "events" } },
        { 422, { assistant_id = "agent", input = { 1, 2 } } },
        { 422, { assistant_id = "agent", multitask_strategy = "merge" } },
        { 422, { assistant_id = "agent", interrupt_before = { "review" } } },
        { 422, { assistant_id = "agent", command = { ["goto"] = 3 } } },
        { 404, { assistant_id = "nope" } },
      }
      for _, c in ipairs(cases) do
        local run, st, msg = b:run_create(nil, t.thread_id, c[2])
        assert.is_nil(run)
        assert.equal(c[1], st)
        assert.is_string(msg)
      end
      assert.equal(0, #b:run_list(nil, t.thread_id, {}))
    end)
  end)
end)
