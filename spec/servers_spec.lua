-- The throwaway servers every database spec relies on.
local servers = require "servers"
local tmp = require "tmp"

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

-- the first line a command prints, or raise
local function command_output(cmd)
  local f = assert(io.popen(cmd))
  local line = f:read("l")
  local ok, _, code = f:close()
  assert(ok and line, cmd .. " failed (exit " .. tostring(code) .. ")")
  return line
end

describe("spec/support/servers", function()
  describe("redis", function()
    local r
    setup(function() r = servers.redis() end)
    teardown(function() if r then r:destroy() end end)

    it("answers on its TCP port and its unix socket", function()
      assert.matches("^redis://127%.0%.0%.1:%d+/0$", r.url)
      assert.equals("OK", r:cli("SET", "k", "v"))
      local f = assert(io.popen(("env -u LD_PRELOAD redis-cli -p %d GET k"):format(r.port)))
      assert.equals("v\n", f:read("a"))
      f:close()
    end)

    it("restarts on the same port; without persistence the data is gone", function()
      r:cli("SET", "k", "v")
      local port = r.port
      r:restart()
      assert.equals(port, r.port)
      assert.is_true(r:running())
      assert.equals("", r:cli("GET", "k"))
    end)

    it("reports a stopped server as not running and starts it again", function()
      r:stop("kill")
      assert.is_false(r:running())
      r:start()
      assert.is_true(r:running())
    end)
  end)

  describe("redis with persistence and a password", function()
    local r
    setup(function() r = servers.redis{ persist = true, password = "s3cret-pw" } end)
    teardown(function() if r then r:destroy() end end)

    it("puts the password in its URLs and requires it", function()
      assert.matches("^redis://:s3cret%-pw@127%.0%.0%.1:%d+/0$", r.url)
      local f = assert(io.popen(("env -u LD_PRELOAD redis-cli -p %d GET k 2>&1"):format(r.port)))
      assert.matches("NOAUTH", f:read("a"))
      f:close()
    end)

    it("keeps acknowledged writes across kill -9", function()
      assert.equals("OK", r:cli("SET", "k", "kept"))
      r:restart("kill")
      assert.equals("kept", r:cli("GET", "k"))
    end)
  end)

  describe("postgres", function()
    local p
    setup(function() p = servers.postgres() end)
    teardown(function() if p then p:destroy() end end)

    it("accepts connections over TCP as postgres with trust auth", function()
      assert.matches("^postgresql://postgres@127%.0%.0%.1:%d+/postgres$", p.url)
      local f = assert(io.popen(("env -u LD_PRELOAD psql -X -At %q -c 'select 40 + 2'"):format(p.url)))
      assert.equals("42\n", f:read("a"))
      f:close()
    end)

    it("creates separate databases", function()
      local url = p:create_database("servers_spec_db")
      assert.matches("/servers_spec_db$", url)
      p:psql("create table t (v text)", "servers_spec_db")
      assert.equals("0", p:psql("select count(*) from t", "servers_spec_db"))
    end)

    it("raises with psql's message on a bad statement", function()
      local ok, err = pcall(p.psql, p, "select from nowhere_at_all")
      assert.is_false(ok)
      assert.matches("nowhere_at_all", err)
    end)

    it("keeps committed data across an immediate (crash) restart on the same port", function()
      p:psql("create table crash_t (v int); insert into crash_t values (7)")
      local port = p.port
      p:restart("immediate")
      assert.equals(port, p.port)
      assert.equals("7", p:psql("select v from crash_t"))
    end)

    it("stops and starts again", function()
      p:stop()
      assert.is_false(p:running())
      p:start()
      assert.is_true(p:running())
    end)

    it("does not run the server as root", function()
      assert.is_number(p.pid)
      local f = assert(io.popen(("env -u LD_PRELOAD ps -o uid= -p %d 2>&1"):format(p.pid)))
      local out = f:read("a")
      f:close()
      local uid = tonumber(out:match("^%s*(%d+)%s*$"))
      assert.is_number(uid, "ps gave no user id for the PostgreSQL pid " .. p.pid .. ": " .. out)
      assert.are_not.equal(0, uid)
      -- as root, the server runs as the unprivileged user servers.sh made
      if command_output("id -u") == "0" then
        local user = os.getenv("SERVERS_PG_USER") or "moongraph-test"
        assert.are.equal(command_output("id -u " .. user), tostring(uid))
      end
    end)
  end)

  it("starts PostgreSQL with fsync on when asked to be durable, off by default", function()
    local fast = servers.postgres()
    local durable = servers.postgres { durable = true }
    local a, b = fast:psql("SHOW fsync"), durable:psql("SHOW fsync")
    fast:destroy()
    durable:destroy()
    assert.equal("off", a)
    assert.equal("on", b)
  end)

  it("starts Redis with the append-only file policy asked for", function()
    local r = servers.redis { appendfsync = "everysec" }
    local got = r:cli("CONFIG", "GET", "appendfsync")
    local aof = r:cli("CONFIG", "GET", "appendonly")
    r:destroy()
    assert.equal("appendfsync\neverysec", got)
    assert.equal("appendonly\nyes", aof)
  end)

  it("refuses to start a server without ss instead of guessing a free port", function()
    -- a PATH with the server programs and what servers.sh needs before it
    -- looks for a port, but no ss
    local bin = tmp.dir("path")
    for _, prog in ipairs { "redis-server", "redis-cli", "psql", "ls", "sort" } do
      local where = command_output("command -v " .. prog)
      assert(os.execute(("ln -s '%s' '%s/%s'"):format(where, bin, prog)))
    end
    for _, kind in ipairs { "redis", "pg" } do
      local f = assert(io.popen(("env PATH='%s' /bin/sh '%s' %s start 2>&1; echo \"exit=$?\""):format(
        bin, servers.script, kind)))
      local out = f:read("a")
      f:close()
      assert.matches("servers.sh: ss not found (install the iproute2 package)", out, 1, true)
      assert.matches("exit=1\n$", out)
    end
  end)

  it("destroy removes the instance's directory", function()
    local r = servers.redis()
    local dir = r.dir
    assert.is_true(exists(dir .. "/server.env"))
    r:destroy()
    assert.is_false(exists(dir .. "/server.env"))
    assert.is_true(os.execute("test ! -e '" .. dir .. "'"))
  end)

  it("a watchdog removes instances whose owner died", function()
    -- A child Lua process starts a server and exits without destroying it.
    local cmd = ("cd %q && lua5.4 -e 'package.path=\"spec/support/?.lua;\"..package.path; " ..
      "io.write(require(\"servers\").redis().dir)'"):format(".")
    local f = assert(io.popen(cmd))
    local dir = f:read("a")
    f:close()
    assert.matches("moongraph%-redis", dir)
    -- The watchdog polls its owner once a second; wait for it with a bound.
    local deadline = os.time() + 10
    while exists(dir .. "/server.env") and os.time() < deadline do
      os.execute("sleep 0.1")
    end
    assert.is_false(exists(dir .. "/server.env"))
  end)
end)
