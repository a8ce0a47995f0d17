-- A program moongraph starts (io.popen, os.execute, a spawned process) gets
-- none of its network connections: a child holding a keep-alive socket
-- would keep the connection open after moongraph closed it, and a database
-- server started by a test would lose descriptors to it.
local cli = require "cli"
local servers = require "servers"
local testserver = require "testserver"
local mg = require "moongraph"

describe("descriptors of a started program", function()
  local rs, ps, srv
  setup(function()
    rs = servers.redis()
    ps = servers.postgres()
    srv = testserver.start()
  end)
  teardown(function()
    if rs then rs:destroy() end
    if ps then ps:destroy() end
    if srv then srv:stop() end
  end)

  it("include no socket of HTTP, Redis or Postgres connections", function()
    local script = cli.write_temp(([[
local http = require "moongraph.http"
local redis = require "moongraph.redis"
local pg = require "moongraph.pg"
for i = 1, 5 do assert(http.get(%q)) end
local r = assert(redis.connect(%q))
assert(r:call("PING"))
local db = assert(pg.connect(%q))
assert(db:query("SELECT 1"))
local p = io.popen("ls -l /proc/self/fd | grep -c socket")
io.write("sockets in the child: ", p:read("l"), "\n")
p:close()
]]):format(srv.url .. "/delay?ms=1", rs.url, ps.url))
    local r = cli.run { "run", script }
    assert.are.equal(0, r.code, r.err)
    assert.are.equal("sockets in the child: 0\n", r.out)
  end)
end)
