-- tcp_relay.lua — a TCP relay between a client and a server that a spec can
-- cut, to drop a client's open connections for real (the client sees them
-- close mid-response), then bring back. Run as its own process:
--
--   lua5.4 spec/support/tcp_relay.lua TARGET_PORT
--   -> prints "relay PORT CONTROL_PORT", then relays 127.0.0.1:PORT to
--      127.0.0.1:TARGET_PORT until its control connection closes.
--
-- The control port takes one command a line and answers one line:
--   cut   closes every relayed connection and refuses new ones -> "cut N"
--         (N: how many it closed)
--   up    accepts connections again -> "up"
--   target PORT  relays new connections to 127.0.0.1:PORT from now on -> "target PORT"
--   count -> "count N": connections relayed so far
local socket = require "socket"

local target = tonumber(arg[1])
assert(target, "usage: lua5.4 tcp_relay.lua TARGET_PORT")

local server = assert(socket.bind("127.0.0.1", 0))
local control_server = assert(socket.bind("127.0.0.1", 0))
local _, port = server:getsockname()
local _, control_port = control_server:getsockname()
io.stdout:write("relay ", port, " ", control_port, "\n")
io.stdout:flush()

local control = assert(control_server:accept())
control_server:close()
control:settimeout(0)

local peer = {}          -- socket -> the socket at the other end
local clients = {}       -- the accepted ends
local relayed, down = 0, false

local function drop(s)
  local o = peer[s]
  peer[s], clients[s] = nil, nil
  s:close()
  if o then
    peer[o], clients[o] = nil, nil
    o:close()
  end
end

local function cut()
  local open = {}
  for c in pairs(clients) do open[#open + 1] = c end
  for _, c in ipairs(open) do drop(c) end
  return #open
end

local control_buf = ""
while true do
  local watch = { server, control }
  for s in pairs(peer) do watch[#watch + 1] = s end
  local readable = socket.select(watch, nil, 1)
  for _, s in ipairs(readable) do
    if s == server then
      local c = server:accept()
      if c then
        if down then
          c:close()
        else
          local t = socket.tcp()
          t:settimeout(5)
          if t:connect("127.0.0.1", target) then
            c:settimeout(5)
            peer[c], peer[t] = t, c
            clients[c] = true
            relayed = relayed + 1
          else
            c:close()
            t:close()
          end
        end
      end
    elseif s == control then
      local data, err, partial = control:receive(4096)
      data = data or partial
      if err == "closed" then os.exit(0) end
      control_buf = control_buf .. (data or "")
      for line in control_buf:gmatch("([^\n]*)\n") do
        local answer
        if line == "cut" then
          down = true
          answer = "cut " .. cut()
        elseif line == "up" then
          down = false
          answer = "up"
        elseif line:match("^target %d+$") then
          target = tonumber(line:match("%d+"))
          answer = "target " .. target
        elseif line == "count" then
          answer = "count " .. relayed
        else
          answer = "unknown command"
        end
        control:settimeout(5)
        control:send(answer .. "\n")
        control:settimeout(0)
      end
      control_buf = control_buf:match("[^\n]*$")
    elseif peer[s] then
      s:settimeout(0)
      local data, err, partial = s:receive(65536)
      data = data or partial
      if data and data ~= "" then
        local ok = peer[s]:send(data)
        if not ok then drop(s) end
      end
      if err == "closed" then
        if peer[s] then drop(s) end
      end
      if peer[s] then s:settimeout(5) end
    end
  end
end
