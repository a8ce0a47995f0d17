-- The moongraph side of `make bench-server` (bench/server.lua starts it):
-- the hello-world JSON handler the node and bare H2O servers also answer,
-- and an SSE endpoint sending one event per second, each carrying the
-- monotonic time it was written (for the load client's delivery delay).
--
--   ./moongraph run bench/server_app.lua PORT
local mg = require "moongraph"
local server = require "moongraph.server"

local srv = assert(server.listen{
  port = tonumber(arg[1]) or 0,
  max_connections = 12000,
  routes = {
    ["GET /"] = function()
      return { json = { hello = "world" } }
    end,
    ["GET /sse"] = function(_, res)
      while res:sse{ data = { t = mg.now() } } do
        mg.sleep(1)
      end
    end,
  },
})
local stat = assert(io.open("/proc/self/stat"))
local pid = stat:read("n")
stat:close()
io.stdout:write("listening on ", srv.url, " pid ", pid, "\n")
io.stdout:flush()
