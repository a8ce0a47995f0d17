-- moongraph.mcp against the official reference server,
-- @modelcontextprotocol/server-everything (spec/support/node, installed by
-- make test), over stdio and over Streamable HTTP.
local mg = require "moongraph"
local mcp = require "moongraph.mcp"
local process = require "moongraph.process"

local EVERYTHING = "spec/support/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

local function check_peer()
  local f = io.open(EVERYTHING)
  assert(f, EVERYTHING .. " is missing: run make test (it installs the MCP peers with npm ci)")
  f:close()
end

local function by_name(list)
  local out = {}
  for _, x in ipairs(list) do out[x.name] = x end
  return out
end

-- The behaviours checked over each transport.
local function suite(connect)
  it("initializes and lists the tools with their schemas", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      return { c.protocol_version, c.server_info.name, c.server_capabilities.tools ~= nil, assert(c:list_tools()) }
    end)
    assert.equal(mcp.LATEST_PROTOCOL_VERSION, r[1])
    assert.equal("example-servers/everything", r[2])
    assert.is_true(r[3])
    local tools = by_name(r[4])
    assert.is_table(tools.echo)
    assert.equal("object", tools.echo.inputSchema.type)
    assert.is_table(tools.longRunningOperation)
  end)

  it("calls a tool", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      return assert(c:call_tool("echo", { message = "héllo" }))
    end)
    assert.is_false(r.isError)
    assert.equal("Echo: héllo", mcp.text(r))
  end)

  it("receives the progress of a long call", function()
    local seen = {}
    local r = mg.run(function()
      local c <close> = assert(connect())
      return assert(c:call_tool("longRunningOperation", { duration = 0.3, steps = 3 },
        { on_progress = function(p, total) seen[#seen + 1] = { p, total } end }))
    end)
    assert.same({ { 1, 3 }, { 2, 3 }, { 3, 3 } }, seen)
    assert.matches("Long running operation completed", mcp.text(r))
  end)

  it("returns a failing call as an error naming the problem", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      return { c:call_tool("add", { a = "two", b = 1 }) }
    end)
    assert.is_nil(r[1])
    assert.matches("tools/call failed: .*Expected number, received string", r[2])
    assert.is_table(r[3])
  end)

  it("reads a resource and gets a prompt", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local res = assert(c:list_resources())
      local read = assert(c:read_resource(res[1].uri))
      local prompts = by_name(assert(c:list_prompts()))
      local p = assert(c:get_prompt("complex_prompt", { temperature = 0.7, style = "short" }))
      return { #res, res[1].uri, read.contents[1], prompts.simple_prompt ~= nil, p }
    end)
    assert.is_true(r[1] > 10)                  -- more than one page of resources
    assert.equal("test://static/resource/1", r[2])
    assert.equal("test://static/resource/1", r[3].uri)
    assert.is_string(r[3].text)
    assert.is_true(r[4])
    assert.equal("user", r[5].messages[1].role)
    assert.matches("temperature=0.7", r[5].messages[1].content.text)
  end)

  it("cancels a long call when the calling task is cancelled, and the connection goes on", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local started = mg.queue()
      local t = mg.spawn(function()
        return c:call_tool("longRunningOperation", { duration = 30, steps = 30 },
          { on_progress = function() started:put(true) end })
      end)
      assert(started:get(10), "no progress from the long call")
      local t0 = mg.now()
      assert.is_true(t:cancel())
      local ok, err = t:join()
      local echo = assert(c:call_tool("echo", { message = "still here" }))
      return { ok, err, mcp.text(echo), mg.now() - t0 < 10 }
    end)
    assert.same({ false, "cancelled", "Echo: still here", true }, r)
  end)

  it("times a call out and the connection goes on", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local a, err = c:call_tool("longRunningOperation", { duration = 30, steps = 30 }, { timeout = 0.2 })
      local echo = assert(c:call_tool("echo", { message = "after" }))
      return { a, err, mcp.text(echo) }
    end)
    assert.is_nil(r[1])
    assert.matches("tools/call timed out after 0.2 s", r[2])
    assert.equal("Echo: after", r[3])
  end)
end

describe("mcp client against server-everything over stdio", function()
  setup(check_peer)
  suite(function()
    return mcp.connect { command = { "node", EVERYTHING, "stdio" }, timeout = 20, kill_grace = 0.3 }
  end)

  it("runs many calls in flight on one connection", function()
    local r = mg.run(function()
      local c <close> = assert(mcp.connect { command = { "node", EVERYTHING, "stdio" }, kill_grace = 0.3 })
      local fns = {}
      for i = 1, 40 do
        fns[i] = function() return mcp.text(assert(c:call_tool("echo", { message = "m" .. i }))) end
      end
      local out = {}
      for i, res in ipairs(mg.gather(fns)) do out[i] = res.ok and res.value or res.err end
      return out
    end)
    for i = 1, 40 do assert.equal("Echo: m" .. i, r[i]) end
  end)
end)

describe("mcp client against server-everything over Streamable HTTP", function()
  local srv, url
  setup(function()
    check_peer()
    mg.run(function()
      for attempt = 1, 5 do
        local port = 20000 + (os.time() * 7 + attempt * 131 + math.random(0, 9999)) % 30000
        local env = process.environ()
        env.PORT = tostring(port)
        local p = assert(process.spawn({ "node", EVERYTHING, "streamableHttp" }, { env = env, stdout = "null" }))
        while true do
          local line = p.stderr:read_line(20)
          if not line then break end
          if line:find("listening on port " .. port, 1, true) then
            srv, url = p, "http://127.0.0.1:" .. port .. "/mcp"
            -- keep draining its log so it never blocks on a full pipe
            mg.spawn(function() while p.stderr:read_line() do end end)
            return
          end
        end
        p:close()
      end
      error("server-everything did not start over HTTP")
    end)
  end)
  teardown(function() if srv then srv:close() end end)

  suite(function() return mcp.connect { url = url, timeout = 20 } end)
end)
