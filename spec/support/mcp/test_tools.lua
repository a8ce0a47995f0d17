-- Tools for spec/mcp_spec.lua, served by `moongraph mcp serve`.
local mg = require "moongraph"

local cancelled = 0

return {
  name = "spec-tools", version = "0.1",
  resources = {
    { uri = "mem://greeting", name = "greeting", mimeType = "text/plain", read = function() return "hello" end },
  },
  prompts = {
    { name = "ask", description = "ask about a topic", arguments = { { name = "topic", required = true } },
      get = function(args) return "Tell me about " .. args.topic end },
  },
  tools = {
    { name = "echo", description = "echo the text",
      inputSchema = { type = "object", required = { "text" }, properties = { text = { type = "string" } } },
      handler = function(args) return args.text end },
    { name = "slow", description = "wait, reporting progress",
      inputSchema = { type = "object", properties = { seconds = { type = "number", minimum = 0 } } },
      handler = function(args, ctx)
        local guard <close> = setmetatable({ done = false }, { __close = function(g)
          if not g.done then cancelled = cancelled + 1 end
        end })
        local s = args.seconds or 1
        for i = 1, 4 do
          ctx.progress(i, 4, "step " .. i)
          mg.sleep(s / 4)
        end
        guard.done = true
        return "slept"
      end },
    { name = "cancelled", description = "how many slow calls were cancelled",
      handler = function() return { count = cancelled } end },
    { name = "crash", description = "exit the server",
      handler = function() io.stderr:write("about to crash: disk full\n") io.stderr:flush() os.exit(3) end },
    { name = "announce", description = "tell the client the tool list changed",
      handler = function(_, ctx)
        ctx.session:notify("notifications/tools/list_changed")
        return "announced"
      end },
    { name = "garbage", description = "write a line that is not JSON-RPC to stdout",
      handler = function()
        require("moongraph.core").process.stdio():write("this is not json\n")
        return "wrote garbage"
      end },
  },
}
