-- `moongraph mcp serve scripts/marketing/tools.lua` checked by the official
-- MCP TypeScript SDK client (spec/support/node/sdk_client.mjs, installed by
-- make test) over stdio; spec/mcp_http_spec.lua does the same over
-- Streamable HTTP.
local mg = require "moongraph"
local cli = require "cli"
local cjson = require "cjson"

local SCRIPT = "spec/support/node/sdk_client.mjs"

local function sdk(steps)
  local f = io.open("spec/support/node/node_modules/@modelcontextprotocol/sdk/package.json")
  assert(f, "the MCP SDK is not installed: run make test (npm ci in spec/support/node)")
  f:close()
  local out = mg.run(function()
    local r = assert(mg.process.run({ "node", SCRIPT, "stdio", cli.bin, "mcp", "serve", "scripts/marketing/tools.lua" },
      { input = cjson.encode(steps), timeout = 60 }))
    assert(r.code == 0, "node exited with " .. tostring(r.code) .. ": " .. tostring(r.stderr))
    return r.stdout
  end)
  return assert(cjson.decode(out), "the SDK script printed no JSON: " .. out)
end

describe("moongraph mcp serve, checked by the official TypeScript SDK client", function()
  local res
  setup(function()
    res = sdk {
      { list = true },
      { call = "search_merchant", args = { merchant_name = "본죽" } },
      { call = "search_merchant", args = { merchant_name = "" } },
      { call = "search_merchant", args = { name = "본죽" } },
      { call = "load_store_data", args = { store_id = "S001" } },
      { call = "no_such_tool", args = {} },
    }
  end)

  it("connects and lists the five marketing tools with their input schemas", function()
    assert.is_nil(res.error)
    assert.equal("moongraph-marketing-data", res.server.name)
    local names = {}
    for i, t in ipairs(res.steps[1].tools) do
      names[i] = t.name
      assert.equal("object", t.inputSchema.type)
    end
    assert.same({ "search_merchant", "load_store_data", "resolve_region", "load_area_data", "load_region_data" }, names)
    assert.same({ "merchant_name" }, res.steps[1].tools[1].inputSchema.required)
  end)

  it("calls search_merchant with good input", function()
    local r = res.steps[2].result
    assert.is_falsy(r.isError)
    assert.is_true(r.structuredContent.found)
    assert.equal(3, #r.structuredContent.merchants)
    assert.is_true(cjson.decode(r.content[1].text).found)
  end)

  it("refuses bad input with an isError result naming the problem", function()
    local empty, wrong = res.steps[3].result, res.steps[4].result
    assert.is_true(empty.isError)
    assert.matches("merchant_name: shorter than 1 characters", empty.content[1].text)
    assert.is_true(wrong.isError)
    assert.matches('missing required property "merchant_name"', wrong.content[1].text)
  end)

  it("keeps serving after bad input, and reports an unknown tool as a protocol error", function()
    local r = res.steps[5].result
    assert.is_true(r.structuredContent.success)
    assert.is_true(r.structuredContent.data.sample)
    local unknown = res.steps[6]
    assert.is_truthy(unknown.error or (unknown.result and unknown.result.isError))
    assert.matches("no_such_tool", unknown.error or unknown.result.content[1].text)
  end)
end)
