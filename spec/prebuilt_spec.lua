local mg = require "moongraph"
local llm = require "moongraph.llm"
local mcp = require "moongraph.mcp"
local cjson = require "cjson"
local testserver = require "testserver"
local tmp = require "tmp"

local function call(id, name, args)
  return { id = id, type = "function", ["function"] = { name = name, arguments = cjson.encode(args) } }
end

describe("mg.prebuilt", function()
  local srv, client
  setup(function()
    srv = testserver.start()
    client = assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m1", max_retries = 0 })
  end)
  teardown(function() srv:stop() end)
  before_each(function() mg.run(function() srv:reset() end) end)

  local function script(replies) mg.run(function() srv:script(replies) end) end
  local function requests() return mg.run(function() return srv:requests("/v1/chat/completions") end) end

  -- two tools that each wait for the other to have started: they only
  -- finish if the tool node runs them at the same time
  local function meeting_tools(log)
    local arrived, met = 0, mg.queue()
    local function meet(name)
      return function(args)
        log[#log + 1] = "start " .. name
        arrived = arrived + 1
        if arrived == 2 then met:put(true) met:put(true) end
        local ok = met:get(2)
        if not ok then return nil, name .. " ran alone" end
        log[#log + 1] = "end " .. name
        return name .. ":" .. args.x
      end
    end
    local schema = { type = "object", required = { "x" }, properties = { x = { type = "string" } } }
    return {
      { name = "a", description = "tool a", parameters = schema, fn = meet("a") },
      { name = "b", description = "tool b", parameters = schema, fn = meet("b") },
    }
  end

  it("runs the tool calls of one reply in parallel and returns the results in call order", function()
    local log = {}
    script {
      { content = cjson.null, tool_calls = { call("c1", "b", { x = "1" }), call("c2", "a", { x = "2" }) } },
      { content = "done" },
    }
    local agent = mg.prebuilt.react_agent { llm = client, tools = meeting_tools(log), prompt = "be brief" }
    local out = assert(mg.run(function() return agent:invoke { messages = { "go" } } end))
    local m = out.messages
    assert.equal(5, #m)                        -- user, assistant(calls), tool, tool, assistant
    assert.same({ "tool", "c1", "b:1" }, { m[3].role, m[3].tool_call_id, m[3].content })
    assert.same({ "tool", "c2", "a:2" }, { m[4].role, m[4].tool_call_id, m[4].content })
    assert.equal("done", m[5].content)
    -- both started before either ended
    assert.same({ "start b", "start a" }, { log[1], log[2] })
    -- the second request carried the system prompt, the calls and both results
    local body = cjson.decode(requests()[2].body)
    assert.equal("system", body.messages[1].role)
    assert.equal("be brief", body.messages[1].content)
    assert.equal("c1", body.messages[3].tool_calls[1].id)
    assert.equal("b", body.messages[3].tool_calls[1]["function"].name)
    assert.same({ "tool", "c1", "b:1" }, { body.messages[4].role, body.messages[4].tool_call_id, body.messages[4].content })
    assert.equal(2, #body.tools)
  end)

  it("stops when the model answers without tool calls", function()
    script { { content = "hello" } }
    local agent = mg.prebuilt.react_agent { llm = client, tools = meeting_tools({}) }
    local out = assert(mg.run(function() return agent:invoke { messages = { "hi" } } end))
    assert.equal(2, #out.messages)
    assert.equal("hello", out.messages[2].content)
    assert.equal(1, #requests())
  end)

  it("reports a failing tool, bad arguments and an unknown tool to the model", function()
    script {
      { content = cjson.null, tool_calls = {
        call("c1", "fails", {}), call("c2", "echo", { wrong = 1 }), call("c3", "nope", {}),
        call("c4", "echo", { text = "ok" }) } },
      { content = "sorry" },
    }
    local tools = {
      { name = "fails", description = "always fails", fn = function() error("disk on fire") end },
      { name = "echo", description = "echo", parameters = { type = "object", required = { "text" },
          properties = { text = { type = "string" } }, additionalProperties = false },
        fn = function(args) return { echoed = args.text } end },
    }
    local agent = mg.prebuilt.react_agent { llm = client, tools = tools }
    local out = assert(mg.run(function() return agent:invoke { messages = { "go" } } end))
    local m = out.messages
    assert.matches("^Error: .*disk on fire.*Please fix your mistakes", m[3].content)
    assert.matches('missing required property "text"', m[4].content)
    assert.matches("nope is not a valid tool, try one of %[fails, echo%]", m[5].content)
    assert.same({ echoed = "ok" }, cjson.decode(m[6].content))
    assert.equal("sorry", m[7].content)
  end)

  it("fails clearly when the model still asks for tools after max_steps", function()
    local again = { content = cjson.null, tool_calls = { call("c", "echo", { text = "x" }) } }
    script { again, again, again, again }
    local tools = { { name = "echo", description = "echo", fn = function(a) return a.text end } }
    local agent = mg.prebuilt.react_agent { llm = client, tools = tools, max_steps = 3 }
    local out, err = mg.run(function() return agent:invoke { messages = { "loop" } } end)
    assert.is_nil(out)
    assert.matches("still asks for tools after max_steps = 3 model calls", err)
    assert.equal(3, #requests())
  end)

  it("streams the model's tokens in messages mode", function()
    script { { content = cjson.null, tool_calls = { call("c1", "echo", { text = "x" }) } },
             { content = "the final answer" } }
    local tools = { { name = "echo", description = "echo", fn = function(a) return a.text end } }
    local agent = mg.prebuilt.react_agent { llm = client, tools = tools }
    local tokens, nodes = {}, {}
    mg.run(function()
      for ev in agent:stream({ messages = { "go" } }, { stream_mode = "messages" }) do
        if ev.mode == "messages" then
          tokens[#tokens + 1] = ev.data
          nodes[ev.node] = true
        end
      end
    end)
    assert.equal("the final answer", table.concat(tokens))
    assert.same({ agent = true }, nodes)
  end)

  it("tool_node runs the calls of the last assistant message", function()
    local node = mg.prebuilt.tool_node {
      { name = "up", description = "upper", fn = function(a) return a.s:upper() end },
    }
    local out = mg.run(function()
      return node({ messages = { { role = "user", content = "x" },
        { role = "assistant", tool_calls = { { id = "1", name = "up", args = { s = "ab" } },
                                             { id = "2", ["function"] = { name = "up", arguments = '{"s":"cd"}' } } } } } }, {})
    end)
    assert.same({ { role = "tool", tool_call_id = "1", name = "up", content = "AB" },
                  { role = "tool", tool_call_id = "2", name = "up", content = "CD" } }, out.messages)
  end)

  it("uses MCP tools from list_tools as they are", function()
    local file = tmp.file([[return { tools = {
      { name = "add", description = "add", inputSchema = { type = "object", required = { "a", "b" },
          properties = { a = { type = "number" }, b = { type = "number" } } },
        handler = function(a) return tostring(a.a + a.b) end },
      { name = "bad", description = "fails", handler = function() return nil, "no such thing" end } } }]],
      "tools.lua")
    script {
      { content = cjson.null, tool_calls = { call("c1", "add", { a = 2, b = 40 }), call("c2", "bad", {}) } },
      { content = "42" },
    }
    local out = mg.run(function()
      local c <close> = assert(mcp.connect { command = { os.getenv("MOONGRAPH_BIN") or "./moongraph", "mcp", "serve", file } })
      local agent = mg.prebuilt.react_agent { llm = client, tools = assert(c:list_tools()) }
      return assert(agent:invoke { messages = { "add" } })
    end)
    assert.equal("42", out.messages[3].content)
    assert.matches("no such thing", out.messages[4].content)
    assert.equal("42", out.messages[5].content)
  end)

  it("raises on misuse", function()
    assert.has_error(function() mg.prebuilt.react_agent { tools = {} } end,
      "bad argument #1 to 'react_agent': llm must be a client with a chat method")
    assert.has_error(function() mg.prebuilt.react_agent { llm = client, max_steps = 0 } end,
      "bad argument #1 to 'react_agent': max_steps must be an integer >= 1")
    assert.has_error(function() mg.prebuilt.tool_node { { name = "x" } } end,
      "bad argument: tool 'x' needs fn = function(args, ctx)")
  end)
end)
