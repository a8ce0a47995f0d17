-- moongraph.mcp client and `moongraph mcp serve`, talking to each other
-- over stdio: concurrency, cancellation, timeouts, crashes, garbage.
local mg = require "moongraph"
local mcp = require "moongraph.mcp"
local cli = require "cli"

local TOOLS = "spec/support/mcp/test_tools.lua"

local function connect(opts)
  local o = { command = { cli.bin, "mcp", "serve", TOOLS }, kill_grace = 0.5 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return mcp.connect(o)
end

describe("mcp client and server", function()
  it("serves tools, resources and prompts", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local tools = assert(c:list_tools())
      local names = {}
      for i, t in ipairs(tools) do names[i] = t.name end
      return { c.server_info.name, names, mcp.text(assert(c:call_tool("echo", { text = "hi" }))),
        assert(c:list_resources())[1].uri, assert(c:read_resource("mem://greeting")).contents[1].text,
        assert(c:get_prompt("ask", { topic = "MCP" })).messages[1].content.text, c:ping() }
    end)
    assert.same({ "spec-tools", { "echo", "slow", "cancelled", "crash", "announce", "garbage" }, "hi", "mem://greeting",
      "hello", "Tell me about MCP", true }, r)
  end)

  it("answers many calls in flight from parallel tasks, each with its own result", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local fns = {}
      for i = 1, 100 do
        fns[i] = function()
          if i % 10 == 0 then return mcp.text(assert(c:call_tool("slow", { seconds = 0.05 }))) end
          return mcp.text(assert(c:call_tool("echo", { text = "n" .. i })))
        end
      end
      local out = {}
      for i, res in ipairs(mg.gather(fns)) do out[i] = res.ok and res.value or ("failed: " .. tostring(res.err)) end
      return out
    end)
    for i = 1, 100 do assert.equal(i % 10 == 0 and "slept" or ("n" .. i), r[i]) end
  end)

  it("sends progress to the caller's callback", function()
    local seen = {}
    mg.run(function()
      local c <close> = assert(connect())
      assert(c:call_tool("slow", { seconds = 0.04 }, { on_progress = function(p, total, msg)
        seen[#seen + 1] = string.format("%d/%d %s", p, total, msg)
      end }))
    end)
    assert.same({ "1/4 step 1", "2/4 step 2", "3/4 step 3", "4/4 step 4" }, seen)
  end)

  it("cancels the server's handler when the calling task is cancelled", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local started = mg.queue()
      local t = mg.spawn(function()
        return c:call_tool("slow", { seconds = 20 }, { on_progress = function() started:put(true) end })
      end)
      assert(started:get(10))
      t:cancel()
      -- the server handles notifications/cancelled before the next request
      local count
      for _ = 1, 100 do
        count = assert(c:call_tool("cancelled", {})).structuredContent.count
        if count > 0 then break end
        mg.sleep(0.01)
      end
      return { t:status(), count }
    end)
    assert.same({ "cancelled", 1 }, r)
  end)

  it("times out a call, tells the server, and goes on", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local a, err = c:call_tool("slow", { seconds = 20 }, { timeout = 0.1 })
      local count
      for _ = 1, 100 do
        count = assert(c:call_tool("cancelled", {})).structuredContent.count
        if count > 0 then break end
        mg.sleep(0.01)
      end
      return { a, err, count }
    end)
    assert.is_nil(r[1])
    assert.matches("tools/call timed out after 0.1 s", r[2])
    assert.equal(1, r[3])
  end)

  it("bounds a call by the caller's deadline", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local ok, v, err = mg.timeout(0.5, function() return c:call_tool("slow", { seconds = 20 }) end)
      return { ok, v, err }
    end)
    assert.is_true(r[1])
    assert.is_nil(r[2])
    assert.matches("at the caller's deadline", r[3])
  end)

  it("validates input against the schema and reports handler errors as isError", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local bad = assert(c:call_tool("echo", { text = 5 }))
      local missing = assert(c:call_tool("echo", {}))
      local neg = assert(c:call_tool("slow", { seconds = -1 }))
      local unknown = { c:call_tool("nope", {}) }
      return { bad, missing, neg, unknown }
    end)
    assert.is_true(r[1].isError)
    assert.matches("%$%.text: expected string, got integer", mcp.text(r[1]))
    assert.matches('missing required property "text"', mcp.text(r[2]))
    assert.matches("below the minimum", mcp.text(r[3]))
    assert.is_nil(r[4][1])
    assert.matches("Unknown tool: nope %(code %-32602%)", r[4][2])
  end)

  it("reports a crashed server clearly and reconnects", function()
    local r = mg.run(function()
      local c <close> = assert(connect())
      local a, err = c:call_tool("crash", {})
      local again, err2 = c:call_tool("echo", { text = "x" })
      local alive = c:alive()
      assert(c:reconnect())
      local back = mcp.text(assert(c:call_tool("echo", { text = "back" })))
      return { a, err, again, err2, alive, back }
    end)
    assert.is_nil(r[1])
    assert.matches("the server exited with code 3; its stderr ended with: .*about to crash: disk full", r[2])
    assert.is_nil(r[3])
    assert.matches("exited with code 3", r[4])
    assert.is_false(r[5])
    assert.equal("back", r[6])
  end)

  it("reports a program that cannot start", function()
    local c, err = mg.run(function() return mcp.connect { command = { "no-such-mcp-server" } } end)
    assert.is_nil(c)
    assert.matches("cannot run 'no%-such%-mcp%-server'", err)
  end)

  it("passes list_changed notifications to on_list_changed", function()
    local kinds, methods = {}, {}
    mg.run(function()
      local c <close> = assert(connect {
        on_list_changed = function(kind) kinds[#kinds + 1] = kind end,
        on_notification = function(method) methods[#methods + 1] = method end,
      })
      assert(c:call_tool("announce", {}))
    end)
    assert.same({ "tools" }, kinds)
    assert.same({ "notifications/tools/list_changed" }, methods)
  end)

  it("skips a line that is not JSON-RPC, reports it, and goes on", function()
    local errors = {}
    local r = mg.run(function()
      local c <close> = assert(connect { on_error = function(m) errors[#errors + 1] = m end })
      local a = mcp.text(assert(c:call_tool("garbage", {})))
      local b = mcp.text(assert(c:call_tool("echo", { text = "fine" })))
      return { a, b }
    end)
    assert.same({ "wrote garbage", "fine" }, r)
    assert.equal(1, #errors)
    assert.matches("unusable message: not a JSON object: this is not json", errors[1])
  end)

  it("closes the server process (stdin closed, then it leaves)", function()
    local function alive(pid)
      local f = io.open("/proc/" .. pid .. "/stat")
      if f then f:close() end
      return f ~= nil
    end
    assert(io.open("/proc/self/stat"), "/proc is not mounted: cannot tell whether the server left"):close()
    local r = mg.run(function()
      local c = assert(connect())
      local pid = c.transport:pid()
      assert.is_number(pid)
      local before = alive(pid)
      c:close()
      return { before, alive(pid), c:call_tool("echo", { text = "x" }) }
    end)
    assert.is_true(r[1])
    assert.is_false(r[2])
    assert.is_nil(r[3])         -- and the closed client calls nothing
    assert.is_string(r[4])
  end)

  it("raises on misuse", function()
    assert.has_error(function() mcp.connect {} end,
      "bad argument #1 to 'connect': give command = {program, arg, ...} (stdio) or url (HTTP)")
    assert.has_error(function() mcp.connect { url = "ftp://x" } end,
      "bad argument #1 to 'connect': url must start with http:// or https://")
    assert.has_error(function() mcp.connect { command = { "x" }, bogus = 1 } end,
      "bad argument #1 to 'connect': unknown option 'bogus'")
  end)
end)

describe("moongraph mcp serve", function()
  it("says what is wrong with its arguments and files", function()
    local r = cli.run { "mcp", "serve" }
    assert.equal(2, r.code)
    assert.matches("missing FILE", r.err)
    r = cli.run { "mcp", "serve", "/no/such/file.lua" }
    assert.equal(1, r.code)
    assert.matches("/no/such/file.lua", r.err)
    r = cli.run { "mcp", "serve", TOOLS, "--http", "70000" }
    assert.equal(2, r.code)
    assert.matches("%-%-http: port 0..65535 expected", r.err)
  end)

  it("ends when the client closes its stdin", function()
    local r = mg.run(function()
      local p <close> = assert(mg.process.spawn({ cli.bin, "mcp", "serve", TOOLS }, { stderr = "null" }))
      p.stdin:close()
      return { p:wait(10) }
    end)
    assert.same({ 0 }, r)
  end)
end)
