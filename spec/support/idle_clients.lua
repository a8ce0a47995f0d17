-- idle_clients.lua — N TCP connections that send nothing, in a process of
-- their own (so the spec runner's descriptor limit does not matter):
--
--   lua5.4 spec/support/idle_clients.lua HOST PORT N
--
-- Opens N connections, prints "opened N" (or "failed K: reason" and exits
-- 1), then holds them until its stdin closes, and prints "closed_by_server
-- M": how many the server had closed by then (EOF or reset on a read that
-- does not wait). Started by spec/server_clients_spec.lua.
local socket = require "socket"

local host, port, n = arg[1], tonumber(arg[2]), tonumber(arg[3])
local conns = {}
for i = 1, n do
  local c = socket.tcp()
  if not c then
    io.stdout:write("failed ", i, ": no socket (descriptor limit?)\n")
    os.exit(1)
  end
  c:settimeout(10)
  local ok, err = c:connect(host, port)
  if not ok then
    io.stdout:write("failed ", i, ": ", tostring(err), "\n")
    os.exit(1)
  end
  conns[i] = c
end
io.stdout:write("opened ", #conns, "\n")
io.stdout:flush()
io.stdin:read("a")
local closed = 0
for _, c in ipairs(conns) do
  c:settimeout(0)
  local _, err = c:receive(1)
  if err == "closed" or (err and err:match("reset")) then closed = closed + 1 end
  c:close()
end
io.stdout:write("closed_by_server ", closed, "\n")
