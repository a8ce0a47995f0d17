-- moongraph.redis against a real, throwaway redis-server.
local mg = require "moongraph"
local redis = require "moongraph.redis"
local servers = require "servers"

local null = redis.null

describe("moongraph.redis", function()
  local srv

  setup(function() srv = servers.redis() end)
  teardown(function() if srv then srv:destroy() end end)

  local function run(fn) return mg.run(fn) end

  local function connect(opts)
    return assert(redis.connect(srv.url, opts))
  end

  describe("commands and replies", function()
    it("maps status, bulk, integer, nil and array replies", function()
      run(function()
        local r = connect()
        assert.equal("OK", r:call("SET", "k", "v"))
        assert.equal("v", r:call("GET", "k"))
        assert.equal(null, r:call("GET", "no-such-key"))
        assert.equal(3, r:call("RPUSH", "list", "a", "b", "c"))
        assert.equal(math.type(r:call("LLEN", "list")), "integer")
        assert.same({ "a", "b", "c" }, r:call("LRANGE", "list", 0, -1))
        assert.same({ "v", null }, r:call("MGET", "k", "no-such-key"))
        assert.same({}, r:call("LRANGE", "no-such-list", 0, -1))
        r:close()
      end)
    end)

    it("returns nil and Redis' message for an error reply, and stays usable", function()
      run(function()
        local r = connect()
        r:call("SET", "str", "x")
        local v, err = r:call("LPUSH", "str", "y")
        assert.is_nil(v)
        assert.matches("^WRONGTYPE", err)
        v, err = r:call("NOSUCHCOMMAND")
        assert.is_nil(v)
        assert.matches("unknown command", err)
        assert.equal("PONG", r:call("PING"))
      end)
    end)

    it("sends arguments binary safe, never formatted", function()
      run(function()
        local r = connect()
        local weird = "a\0b\r\n*3\r\n$3\r\nSET %s %d \255\254"
        assert.equal("OK", r:call("SET", weird, weird))
        assert.equal(weird, r:call("GET", weird))
        local big = string.rep("x\0", 512 * 1024)
        assert.equal("OK", r:call("SET", "big", big))
        assert.equal(big, r:call("GET", "big"))
        -- the same through a pipeline, with small commands around the big one
        local res = assert(r:pipeline {
          { "SET", "p1", weird }, { "SET", "p2", big }, { "SET", "p3", 7 },
          { "GET", "p1" }, { "GET", "p2" }, { "GET", "p3" },
        })
        assert.same({ "OK", "OK", "OK", weird, big, "7" }, res)
      end)
    end)

    it("sends integers and floats without losing precision", function()
      run(function()
        local r = connect()
        r:call("SET", "i", math.maxinteger)
        assert.equal(tostring(math.maxinteger), r:call("GET", "i"))
        r:call("SET", "f", 0.1)
        assert.equal("0.1", r:call("GET", "f"))
        r:call("SET", "g", 1 / 3)
        assert.equal(1 / 3, tonumber(r:call("GET", "g")))
        assert.equal(-5, r:call("INCRBY", "n", -5))
      end)
    end)

    it("serves many tasks on one connection, each getting its own reply", function()
      run(function()
        local r = connect()
        r:call("DEL", "ctr")
        local fns = {}
        for i = 1, 64 do
          fns[i] = function()
            r:call("SET", "task:" .. i, i)
            return r:call("GET", "task:" .. i), r:call("INCR", "ctr")
          end
        end
        local res = mg.gather(fns)
        for i = 1, 64 do
          assert.is_true(res[i].ok)
          assert.equal(tostring(i), res[i].value)
        end
        assert.equal("64", r:call("GET", "ctr"))
      end)
    end)

    it("raises on misuse", function()
      run(function()
        local r = connect()
        assert.has_error(function() r:call({}) end,
          "bad argument #1 to 'call' (command name expected, got table)")
        assert.has_error(function() r:call("SET", "k", {}) end,
          "bad argument #3 to 'call' (string or number expected, got table)")
        assert.has_error(function() r:call("SET", "k", 0 / 0) end,
          "bad argument #3 to 'call' (NaN cannot be sent to Redis)")
        assert.has_error(function() r:call("SET", "k", nil) end,
          "bad argument #3 to 'call' (string or number expected, got nil)")
        for _, cmd in ipairs { "MULTI", "SUBSCRIBE", "SELECT", "AUTH", "WATCH", "QUIT" } do
          local ok, err = pcall(r.call, r, cmd, "x")
          assert.is_false(ok)
          assert.matches("bad argument #1 to 'call'", err)
        end
      end)
    end)

    it("cannot be used outside a task", function()
      local r = run(function() return connect() end)
      local ok, err = pcall(r.call, r, "PING")
      assert.is_false(ok)
      assert.matches("not inside a moongraph task", err)
    end)
  end)

  describe("URLs", function()
    it("parses the forms it accepts", function()
      assert.same({ host = "h", port = 6379, db = 0, addr = "h:6379", connect_timeout = 5 },
        redis.parse_url("redis://h"))
      local c = assert(redis.parse_url("redis://:p%40ss@10.0.0.1:7000/3?timeout=1.5"))
      assert.equal("p@ss", c.password)
      assert.equal(7000, c.port)
      assert.equal(3, c.db)
      assert.equal(1.5, c.timeout)
      c = assert(redis.parse_url("redis://user:pw@[::1]:6380/1"))
      assert.equal("::1", c.host)
      assert.equal("user", c.user)
      c = assert(redis.parse_url("unix:///tmp/r.sock?db=2"))
      assert.equal("/tmp/r.sock", c.path)
      assert.equal(2, c.db)
    end)

    it("rejects malformed URLs with the reason", function()
      assert.matches("TLS", select(2, redis.parse_url("rediss://h")))
      assert.matches("scheme", select(2, redis.parse_url("http://h")))
      assert.matches("database", select(2, redis.parse_url("redis://h:1/x")))
      assert.matches("unknown URL parameter", select(2, redis.parse_url("redis://h?color=red")))
      assert.has_error(function() redis.connect("nonsense") end,
        "bad argument #1 to 'connect' (not a redis://, redis-sentinel:// or unix:// URL: nonsense)")
    end)

    it("selects the URL's database", function()
      run(function()
        local url = srv.url:gsub("/0$", "/5")
        local r = assert(redis.connect(url))
        r:call("SET", "in-db-5", "yes")
      end)
      assert.equal("yes", srv:cli("-n", "5", "GET", "in-db-5"))
      assert.equal("", srv:cli("GET", "in-db-5"))
    end)

    it("connects over a unix socket", function()
      run(function()
        local r = assert(redis.connect(srv.unix_url))
        assert.equal("PONG", r:call("PING"))
      end)
    end)

    it("reports a refused connection without hanging", function()
      local r, err = run(function() return redis.connect("redis://127.0.0.1:1/0") end)
      assert.is_nil(r)
      assert.matches("cannot connect to 127.0.0.1:1", err)
    end)
  end)

  describe("with a password", function()
    local auth
    setup(function() auth = servers.redis{ password = "s3cret" } end)
    teardown(function() if auth then auth:destroy() end end)

    it("authenticates on connect and on reconnect", function()
      run(function()
        local r = assert(redis.connect(auth.url))
        assert.equal("OK", r:call("SET", "a", "1"))
        r.raw:close()                             -- drop the socket under it
        assert.equal("1", r:call("GET", "a"))
      end)
    end)

    it("fails with the AUTH error for a wrong password", function()
      local r, err = run(function() return redis.connect((auth.url:gsub("s3cret", "wrong"))) end)
      assert.is_nil(r)
      assert.matches("AUTH", err)
    end)
  end)

  describe("pipelines", function()
    it("sends queued commands together and returns replies in order", function()
      run(function()
        local r = connect()
        local res = assert(r:pipeline(function(p)
          p:call("SET", "p1", "a")
          p:call("GET", "p1")
          p:call("LPUSH", "p1", "x")               -- wrong type
          p:call("GET", "no-such-key")
        end))
        assert.equal("OK", res[1])
        assert.equal("a", res[2])
        assert.same({ false, res[3][2] }, res[3])
        assert.matches("^WRONGTYPE", res[3][2])
        assert.equal(null, res[4])
        assert.same({ "OK", "a" }, r:pipeline({ { "SET", "p2", "a" }, { "GET", "p2" } }))
        assert.same({}, r:pipeline(function() end))
      end)
    end)

    it("runs MULTI ... EXEC atomically among other tasks' commands", function()
      run(function()
        local r = connect()
        r:call("SET", "bal", 0)
        local fns = {}
        for i = 1, 20 do
          fns[i] = function()
            if i % 2 == 0 then
              return r:pipeline(function(p)
                p:call("MULTI"); p:call("INCR", "bal"); p:call("INCR", "bal"); p:call("EXEC")
              end)
            end
            return r:call("GET", "bal")
          end
        end
        local res = mg.gather(fns)
        for i = 1, 20 do
          assert.is_true(res[i].ok)
          if i % 2 == 0 then
            local exec = res[i].value[4]
            assert.equal(exec[1] + 1, exec[2])      -- nothing slipped in between
          else
            assert.equal(0, tonumber(res[i].value) % 2)  -- never half a transaction
          end
        end
        assert.equal("20", r:call("GET", "bal"))
      end)
    end)

    it("refuses blocking commands and subscriptions", function()
      run(function()
        local r = connect()
        assert.has_error(function() r:pipeline(function(p) p:call("BLPOP", "x", 0) end) end,
          "bad argument #1 to 'call' (blocking command BLPOP cannot be pipelined; use conn:call)")
        assert.has_error(function() r:pipeline(function(p) p:call("SUBSCRIBE", "x") end) end,
          "bad argument #1 to 'call' (SUBSCRIBE cannot be sent on a shared connection: use conn:subscribe(channels))")
        assert.has_error(function() r:pipeline(function(p) p:call("SET", "x", {}) end) end,
          "bad argument #3 to 'call' (string or number expected, got table)")
      end)
    end)

    it("takes WAIT after the writes it waits for", function()
      run(function()
        local r = connect()
        -- no replica here: WAIT gives 0 once its timeout is over
        local t0 = mg.now()
        assert.same({ "OK", 0 }, r:pipeline { { "SET", "w", "1" }, { "WAIT", 1, 100 } })
        assert.is_true(mg.now() - t0 >= 0.09)
        assert.same({ "OK", 0 }, r:pipeline { { "SET", "w", "2" }, { "WAIT", 0, 0 } })
      end)
    end)
  end)

  describe("blocking commands", function()
    it("BLPOP waits on its own connection while others go on", function()
      run(function()
        local r = connect()
        r:call("DEL", "jobs")
        local waiter = mg.spawn(function() return r:call("BLPOP", "jobs", 0) end)
        mg.sleep(0)
        -- the shared connection is not blocked by the waiting BLPOP
        for i = 1, 10 do assert.equal("OK", r:call("SET", "other", i)) end
        assert.is_false(waiter:done())
        r:call("RPUSH", "jobs", "job-1")
        local ok, got = waiter:join()
        assert.is_true(ok)
        assert.same({ "jobs", "job-1" }, got)
      end)
    end)

    it("XREAD BLOCK receives entries added later; a server timeout gives null", function()
      run(function()
        local r = connect()
        r:call("DEL", "stream")
        local reader = mg.spawn(function()
          return r:call("XREAD", "COUNT", 10, "BLOCK", 0, "STREAMS", "stream", "$")
        end)
        mg.sleep(0.05)
        local id = r:call("XADD", "stream", "*", "token", "hello")
        local ok, got = reader:join()
        assert.is_true(ok)
        assert.equal("stream", got[1][1])
        assert.equal(id, got[1][2][1][1])
        assert.same({ "token", "hello" }, got[1][2][1][2])
        assert.equal(null, r:call("BLPOP", "empty-list", 0.05))
      end)
    end)

    it("a cancelled blocking command does not disturb the connection", function()
      run(function()
        local r = connect()
        local t = mg.spawn(function() return r:call("BLPOP", "never", 0) end)
        -- the BLPOP waits in Redis before it is cancelled (a bounded poll
        -- for a client blocked, flag b, in a BLPOP)
        local n = 0
        for _ = 1, 500 do
          n = 0
          for line in srv:cli("CLIENT", "LIST"):gmatch("[^\n]+") do
            if line:find(" flags=%a*b") and line:find(" cmd=blpop", 1, true) then n = n + 1 end
          end
          if n == 1 then break end
          mg.sleep(0.01)
        end
        assert.equal(1, n)
        assert.is_true(t:cancel())
        local ok, err = t:join()
        assert.is_false(ok)
        assert.equal("cancelled", err)
        r:call("RPUSH", "never", "late")
        assert.equal("late", r:call("LPOP", "never"))
      end)
    end)
  end)

  describe("subscriptions", function()
    it("delivers messages published after subscribe returns", function()
      run(function()
        local r = connect()
        local sub = assert(r:subscribe({ "news", "sport" }))
        assert.equal(1, r:call("PUBLISH", "news", "a\0b"))
        r:call("PUBLISH", "sport", "goal")
        local m = assert(sub:next(1))
        assert.same({ kind = "message", channel = "news", data = "a\0b" }, m)
        m = assert(sub:next(1))
        assert.equal("sport", m.channel)
        assert.same({ nil, "timeout" }, { sub:next(0.02) })
        sub:close()
        local none, cerr = sub:next()
        assert.is_nil(none)
        assert.equal("redis: subscription closed", tostring(cerr))
        assert.equal("cancelled", cerr.code)
      end)
    end)

    it("iterates with a for loop inside a task and matches patterns", function()
      run(function()
        local r = connect()
        local sub = assert(r:psubscribe("job:*"))
        mg.spawn(function()
          for i = 1, 3 do r:call("PUBLISH", "job:" .. i, "payload " .. i) end
          r:call("PUBLISH", "other", "ignored")
        end)
        local got = {}
        for msg in sub:messages(0.5) do
          got[#got + 1] = msg.channel .. "=" .. msg.data
          assert.equal("pmessage", msg.kind)
          assert.equal("job:*", msg.pattern)
          if #got == 3 then break end
        end
        assert.same({ "job:1=payload 1", "job:2=payload 2", "job:3=payload 3" }, got)
        sub:close()
      end)
    end)

    it("adds and removes channels", function()
      run(function()
        local r = connect()
        local sub = assert(r:subscribe("a"))
        assert.is_true(sub:subscribe({ "b" }))
        assert.is_true(sub:unsubscribe("a"))
        assert.equal(0, r:call("PUBLISH", "a", "x"))
        assert.equal(1, r:call("PUBLISH", "b", "y"))
        assert.equal("y", sub:next(1).data)
        sub:close()
      end)
    end)

    it("reports a lost connection once, then subscribes again", function()
      run(function()
        local r = connect()
        local sub = assert(r:subscribe("ch"))
        assert.equal(1, r:call("CLIENT", "KILL", "TYPE", "pubsub"))
        local m, err = sub:next(1)
        assert.is_nil(m)
        assert.matches("^redis: connection lost", err)
        assert.same({ nil, "timeout" }, { sub:next(0.05) })   -- resubscribed
        assert.equal(1, r:call("PUBLISH", "ch", "back"))
        assert.equal("back", sub:next(1).data)
        sub:close()
      end)
    end)
  end)

  describe("timeouts and closing", function()
    it("a command that exceeds the timeout fails; the next one reconnects", function()
      run(function()
        local r = connect{ timeout = 0.1 }
        local v, err = r:call("DEBUG", "SLEEP", 0.5)
        assert.is_nil(v)
        assert.equal("redis: timeout after 0.1s", tostring(err))
        assert.equal("timeout", err.code)
        assert.is_true(err.retryable)
        assert.is_false(r:connected())            -- closed, its state unknown
        r:set_timeout(nil)                        -- DEBUG SLEEP holds the whole server
        assert.equal("PONG", r:call("PING"))
      end)
    end)

    it("fails every command after close", function()
      run(function()
        local r = connect()
        r:close()
        for _, got in ipairs{ { r:call("PING") }, { r:pipeline({ { "PING" } }) } } do
          assert.is_nil(got[1])
          assert.equal("redis: connection closed", tostring(got[2]))
          assert.equal("cancelled", got[2].code)
          assert.is_false(got[2].retryable)
        end
      end)
    end)

    it("cancelling a task mid-command leaves the connection in order", function()
      run(function()
        local r = connect()
        local function debug_calls()
          return tonumber(srv:cli("INFO", "commandstats"):match("cmdstat_debug:calls=(%d+)")) or 0
        end
        local before = debug_calls()
        local t = mg.spawn(function() return r:call("DEBUG", "SLEEP", 0.2) end)
        mg.sleep(0)   -- the task runs until it waits on the reply
        assert.is_true(t:cancel())
        assert.is_false((t:join()))
        -- the orphaned reply is consumed, later replies stay matched
        assert.equal("OK", r:call("SET", "after", "1"))
        assert.equal("1", r:call("GET", "after"))
        -- and the DEBUG SLEEP did reach Redis: its reply was the orphaned one
        assert.equal(before + 1, debug_calls())
      end)
    end)
  end)

  describe("pools", function()
    it("spreads 64 tasks over its connections", function()
      run(function()
        local p = redis.pool(srv.url, { size = 3 })
        local fns = {}
        for i = 1, 64 do fns[i] = function() return p:call("INCR", "pool-ctr") end end
        local res = mg.gather(fns)
        local seen = {}
        for i = 1, 64 do seen[res[i].value] = true end
        for i = 1, 64 do assert.is_true(seen[i]) end
        local opened = 0
        for _, c in ipairs(p.conns) do if c:connected() then opened = opened + 1 end end
        assert.is_true(opened >= 1 and opened <= 3)
        p:close()
      end)
    end)

    it("raises on bad options", function()
      assert.has_error(function() redis.pool(srv.url, { size = 0 }) end,
        "bad argument #2 to 'pool' (size must be a positive integer)")
      assert.has_error(function() redis.pool(srv.url, { colour = 1 }) end,
        "bad argument #2 to 'pool' (unknown option 'colour')")
    end)
  end)

  describe("server restarts", function()
    it("a command after a restart reconnects", function()
      run(function()
        local r = connect()
        assert.equal("PONG", r:call("PING"))
        srv:restart()
        -- the loss is noticed on the idle socket or by the first command;
        -- either way nothing hangs and the command after succeeds
        local v, err = r:call("PING")
        if v == nil then
          assert.matches("^redis: ", err)
          v = r:call("PING")
        end
        assert.equal("PONG", v)
      end)
    end)

    it("fails clearly while the server is down and recovers when it is back", function()
      run(function()
        local r = connect()
        local p = redis.pool(srv.url, { size = 2 })
        assert.equal("PONG", p:call("PING"))
        srv:stop()
        local v, err = r:call("PING")
        assert.is_nil(v)
        assert.matches("^redis: ", err)
        v, err = r:call("PING")
        assert.is_nil(v)
        assert.matches("cannot connect to 127%.0%.0%.1:%d+", err)
        v, err = p:call("PING")
        assert.is_nil(v)
        assert.matches("^redis: ", err)
        srv:start()
        assert.equal("PONG", r:call("PING"))
        assert.equal("PONG", p:call("PING"))
      end)
    end)

    it("commands in flight when the server dies fail; none hangs", function()
      run(function()
        local r = connect()
        local blocked, busy = {}, {}
        for i = 1, 4 do
          blocked[i] = mg.spawn(function() return r:call("BLPOP", "nothing-" .. i, 0) end)
        end
        -- wait (bounded) until Redis reports the four BLPOPs blocked
        local n = 0
        for _ = 1, 500 do
          n = select(2, srv:cli("CLIENT", "LIST"):gsub("cmd=blpop", ""))
          if n == 4 then break end
          mg.sleep(0.01)
        end
        assert.equal(4, n)
        for i = 1, 4 do busy[i] = mg.spawn(function() return r:call("DEBUG", "SLEEP", 0.5) end) end
        mg.sleep(0.05)
        srv:restart("kill")
        for i = 1, 4 do
          local ok, v, err = blocked[i]:join()
          assert.is_true(ok)
          assert.is_nil(v)
          assert.matches("^redis: connection lost", err)
        end
        -- the shared connection's commands fail with the server, or (when a
        -- task issued its command only after the loss was noticed) run on a
        -- new connection; none is left hanging and none is sent twice
        for i = 1, 4 do
          local ok, v, err = busy[i]:join()
          assert.is_true(ok)
          if v == nil then assert.matches("^redis: ", err) else assert.equal("OK", v) end
        end
        assert.equal("PONG", r:call("PING"))
      end)
    end)
  end)
end)
