-- `moongraph mcp serve FILE --http PORT`: MCP over Streamable HTTP
-- (https://modelcontextprotocol.io/specification/2025-06-18/basic/transports#streamable-http),
-- checked by the official TypeScript SDK client, by curl for the
-- transport's rules, and by moongraph's own client.
local mg = require "moongraph"
local mcp = require "moongraph.mcp"
local cli = require "cli"
local cjson = require "cjson"

local TOOLS = "spec/support/mcp/test_tools.lua"

-- start(file) -> process, url: the server, once it says where it listens
local function start(file)
  local p = assert(mg.process.spawn({ cli.bin, "mcp", "serve", file, "--http", "0" }, { stdout = "null" }))
  for _ = 1, 50 do
    local line = p.stderr:read_line()
    if not line then break end
    local url = line:match("at (http://%S+)$")
    if url then return p, url end
  end
  p:close()
  error("the server never said where it listens")
end

-- curl(args [, body]) -> status, response body; body is sent as the
-- request's data (args name the method and URL)
local function curl(args, body)
  -- (without the sanitizer runtime `make asan` preloads: curl hangs under it)
  local argv = { "env", "-u", "LD_PRELOAD", "curl", "-sS", "-o", "-", "-w", "\n%{http_code}" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  if body then argv[#argv + 1] = "--data-binary"; argv[#argv + 1] = body end
  local r = assert(mg.process.run(argv, { timeout = 20 }))
  assert(r.code == 0, "curl " .. table.concat(args, " ") .. " failed (exit " .. tostring(r.code) .. ", signal " .. tostring(r.signal) .. "): " .. tostring(r.stderr))
  local body, status = r.stdout:match("^(.*)\n(%d%d%d)$")
  return tonumber(status), body
end

local INIT = cjson.encode { jsonrpc = "2.0", id = 1, method = "initialize", params = {
  protocolVersion = "2025-06-18", capabilities = {}, clientInfo = { name = "curl", version = "1" } } }

describe("mcp serve --http", function()
  it("is used by the official SDK client: list the marketing tools, call one with good and bad input", function()
    local f = io.open("spec/support/node/node_modules/@modelcontextprotocol/sdk/package.json")
    assert(f, "the MCP SDK is not installed: run make test (npm ci in spec/support/node)")
    f:close()
    local out = mg.run(function()
      local p, url = start("scripts/marketing/tools.lua")
      local r = assert(mg.process.run({ "node", "spec/support/node/sdk_client.mjs", "http", url }, {
        input = cjson.encode { { list = true },
          { call = "search_merchant", args = { merchant_name = "본죽" } },
          { call = "search_merchant", args = { name = "본죽" } } },
        timeout = 60 }))
      p:close()
      assert(r.code == 0, "node exited with " .. tostring(r.code) .. ": " .. tostring(r.stderr))
      return cjson.decode(r.stdout)
    end)
    assert.is_nil(out.error)
    assert.equal("moongraph-marketing-data", out.server.name)
    assert.equal(5, #out.steps[1].tools)
    assert.is_true(out.steps[2].result.structuredContent.found)
    assert.is_true(out.steps[3].result.isError)
    assert.matches('missing required property "merchant_name"', out.steps[3].result.content[1].text)
  end)

  it("moongraph's client: calls in flight at once, progress, cancellation, resources, prompts", function()
    mg.run(function()
      local p, url = start(TOOLS)
      local c = assert(mcp.connect { url = url })
      -- many calls at once on one session
      local ts = {}
      for i = 1, 20 do ts[i] = mg.spawn(function() return c:call_tool("echo", { text = "n" .. i }) end) end
      for i = 1, 20 do
        local ok, r = ts[i]:join()
        assert.is_true(ok)
        assert.equal("n" .. i, r.content[1].text)
      end
      -- progress comes back on the request's stream
      local seen = {}
      local r = assert(c:call_tool("slow", { seconds = 0.04 }, { on_progress = function(n) seen[#seen + 1] = n end }))
      assert.equal("slept", r.content[1].text)
      assert.same({ 1, 2, 3, 4 }, seen)
      -- a cancelled call cancels the handler on the server
      local t = mg.spawn(function() return c:call_tool("slow", { seconds = 30 }) end)
      mg.sleep(0.1)
      t:cancel()
      local count
      for _ = 1, 100 do
        count = assert(c:call_tool("cancelled", {})).structuredContent.count
        if count >= 1 then break end
        mg.sleep(0.02)
      end
      assert.equal(1, count)
      assert.equal("hello", assert(c:read_resource("mem://greeting")).contents[1].text)
      assert.matches("Tell me about bins", assert(c:get_prompt("ask", { topic = "bins" })).messages[1].content.text)
      c:close()
      p:close()
    end)
  end)

  it("follows the transport's rules: session ids, 202 for notifications, DELETE, Origin", function()
    mg.run(function()
      local p, url = start(TOOLS)
      local json_accept = { "-H", "Content-Type: application/json", "-H", "Accept: application/json, text/event-stream" }
      -- initialize: the answer names the session
      local argv = { "-D", "-", "-X", "POST", url }
      for _, a in ipairs(json_accept) do argv[#argv + 1] = a end
      local status, body = curl(argv, INIT)
      assert.equal(200, status)
      local sid = body:match("[Mm]cp%-[Ss]ession%-[Ii]d: (%x+)")
      assert.is_string(sid)
      assert.matches('"serverInfo"', body)
      local function post(msg, headers)
        local a = { "-X", "POST", url }
        for _, h in ipairs(json_accept) do a[#a + 1] = h end
        for _, h in ipairs(headers or {}) do a[#a + 1] = "-H"; a[#a + 1] = h end
        return curl(a, cjson.encode(msg))
      end
      local list = { jsonrpc = "2.0", id = 2, method = "tools/list" }
      -- no session id: 400; an unknown one: 404
      assert.equal(400, (post(list)))
      assert.equal(404, (post(list, { "Mcp-Session-Id: 0123abcd" })))
      -- a notification is accepted without a body
      assert.equal(202, (post({ jsonrpc = "2.0", method = "notifications/initialized" }, { "Mcp-Session-Id: " .. sid })))
      -- a request on the session works; a foreign Origin is refused
      local s2, b2 = post(list, { "Mcp-Session-Id: " .. sid })
      assert.equal(200, s2)
      assert.matches('"name":"echo"', b2)
      assert.equal(403, (post(list, { "Mcp-Session-Id: " .. sid, "Origin: http://evil.example" })))
      -- bad JSON is a parse error, not a crash
      local s3, b3 = curl({ "-X", "POST", url, "--data-binary", "{nope", "-H", "Mcp-Session-Id: " .. sid,
                            "-H", "Accept: application/json, text/event-stream" })
      assert.equal(400, s3)
      assert.matches("-32700", b3)
      -- DELETE ends the session
      assert.equal(200, (curl({ "-X", "DELETE", url, "-H", "Mcp-Session-Id: " .. sid })))
      assert.equal(404, (post(list, { "Mcp-Session-Id: " .. sid })))
      p:close()
    end)
  end)
end)
