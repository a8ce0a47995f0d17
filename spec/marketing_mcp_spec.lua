-- The store-marketing data tools over real MCP: served by `moongraph mcp
-- serve scripts/marketing/tools.lua`, called by the pipeline through the
-- MCP client.
local mg = require "moongraph"
local cli = require "cli"
local tmp = require "tmp"
local json = require "cjson"
local tools_mod = require "scripts.marketing.tools"
local mcp_tools = require "scripts.marketing.mcp_tools"

local OFFLINE = "env -u MOONGRAPH_LLM_BASE_URL -u MOONGRAPH_LLM_API_KEY -u GOOGLE_API_KEY " ..
  "-u CONFIRM_ON_MULTI -u ENABLE_RELEVANCE_CHECK -u MAX_RETRIES -u MARKETING_DATA_DIR -u MARKETING_TOOLS"

describe("marketing data tools over MCP", function()
  it("give the same values as the in-process tools", function()
    local over, here = mg.run(function()
      local T = mcp_tools.new()
      local L = tools_mod.new()
      local a = { T.search_merchant("본죽"), T.load_store_data("S001"), T.resolve_region("서울특별시 강남구 역삼1동"),
        T.load_store_data("S999") }
      local b = { L.search_merchant("본죽"), L.load_store_data("S001"), L.resolve_region("서울특별시 강남구 역삼1동"),
        L.load_store_data("S999") }
      T.close()
      return a, b
    end)
    assert.same(here, over)
    assert.is_true(over[1].found)
    assert.is_false(over[4].success)
  end)

  it("report a server that cannot start as a tool failure", function()
    local r = mg.run(function()
      local T = mcp_tools.new { command = { "/no/such/moongraph", "mcp", "serve", "x.lua" } }
      return T.search_merchant("본죽")
    end)
    assert.is_false(r.found)
    assert.matches("cannot run '/no/such/moongraph'", r.error)
  end)

  it("are called over MCP by the command by default, in-process with MARKETING_TOOLS=local", function()
    local dir = tmp.dir("checkpoints")
    local env = OFFLINE .. " CONFIRM_ON_MULTI=0 MARKETING_CHECKPOINT_DIR=" .. cli.quote(dir)
    -- a binary that cannot serve MCP shows which way the tools go
    local broken = cli.run({ "marketing", "--json", "본죽 문제점이 뭐야?" },
      { env = env .. " MOONGRAPH_BIN=/no/such/moongraph" })
    local via_mcp = cli.run({ "marketing", "--json", "본죽 문제점이 뭐야?" }, { env = env })
    local in_process = cli.run({ "marketing", "--json", "본죽 문제점이 뭐야?" },
      { env = env .. " MARKETING_TOOLS=local MOONGRAPH_BIN=/no/such/moongraph" })
    assert.equal(1, broken.code)
    assert.matches("cannot run '/no/such/moongraph'", json.decode(broken.out).error)
    assert.equal(0, via_mcp.code, via_mcp.err)
    assert.equal(0, in_process.code, in_process.err)
    assert.equal(json.decode(in_process.out).final_response, json.decode(via_mcp.out).final_response)
    assert.matches("본죽", json.decode(via_mcp.out).final_response)
  end)
end)
