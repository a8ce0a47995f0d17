-- The parts of LangGraph's graph API a porting team reaches for beyond the
-- core engine, each checked against the behaviour LangGraph documents:
--   Graph API overview   https://docs.langchain.com/oss/python/langgraph/graph-api
--   Use the graph API    https://docs.langchain.com/oss/python/langgraph/use-graph-api
--   Streaming            https://docs.langchain.com/oss/python/langgraph/streaming
--   Interrupts           https://docs.langchain.com/oss/python/langgraph/interrupts
--   Runtime context      https://docs.langchain.com/oss/python/langgraph/graph-api#runtime-context
--   Overwrite            https://reference.langchain.com/python/langgraph/types/Overwrite

local mg = require "moongraph"
local G = require "moongraph.graph"
local llm_mod = require "moongraph.llm"
local testserver = require "testserver"
local START, END = G.START, G.END

local function collect(app, input, cfg)
  local events = {}
  for ev in app:stream(input, cfg) do events[#events + 1] = ev end
  return events
end

local function of_mode(events, mode)
  local out = {}
  for _, ev in ipairs(events) do if ev.mode == mode then out[#out + 1] = ev end end
  return out
end

describe("Overwrite (bypasses a key's reducer for one write)", function()
  -- "Overwrite: bypasses the reducer and replaces the entire value"
  it("replaces an append key's value instead of appending", function()
    local g = G.new { messages = "append" }
    g:add_sequence {
      { "a", function() return { messages = { "a" } } end },
      { "b", function() return { messages = mg.Overwrite { "b" } } end },
    }
    g:add_edge(START, "a")
    local out = mg.run(function() return g:compile():invoke { messages = { "start" } } end)
    assert.same({ "b" }, out.messages)
  end)

  it("keeps its meaning as the plain table {__overwrite__ = v} (a JSON update)", function()
    local g = G.new { n = "add" }
    g:add_node("set", function() return { n = { __overwrite__ = 10 } } end)
    g:add_edge(START, "set")
    local out = mg.run(function() return g:compile():invoke { n = 5 } end)
    assert.equal(10, out.n)
  end)

  -- "Receiving multiple Overwrite values for the same channel in a single
  -- super-step will raise an InvalidUpdateError."
  it("two Overwrites of one key in a step fail the run, naming the key", function()
    local g = G.new { items = "append" }
    g:add_node("fan", function() end)
    g:add_node("x", function() return { items = mg.Overwrite { 1 } } end)
    g:add_node("y", function() return { items = mg.Overwrite { 2 } } end)
    g:add_edge(START, "fan"):add_edge("fan", "x"):add_edge("fan", "y")
    local out, err = mg.run(function() return g:compile():invoke { items = {} } end)
    assert.is_nil(out)
    assert.matches("state key 'items' got two Overwrites in the same step", tostring(err))
  end)

  it("Overwrite(nil) is a misuse", function()
    assert.has_error(function() mg.Overwrite(nil) end,
      "bad argument #1 to 'Overwrite': a value expected (nil cannot be stored)")
  end)
end)

describe("Command{graph = PARENT}", function()
  -- "Navigate to a node in a parent graph: set graph=Command.PARENT"
  local function parent_with_child()
    local child = G.new { log = "append" }
    child:add_node("inner", function()
      return mg.Command { graph = mg.PARENT, to = "after", update = { log = { "from child" } } }
    end)
    child:add_node("never", function() return { log = { "never" } } end)
    child:add_edge(START, "inner"):add_edge("inner", "never")
    local sub = child:compile { name = "child" }

    local g = G.new { log = "append" }
    -- as in LangGraph, the nodes a Command may go to are declared
    g:add_node("sub", sub, { destinations = { "after" } })
    g:add_node("after", function() return { log = { "after" } } end)
    g:add_edge(START, "sub")
    return g:compile()
  end

  it("routes the parent graph and applies the update there; the subgraph ends", function()
    local out = mg.run(function() return parent_with_child():invoke { log = {} } end)
    assert.same({ "from child", "after" }, out.log)
  end)

  it("from a graph that is not a subgraph is an error that says so", function()
    local g = G.new()
    g:add_node("a", function() return mg.Command { graph = mg.PARENT, to = "a" } end)
    g:add_edge(START, "a")
    local out, err = mg.run(function() return g:compile():invoke {} end)
    assert.is_nil(out)
    assert.matches("its graph is not running as a subgraph", tostring(err))
  end)

  it("any other graph value is a misuse", function()
    assert.has_error(function() mg.Command { graph = "elsewhere" } end,
      "bad argument #1 to 'Command': graph must be mg.PARENT (or absent: this graph)")
  end)
end)

describe("add_sequence", function()
  -- "builder.add_sequence([step_1, step_2, step_3])"
  it("adds the nodes and the edges between them, in order", function()
    local g = G.new { trail = "append" }
    g:add_sequence {
      { "one", function() return { trail = { 1 } } end },
      { "two", function() return { trail = { 2 } } end },
      { name = "three", run = function() return { trail = { 3 } } end },
    }
    g:add_edge(START, "one")
    local out = mg.run(function() return g:compile():invoke { trail = {} } end)
    assert.same({ 1, 2, 3 }, out.trail)
  end)

  it("an entry without a name is a misuse", function()
    local g = G.new()
    assert.has_error(function() g:add_sequence { { run = function() end } } end,
      "bad argument #1 to 'add_sequence': entry 1 has no name")
    assert.has_error(function() g:add_sequence {} end,
      "bad argument #1 to 'add_sequence': non-empty list of nodes expected")
  end)
end)

describe("input and output schemas", function()
  -- "Define input and output schemas": the input schema filters what the
  -- graph takes, the output schema what it returns; other keys are private.
  local function build()
    local g = G.graph({ "question", "notes", "answer" }, { input = { "question" }, output = { "answer" } })
    g:add_node("think", function(s) return { notes = "about " .. s.question } end)
    g:add_node("answer", function(s) return { answer = s.notes .. "!" } end)
    g:add_edge(START, "think"):add_edge("think", "answer")
    return g:compile()
  end

  it("invoke takes only the input keys and returns only the output keys", function()
    local out = mg.run(function()
      return build():invoke { question = "bins", notes = "ignored", answer = "ignored" }
    end)
    assert.same({ answer = "about bins!" }, out)
  end)

  it("values events show only the output keys", function()
    local events = mg.run(function()
      return collect(build(), { question = "q" }, { stream_mode = "values" })
    end)
    assert.is_true(#events >= 2)
    for _, ev in ipairs(events) do
      assert.is_nil(ev.data.notes)
      assert.is_nil(ev.data.question)
    end
    assert.same({ answer = "about q!" }, events[#events].data)
  end)

  it("an unknown option or an empty key list is a misuse", function()
    assert.has_error(function() G.graph({}, { inputs = { "a" } }) end,
      "bad argument #2 to 'graph': unknown option 'inputs' (expected input, output)")
    assert.has_error(function() G.graph({}, { output = {} }) end,
      "bad argument #2 to 'graph': output is empty")
  end)
end)

describe("stream modes", function()
  it("checkpoints: each checkpoint as saved, in the form of get_state", function()
    local g = G.new()
    g:add_sequence { { "a", function() return { n = 1 } end }, { "b", function() return { n = 2 } end } }
    g:add_edge(START, "a")
    local app = g:compile { checkpointer = mg.checkpoint.memory() }
    local events, snap = mg.run(function()
      local evs = collect(app, { n = 0 }, { thread_id = "cp", stream_mode = "checkpoints" })
      return evs, app:get_state { thread_id = "cp" }
    end)
    local cps = of_mode(events, "checkpoints")
    assert.is_true(#cps >= 3)
    local last = cps[#cps].data
    assert.equal(snap.config.checkpoint_id, last.config.checkpoint_id)
    assert.same({}, last.next)
    assert.equal(2, last.values.n)
    assert.same({ "b" }, cps[#cps - 1].data.next)
    -- each names the one before it
    assert.equal(cps[#cps - 1].data.config.checkpoint_id, last.parent_config.checkpoint_id)
  end)

  it("subgraphs = false leaves out the subgraphs' events; true keeps them", function()
    local child = G.new()
    child:add_node("inner", function(_, ctx) ctx.emit { from = "inner" }; return { x = 1 } end)
    child:add_edge(START, "inner")
    local g = G.new()
    g:add_node("sub", child:compile { name = "child" })
    g:add_node("outer", function(_, ctx) ctx.emit { from = "outer" } end)
    g:add_edge(START, "sub"):add_edge("sub", "outer")
    local app = g:compile()
    local only_root, all = mg.run(function()
      return collect(app, {}, { stream_mode = { "custom", "updates" }, subgraphs = false }),
             collect(app, {}, { stream_mode = { "custom", "updates" }, subgraphs = true })
    end)
    assert.is_true(#only_root > 0)
    for _, ev in ipairs(only_root) do assert.equal("", ev.ns) end
    local nested = 0
    for _, ev in ipairs(all) do if ev.ns ~= "" then nested = nested + 1 end end
    assert.is_true(nested > 0)
  end)

  it("stream_mode and modes name the same option", function()
    local g = G.new()
    g:add_node("a", function() return { n = 1 } end)
    g:add_edge(START, "a")
    local a, b = mg.run(function()
      return collect(g:compile(), {}, { stream_mode = "updates" }), collect(g:compile(), {}, { modes = "updates" })
    end)
    assert.equal(1, #a)
    assert.same(a[1].data, b[1].data)
  end)
end)

describe("an LLM call inside a node streams in messages mode without a callback", function()
  local server
  setup(function() server = testserver.start() end)
  teardown(function() if server then server:stop() end end)

  -- "Streaming LLM tokens: ... from any part of your graph, including
  -- inside nodes" — the tokens come tagged with the node that made the call.
  it("tags each token with the node, its task id and namespace", function()
    local client = assert(llm_mod.new { base_url = server.url .. "/v1", api_key = "k", model = "m" })
    local g = G.new()
    g:add_node("writer", function()
      local r = assert(client:chat { messages = { { role = "user", content = "stream: three little words" } } })
      return { text = r.content }
    end)
    g:add_edge(START, "writer")
    local events, out = mg.run(function()
      local evs = collect(g:compile(), {}, { stream_mode = { "messages", "values" } })
      return evs, evs[#evs].data
    end)
    local tokens = of_mode(events, "messages")
    assert.is_true(#tokens >= 2, "expected several tokens")
    local text = {}
    for _, ev in ipairs(tokens) do
      assert.equal("writer", ev.node)
      assert.matches(":writer$", ev.task_id)
      assert.equal("", ev.ns)
      text[#text + 1] = ev.data
    end
    assert.equal(out.text, table.concat(text))
  end)

  it("a call with stream = false does not stream", function()
    local client = assert(llm_mod.new { base_url = server.url .. "/v1", api_key = "k", model = "m" })
    local g = G.new()
    g:add_node("quiet", function()
      local r = assert(client:chat { messages = { { role = "user", content = "stream: a b c" } }, stream = false })
      return { text = r.content }
    end)
    g:add_edge(START, "quiet")
    local events = mg.run(function() return collect(g:compile(), {}, { stream_mode = { "messages", "values" } }) end)
    assert.equal(0, #of_mode(events, "messages"))
    -- and the call was made: the node stored its answer
    local values = of_mode(events, "values")
    assert.is_true(#values > 0)
    local text = values[#values].data.text
    assert.is_string(text)
    assert.is_true(#text > 0)
  end)
end)

describe("interrupt() as LangGraph spells it", function()
  -- "interrupt(value) pauses the graph; Command(resume=...) resumes it and
  -- interrupt returns the resume value."
  it("pauses the node and returns the resume value when resumed", function()
    local g = G.new()
    g:add_node("ask", function()
      local answer = mg.interrupt { question = "which bin?" }
      return { answer = answer }
    end)
    g:add_edge(START, "ask"):add_edge("ask", END)
    local app = g:compile { checkpointer = mg.checkpoint.memory() }
    local paused, done = mg.run(function()
      local p = app:invoke({}, { thread_id = "i" })
      return p, app:invoke(mg.Command { resume = "glass" }, { thread_id = "i" })
    end)
    assert.equal("which bin?", paused.__interrupt__[1].value.question)
    assert.equal("glass", done.answer)
  end)

  it("outside a node is an error that says where to call it", function()
    local ok, err = pcall(mg.interrupt, "x")
    assert.is_false(ok)
    assert.matches("interrupt: not inside a graph node", err)
  end)
end)

describe("runtime context and store in ctx", function()
  -- "Runtime context: pass information into a run that is not part of the
  -- state (a user id, a database connection)", read-only in nodes.
  it("ctx.context is the run's context, read-only", function()
    local seen, write_err
    local g = G.new()
    g:add_node("a", function(_, ctx)
      seen = ctx.context.user_id
      local ok, err = pcall(function() ctx.context.user_id = "other" end)
      write_err = not ok and err
      return { done = true }
    end)
    g:add_edge(START, "a")
    mg.run(function() return g:compile():invoke({}, { context = { user_id = "u1" } }) end)
    assert.equal("u1", seen)
    assert.matches("ctx.context is read%-only", tostring(write_err))
  end)

  it("ctx.store is the store the graph was compiled with, also inside its subgraphs", function()
    local store = { name = "the store" }
    local seen = {}
    local child = G.new()
    child:add_node("inner", function(_, ctx) seen.inner = ctx.store; return { y = 1 } end)
    child:add_edge(START, "inner")
    local g = G.new()
    g:add_node("outer", function(_, ctx) seen.outer = ctx.store; return { x = 1 } end)
    g:add_node("sub", child:compile())
    g:add_edge(START, "outer"):add_edge("outer", "sub")
    mg.run(function() return g:compile { store = store }:invoke {} end)
    assert.equal(store, seen.outer)
    assert.equal(store, seen.inner)
  end)
end)
