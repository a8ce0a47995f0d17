-- The service contract (moongraph.service): what every storage × executor
-- combination must do, as a reusable set of busted specs. A spec runs it
-- with a factory:
--
--   require("service_contract")("files × tasks", function() return ctx end, _ENV)
--
-- make() returns (inside a moongraph task) { svc = service, user = a user
-- of its own (so combinations sharing a database see only their threads),
-- reopen = fn() -> a new service over the same storage (the old one
-- closed, as after a restart), close = fn }. The service's one script is
-- spec/fixtures/lgapi_agent.lua as "agent".
local mg = require "moongraph"
local flows = require "langgraph_flows"

local drain, reach, names = flows.drain, flows.reach, flows.event_names

local function input(text, extra)
  local t = { messages = { { role = "user", content = text } } }
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

local function texts(out)
  local t = {}
  for _, m in ipairs(out.messages or {}) do t[#t + 1] = m.content end
  return t
end

return function(name, make, env)
  local describe, it, assert = env.describe, env.it, env.assert

  describe(name .. " service", function()
    local function with(fn)
      return mg.run(function()
        local ctx = make()
        local ok, err = pcall(fn, ctx.svc, ctx.user, ctx)
        ctx.close()
        if not ok then error(err, 0) end
      end)
    end

    local function status(svc, user, run)
      return assert(svc:run(user, run.stateless and nil or run.thread_id, run.run_id)).status
    end

    it("lists its script as an assistant whose id is its name", function()
      with(function(svc)
        local list, total = svc:assistants_search {}
        assert.equal(1, total)
        assert.equal("agent", list[1].assistant_id)
        assert.equal(404, select(2, svc:assistant("nope")))
      end)
    end)

    it("creates, gets, patches, searches, counts and deletes threads; a second with the same id is refused", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, { metadata = { topic = "a" } }))
        assert.equal("idle", t.status)
        assert.equal(409, select(2, svc:thread_create(user, { thread_id = t.thread_id })))
        assert.equal(t.thread_id, svc:thread_create(user, { thread_id = t.thread_id, if_exists = "do_nothing" }).thread_id)
        local t2 = assert(svc:thread_create(user, { metadata = { topic = "b" } }))
        assert.equal("x", assert(svc:thread_patch(user, t2.thread_id, { metadata = { extra = "x" } })).metadata.extra)
        assert.equal("b", svc:thread_get(user, t2.thread_id).metadata.topic)
        local page, total = svc:thread_search(user, { metadata = { topic = "a" } })
        assert.equal(1, total)
        assert.equal(t.thread_id, page[1].thread_id)
        assert.equal(2, svc:thread_count(user, {}))
        local sorted = svc:thread_search(user, { sort_by = "created_at", sort_order = "asc" })
        assert.same({ t.thread_id, t2.thread_id }, { sorted[1].thread_id, sorted[2].thread_id })
        assert.is_true(svc:thread_delete(user, t.thread_id))
        assert.equal(404, select(2, svc:thread_get(user, t.thread_id)))
        assert.equal(1, svc:thread_count(user, {}))
      end)
    end)

    it("shows a user only their own threads and runs: another's answer 404", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        local run = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("mine") }))
        svc:run_output(run)
        local other = user .. "-other"
        assert.equal(404, select(2, svc:thread_get(other, t.thread_id)))
        assert.equal(404, select(2, svc:run(other, t.thread_id, run.run_id)))
        assert.equal(404, select(2, svc:run_create(other, t.thread_id, { assistant_id = "agent", input = input("x") })))
        assert.equal(0, svc:thread_count(other, {}))
        assert.equal(404, select(2, svc:thread_delete(other, t.thread_id)))
      end)
    end)

    it("streams a run: metadata first, then its events; the thread's state and the run's record follow", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        local run = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("hello"),
          stream_mode = { "values", "updates", "custom" } }))
        local evs = drain(run)
        assert.equal("metadata", evs[1].event)
        assert.equal(run.run_id, evs[1].data.run_id)
        local seen = {}
        for _, e in ipairs(names(evs)) do seen[e] = true end
        assert.is_true(seen.values and seen.updates and seen.custom)
        assert.same({ "hello", "echo: hello" }, texts(svc:run_output(run)))
        assert.equal("success", status(svc, user, run))
        local th = svc:thread_get(user, t.thread_id)
        assert.equal("idle", th.status)
        assert.equal("agent", th.metadata.graph_id)
        assert.same({ "think", "ticks", "review" }, th.values.steps)
        assert.same({ "hello", "echo: hello" }, texts(assert(svc:thread_state(user, t.thread_id)).values))
        local list = assert(svc:run_list(user, t.thread_id, {}))
        assert.equal(1, #list)
        assert.equal("success", list[1].status)
        assert.equal("agent", list[1].assistant_id)
      end)
    end)

    it("pauses at an interrupt and resumes with a command", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        local run = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("q", { ask = "ok?" }) }))
        local out = svc:run_output(run)
        assert.equal("ok?", out.__interrupt__[1].value.question)
        assert.equal("interrupted", svc:thread_get(user, t.thread_id).status)
        local again = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", command = { resume = "yes" } }))
        assert.equal("yes", svc:run_output(again).approved)
        assert.equal("idle", svc:thread_get(user, t.thread_id).status)
      end)
    end)

    it("reports a failed run: an error event, run status error, thread status error", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        local run = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("x", { fail = "broken" }) }))
        local evs = drain(run)
        assert.equal("error", evs[#evs].event)
        assert.equal("GraphError", svc:run_output(run).__error__.error)
        assert.equal("error", status(svc, user, run))
        assert.equal("error", svc:thread_get(user, t.thread_id).status)
      end)
    end)

    it("multitask reject answers 409 while the thread is busy; enqueue runs after the first", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        local first = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("one", { hold = 0.5 }),
          stream_mode = { "values", "custom" } }))
        reach(first, "custom")
        assert.equal("busy", svc:thread_get(user, t.thread_id).status)
        assert.equal("running", assert(svc:run_list(user, t.thread_id, {}))[1].status)
        assert.equal(409, select(2, svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("two") })))
        local second = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("two"),
          multitask_strategy = "enqueue" }))
        assert.same({ "one", "echo: one", "two", "echo: two" }, texts(svc:run_output(second)))
        assert.equal("success", status(svc, user, first))
      end)
    end)

    it("cancels a running run: it ends interrupted with UserInterrupt, and the thread is free", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        local run = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("long", { hold = 30 }),
          stream_mode = { "values", "custom" } }))
        reach(run, "custom")
        assert.is_true(svc:run_cancel(user, t.thread_id, run.run_id, "interrupt", true))
        assert.equal("UserInterrupt", svc:run_output(run).__error__.error)
        assert.equal("interrupted", status(svc, user, run))
        local next_ = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("next") }))
        assert.is_nil(svc:run_output(next_).__error__)
      end)
    end)

    it("runs a stateless run on a temporary thread that is gone afterwards", function()
      with(function(svc, user)
        local run = assert(svc:run_create(user, nil, { assistant_id = "agent", input = input("solo") }))
        assert.same({ "solo", "echo: solo" }, texts(svc:run_output(run)))
        assert.equal(404, select(2, svc:thread_get(user, run.thread_id)))
        assert.equal("success", status(svc, user, run))
        assert.equal(0, svc:thread_count(user, {}))
      end)
    end)

    it("deletes a finished run (a going one is refused with 409) and a thread with its runs and checkpoints", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        local run = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("a", { hold = 0.5 }),
          stream_mode = { "values", "custom" } }))
        reach(run, "custom")
        assert.equal(409, select(2, svc:run_delete(user, t.thread_id, run.run_id)))
        svc:run_output(run)
        assert.is_true(svc:run_delete(user, t.thread_id, run.run_id))
        assert.equal(404, select(2, svc:run(user, t.thread_id, run.run_id)))
        local r2 = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("b") }))
        svc:run_output(r2)
        assert.is_true(svc:thread_delete(user, t.thread_id))
        assert.equal(404, select(2, svc:run(user, t.thread_id, r2.run_id)))
        assert.is_nil(svc.saver:get { thread_id = t.thread_id })
      end)
    end)

    it("keeps threads, runs and a finished run's events across a restart", function()
      with(function(svc, user, ctx)
        local t = assert(svc:thread_create(user, { metadata = { keep = "me" } }))
        local run = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("kept"),
          stream_mode = { "values", "custom" } }))
        local before = names(drain(run))
        svc:run_output(run)
        svc = ctx.reopen()
        assert.equal("me", assert(svc:thread_get(user, t.thread_id)).metadata.keep)
        local again = assert(svc:run(user, t.thread_id, run.run_id))
        assert.equal("success", again.status)
        assert.same(before, names(drain(again)))
        assert.same({ "kept", "echo: kept" }, texts(svc:run_output(again)))
        assert.equal(1, #assert(svc:run_list(user, t.thread_id, {})))
        local next_ = assert(svc:run_create(user, t.thread_id, { assistant_id = "agent", input = input("more") }))
        assert.same({ "kept", "echo: kept", "more", "echo: more" }, texts(svc:run_output(next_)))
      end)
    end)

    it("refuses what it cannot do: 422 for a bad field, 404 for an unknown assistant or thread", function()
      with(function(svc, user)
        local t = assert(svc:thread_create(user, {}))
        assert.equal(422, select(2, svc:run_create(user, t.thread_id, { assistant_id = "agent",
          multitask_strategy = "sometimes" })))
        assert.equal(404, select(2, svc:run_create(user, t.thread_id, { assistant_id = "nope", input = input("x") })))
        assert.equal(404, select(2, svc:run_create(user, "no-such-thread", { assistant_id = "agent", input = input("x") })))
        assert.equal(422, select(2, svc:thread_create(user, { thread_id = "bad id!" })))
        local _, st, msg = svc:run_cancel(user, t.thread_id, "no-such-run")
        assert.equal(404, st)
        assert.matches("not found", msg)
      end)
    end)
  end)
end
