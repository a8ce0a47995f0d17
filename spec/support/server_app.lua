-- A moongraph.server in its own process for specs that drive it with real
-- clients (curl, raw sockets) and signals. Started by spec/support/
-- serverproc.lua:
--
--   ./moongraph run spec/support/server_app.lua '<listen options as JSON>'
--
-- Prints "listening on URL pid N" once it accepts connections. The routes
-- are fixed test handlers (below); /__stats and /__events let a spec look
-- at the server's counters and at what handlers observed (for instance the
-- result of a write after the client went away).
local mg = require "moongraph"
local server = require "moongraph.server"
local cjson = require "cjson"
local core = require "moongraph.core"

local opts = cjson.decode(arg[1] or "{}")
local events = {}
local function note(ev)
  events[#events + 1] = ev
end

local gates = {}        -- name -> queue: a handler waits until /__open/:name
local function gate(name)
  gates[name] = gates[name] or mg.queue()
  return gates[name]
end

local srv
local routes = {
  ["GET /hello"] = function()
    return { json = { hello = "world" } }
  end,
  ["GET /items/:id"] = function(req)
    return { json = { id = req.params.id, path = req.path, query = req.query } }
  end,
  ["GET /files/*rest"] = function(req)
    return { json = { rest = req.params.rest } }
  end,
  ["GET /headers"] = function(req)
    return { json = { headers = req.headers, agent = req.headers["User-Agent"] } }
  end,
  ["POST /echo"] = function(req)
    return { status = 200, headers = { ["X-Body-Length"] = tostring(#req.body) }, body = req.body }
  end,
  ["PUT /echo"] = function(req)
    return { body = req.body }
  end,
  ["POST /json"] = function(req)
    local v, err = req:json()
    if v == nil then return { status = 400, json = { error = err } } end
    return { status = 201, json = { got = v } }
  end,
  ["GET /sse"] = function(req, res)
    local n = tonumber(req.query.n) or 3
    local every = tonumber(req.query.every) or 0
    for i = 1, n do
      local ok, err = res:sse{ event = "tick", id = tostring(i), data = { i = i } }
      if not ok then
        note{ route = "sse", i = i, err = err }
        return
      end
      if every > 0 then mg.sleep(every) end
    end
    note{ route = "sse", done = n }
  end,
  -- writes until the client goes away; records what write returned
  ["GET /forever"] = function(req, res)
    local size = tonumber(req.query.size) or 64
    local chunk = string.rep("x", size - 1) .. "\n"
    local i, every = 0, tonumber(req.query.every) or 0.01
    while true do
      i = i + 1
      local ok, err = res:write(chunk)
      if not ok then
        note{ route = "forever", writes = i, err = err, tag = req.query.tag }
        return
      end
      if every > 0 then mg.sleep(every) end
    end
  end,
  -- a slow reader's stream: numbered lines as fast as the client takes
  -- them, written with res:write, or as SSE events (?sse=1, "data: " and a
  -- blank line around each line)
  ["GET /flood"] = function(req, res)
    local n = tonumber(req.query.n) or 1000
    local line = string.rep("y", (tonumber(req.query.size) or 1024) - 12)
    local sse = req.query.sse == "1"
    for i = 1, n do
      local text = string.format("%010d %s", i, line)
      local ok, err
      if sse then ok, err = res:sse{ data = text }
      else ok, err = res:write(text .. "\n") end
      if not ok then
        note{ route = "flood", i = i, err = err }
        return
      end
    end
    note{ route = "flood", done = n }
  end,
  ["GET /wait/:name"] = function(req)
    local ok = gate(req.params.name):get(10)
    return { json = { opened = ok ~= nil } }
  end,
  -- held until SIGUSR1 opens every gate (for drain: no new connection
  -- can ask for it then)
  ["GET /hold/:name"] = function(req)
    note{ route = "hold", name = req.params.name }
    local ok = gate(req.params.name):get(30)
    return { json = { opened = ok ~= nil } }
  end,
  ["POST /__open/:name"] = function(req)
    gate(req.params.name):put(true)
    return { json = { ok = true } }
  end,
  -- handlers that never yield: the watchdog's to stop
  ["GET /spin"] = function()
    local n = 0
    while true do n = n + 1 end
  end,
  ["GET /spin-swallow"] = function()
    while true do pcall(function() local n = 0 while true do n = n + 1 end end) end
  end,
  -- one long C call (a backtracking pattern): no hook runs inside it
  ["GET /spin-c"] = function()
    return { body = tostring((("a"):rep(40)):find(("a?"):rep(40) .. ("a"):rep(41))) }
  end,
  ["GET /slow"] = function(req)
    mg.sleep(tonumber(req.query.s) or 0.5)
    return { json = { slept = true } }
  end,
  ["GET /boom"] = function()
    error("boom on purpose")
  end,
  ["GET /nothing"] = function() end,
  ["GET /status/:code"] = function(req)
    return { status = tonumber(req.params.code), body = "status " .. req.params.code }
  end,
  ["DELETE /items/:id"] = function(req)
    return { status = 204 }
  end,
  ["GET /__stats"] = function()
    return { json = srv:stats() }
  end,
  ["GET /__events"] = function()
    return { json = events }
  end,
}

opts.routes = routes
if opts.signals == nil then opts.signals = { "TERM" } end
local err
srv, err = server.listen(opts)
if not srv then
  io.stderr:write("server_app: ", err, "\n")
  os.exit(1)
end
local stat = assert(io.open("/proc/self/stat"))
local pid = stat:read("n")
stat:close()
io.stdout:write("listening on ", srv.url, " pid ", pid, "\n")
io.stdout:flush()
local usr1 = mg.spawn(function()
  while true do
    core.signal.wait("USR1")
    for _, q in pairs(gates) do q:put(true) end
  end
end)
srv:wait()
usr1:cancel()
io.stdout:write("closed\n")
io.stdout:flush()
