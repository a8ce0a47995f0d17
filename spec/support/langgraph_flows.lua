-- What the scenarios of spec/support/node/langgraph_client.mjs must give on
-- either backend of `moongraph serve` (the embedded one in
-- spec/api_langgraph_sdk_spec.lua, the distributed one in
-- spec/api_langgraph_distributed_spec.lua): one check per scenario, given
-- the scenario's result r.
--
-- Event ids differ by backend (a count per run, or Redis stream entry
-- ids): the checks that look at them take `follows(a, b)`, true when id b
-- comes right after (or, for stream entry ids, after) id a.
local assert = require "luassert"

local _M = {}

-- the data of the events named `name`
function _M.events(list, name)
  local out = {}
  for _, p in ipairs(list) do
    if p.event == name then out[#out + 1] = p.data end
  end
  return out
end
local events = _M.events

function _M.event_names(list)
  local out = {}
  for i, p in ipairs(list) do out[i] = p.event end
  return out
end

function _M.contents(messages)
  local out = {}
  for i, m in ipairs(messages) do out[i] = m.content end
  return out
end
local contents = _M.contents

-- The events of a backend's run (moongraph.api.embedded or
-- langgraph_distributed, driven directly) until it ends, decoded:
-- { {event =, data =, seq =}, ... }
function _M.drain(run)
  local json = require "moongraph.json"
  local out, cursor = {}, run:cursor(nil)
  while true do
    local evs, done = run:events_after(cursor, 30)
    for _, e in ipairs(evs) do
      cursor = e.seq
      out[#out + 1] = { event = e.event, data = json.decode(e.data), seq = e.seq }
    end
    if done then return out end
    assert(#evs > 0, "the run neither ended nor sent an event in 30 s")
  end
end

-- Wait until a backend's run has sent an event named `name` (it has
-- reached that point).
function _M.reach(run, name)
  local cursor = run:cursor(nil)
  while true do
    local evs, done = run:events_after(cursor, 30)
    for _, e in ipairs(evs) do
      cursor = e.seq
      if e.event == name then return end
    end
    assert(not done, "the run ended before sending a " .. name .. " event")
    assert(#evs > 0, "no " .. name .. " event in 30 s")
  end
end

local check = {}
_M.check = check

function check.assistants(r)
  assert.equal(1, #r.list)
  assert.equal("agent", r.list[1].assistant_id)
  assert.equal("agent", r.one.graph_id)
  local ids = {}
  for _, n in ipairs(r.graph.nodes) do ids[#ids + 1] = n.id end
  assert.same({ "__start__", "think", "ticks", "review", "__end__" }, ids)
  assert.equal(4, #r.graph.edges)
  assert.equal(404, r.missing.status)
end

function check.threads(r)
  local id = r.created.thread_id
  assert.matches("^%x+%-%x+%-4%x+%-%x+%-%x+$", id)
  assert.equal("idle", r.created.status)
  assert.equal(id, r.got.thread_id)
  assert.equal(1, #r.found)
  assert.equal(id, r.found[1].thread_id)
  assert.same({ team = "blue", more = 1 }, r.updated.metadata)
  assert.equal(404, r.gone.status)
end

function check.stream_modes(r, follows)
  for mode, list in pairs(r) do
    assert.equal("metadata", list[1].event, mode)
    assert.is_string(list[1].data.run_id, mode)
    for i = 2, #list do assert.is_true(follows(list[i - 1].id, list[i].id), mode .. " event ids") end
  end
  local values = events(r.values, "values")
  assert.equal(4, #values)
  assert.same({ "hello world", "echo: hello world" }, contents(values[4].messages))
  assert.same({ "think", "ticks", "review" }, values[4].steps)
  local updates = events(r.updates, "updates")
  assert.same({ "think", "ticks", "review" }, { (next(updates[1])), (next(updates[2])), (next(updates[3])) })
  assert.same({ "echo: hello world" }, contents(updates[1].think.messages))
  local tokens = {}
  for _, m in ipairs(events(r["messages-tuple"], "messages")) do
    tokens[#tokens + 1] = m[1].content
    assert.equal("AIMessageChunk", m[1].type)
    assert.equal("think", m[2].langgraph_node)
  end
  assert.equal("echo: hello world ", table.concat(tokens))
  assert.same({ { progress = "thinking" } }, events(r.custom, "custom"))
  local kinds = {}
  for _, d in ipairs(events(r.debug, "debug")) do kinds[d.type] = (kinds[d.type] or 0) + 1 end
  assert.same({ checkpoint = 4, task = 3, task_result = 3 }, kinds)
  assert.same({ "metadata", "values", "custom", "messages", "messages", "messages", "updates", "values",
    "updates", "values", "updates", "values" }, _M.event_names(r.all))
end

function check.state(r)
  assert.same({ "keep me", "echo: keep me" }, contents(r.waited.messages))
  assert.same(r.waited, r.state.values)
  assert.same({}, r.state.next)
  assert.equal(4, #r.history)
  assert.equal(r.state.checkpoint.checkpoint_id, r.history[1].checkpoint.checkpoint_id)
  -- the run's metadata is in each of its checkpoints'
  for _, snap in ipairs(r.history) do assert.equal("spec", snap.metadata.team) end
  assert.same({ "think", "ticks" }, r.older.values.steps)
  assert.is_string(r.update.checkpoint.checkpoint_id)
  assert.equal("by hand", r.after.values.note)
  assert.equal(r.update.checkpoint.checkpoint_id, r.after.checkpoint.checkpoint_id)
end

function check.interrupt_resume(r)
  local values = events(r.streamed, "values")
  assert.same({ __interrupt__ = { { id = "3:review/1", value = { question = "ship it?" } } } }, values[#values])
  assert.equal("interrupted", r.paused.status)
  assert.same({ "review" }, r.state.next)
  assert.equal("ship it?", r.state.interrupts[1].value.question)
  assert.equal("ship it?", r.state.tasks[1].interrupts[1].value.question)
  assert.equal("yes", r.resumed.approved)
  assert.same({ "think", "ticks", "review" }, r.resumed.steps)
  assert.equal("idle", r.done.status)
end

function check.background(r)
  assert.equal("pending", r.run.status)
  assert.same({ "later", "echo: later" }, contents(r.joined.messages))
  assert.equal("success", r.fetched.status)
  assert.equal(1, #r.list)
  assert.equal(r.run.run_id, r.list[1].run_id)
  assert.equal("metadata", r.replay[1].event)
  assert.same(r.joined, events(r.replay, "values")[4])
end

function check.join_after_drop(r, follows)
  local ticks = {}
  for _, d in ipairs(events(r.first, "custom")) do if d.tick then ticks[#ticks + 1] = d.tick end end
  assert.same({ 1, 2 }, ticks)
  assert.equal(r.first[#r.first].id, r.lastEventId)
  for _, d in ipairs(events(r.rest, "custom")) do ticks[#ticks + 1] = d.tick end
  assert.same({ 1, 2, 3, 4, 5, 6 }, ticks)
  assert.is_true(follows(r.lastEventId, r.rest[1].id))
  assert.same({ "think", "ticks", "review" }, r.state.values.steps)
end

function check.multitask(r)
  assert.equal(409, r.rejected.status)
  assert.equal(409, r.rejectedStream.status)
  assert.equal("interrupted", r.cancelled.status)
  assert.equal("success", r.after.status)
  assert.same({ "slow", "third", "echo: third" }, contents(r.third.messages))
end

function check.stateless(r)
  assert.same({ "no thread", "echo: no thread" }, contents(r.waited.messages))
  assert.same({ "metadata", "updates", "updates", "updates" }, _M.event_names(r.streamed))
end

function check.users(r)
  assert.equal(404, r.theirs.status)
  assert.equal(404, r.theirState.status)
  assert.equal(404, r.theirRun.status)
  assert.same({}, r.theirSearch)
  assert.equal(1, #r.mySearch)
  assert.equal(401, r.noKey.status)
  assert.equal(401, r.badKey.status)
end

return _M
