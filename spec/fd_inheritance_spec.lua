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
-- what the started program (ls) holds: its descriptors and their targets
local p = assert(io.popen("ls -l /proc/self/fd"))
local listing = p:read("a")
assert(p:close(), "ls -l /proc/self/fd failed")
local fds, sockets = 0, 0
for target in listing:gmatch(" %%-> ([^\n]+)") do
  fds = fds + 1
  if target:find("^socket:") then sockets = sockets + 1 end
end
io.write("descriptors in the child: ", fds, ", sockets: ", sockets, "\n")
]]):format(srv.url .. "/delay?ms=1", rs.url, ps.url))
    local r = cli.run { "run", script }
    assert.are.equal(0, r.code, r.err)
    -- it looked (stdin, stdout, stderr at least) and saw no socket
    local fds, sockets = r.out:match("^descriptors in the child: (%d+), sockets: (%d+)\n$")
    assert.is_true(tonumber(fds or "") ~= nil and tonumber(fds) >= 3, r.out)
    assert.are.equal("0", sockets)
  end)
end)
