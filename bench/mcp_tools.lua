-- The MCP server of bench/mcp.lua: one small tool, served by
-- `moongraph mcp serve bench/mcp_tools.lua`.
return {
  name = "bench", version = "1",
  tools = { {
    name = "echo", description = "return the text",
    inputSchema = { type = "object", required = { "text" }, properties = { text = { type = "string" } } },
    handler = function(args) return args.text end,
  } },
}
