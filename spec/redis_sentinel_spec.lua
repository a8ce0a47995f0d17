-- redis-sentinel:// URLs against real servers: a master, one replica and
-- three Redis Sentinels on free local ports. The client finds the master
-- through the sentinels, checks it with ROLE, follows a demoted master to
-- the real one, and a worker goes on through a failover (kill -9 of the
-- master) answering each of 200 jobs exactly once.
local mg = require "moongraph"
local redis = require "moongraph.redis"
local servers = require "servers"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"
local cli = require "cli"

local STEPS = "steps=spec/support/worker_scripts/steps_recorded.lua"

describe("redis-sentinel:// URLs", function()
  describe("parsing", function()
    it("accepts a list of sentinels, the master's name, a database and passwords", function()
      local c = assert(redis.parse_url(
        "redis-sentinel://user:p%40w@10.0.0.1:26380,10.0.0.2,[::1]:5000/my%2Dmaster/3?sentinel_password=s%26p&timeout=2"))
      assert.same({ { host = "10.0.0.1", port = 26380, addr = "10.0.0.1:26380" },
                    { host = "10.0.0.2", port = 26379, addr = "10.0.0.2:26379" },
                    { host = "::1", port = 5000, addr = "::1:5000" } }, c.sentinels)
      assert.equal("my-master", c.master)
      assert.equal(3, c.db)
      assert.equal("user", c.user)
      assert.equal("p@w", c.password)
      assert.equal("s&p", c.sentinel_password)
      assert.equal(2, c.timeout)
      c = assert(redis.parse_url("redis-sentinel://h/m"))
      assert.equal(0, c.db)
      assert.is_nil(c.password)
      assert.is_nil(c.sentinel_password)
    end)

    it("rejects a URL without master name, hosts or a good port with the reason", function()
      local function err(url) return select(2, redis.parse_url(url)) end
      assert.matches("no master name", err("redis-sentinel://127.0.0.1:26379"))
      assert.matches("no master name", err("redis-sentinel://127.0.0.1:26379/"))
      assert.matches("no sentinel address", err("redis-sentinel:///mymaster"))
      assert.matches("no sentinel address", err("redis-sentinel://"))
      assert.matches("empty sentinel address", err("redis-sentinel://a:1,,b:2/mymaster"))
      assert.matches("bad port in sentinel address 'a:99999'", err("redis-sentinel://a:99999/mymaster"))
      assert.matches("bad port in sentinel address 'a:x'", err("redis-sentinel://a:1,a:x/mymaster"))
      assert.matches("no host in sentinel address ':1'", err("redis-sentinel://:1/mymaster"))
      assert.matches("bad database number", err("redis-sentinel://a/mymaster/x"))
      assert.matches("unknown URL parameter 'color'", err("redis-sentinel://a/mymaster?color=red"))
      assert.matches("sentinel_password is for redis%-sentinel://", err("redis://a?sentinel_password=x"))
      -- the form is in the message
      assert.matches("host%[:port%]%[,host%[:port%]%.%.%.%]/MASTER", err("redis-sentinel://a"))
      -- where URLs are taken, the same reasons come back
      local ok, e = pcall(redis.connect, "redis-sentinel://a:1")
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'connect' %(no master name", e)
      local res = cli.run { "worker", "--script", STEPS, "--pg", "postgresql://127.0.0.1:1/x",
                             "--redis", "redis-sentinel://a:1,b:0/m" }
      assert.equal(2, res.code)
      assert.matches("moongraph worker: %-%-redis: bad port in sentinel address 'b:0'", res.err)
      res = cli.run { "submit", "--redis", "redis-sentinel:///m", "hi" }
      assert.equal(2, res.code)
      assert.matches("moongraph submit: %-%-redis: no sentinel address", res.err)
    end)
  end)

  describe("against a master, a replica and three sentinels", function()
    local g

    setup(function()
      g = servers.redis_sentinel { password = "data-pw", sentinel_password = "sent-pw" }
      g:wait_ready(30)
    end)
    teardown(function() if g then g:destroy() end end)

    it("connects through the sentinels and runs commands on the master", function()
      mg.run(function()
        local r = assert(redis.connect(g.url))
        assert.equal("OK", r:call("SET", "k", "v"))
        assert.equal("v", r:call("GET", "k"))
        assert.equal("master", r:call("ROLE")[1])
        -- blocking commands and subscriptions find the master too
        assert(r:call("RPUSH", "list", "x"))
        assert.same({ "list", "x" }, r:call("BLPOP", "list", 1))
        local sub <close> = assert(r:subscribe("news"))
        assert.equal(1, r:call("PUBLISH", "news", "hi"))
        assert.equal("hi", assert(sub:next(2)).data)
        r:close()
      end)
      assert.equal("v", g.master:cli("GET", "k"))
    end)

    it("moongraph submit enqueues through the sentinels, waiting for the replica", function()
      local res = cli.run { "submit", "--redis", g.url, "--job", "cli-job-1", "hello" }
      assert.equal(0, res.code, res.err)
      assert.matches("cli%-job%-1", res.out)
      assert.matches("cli%-job%-1", g.master:cli("XRANGE", "moongraph:jobs", "-", "+"))
      -- WAIT 1 returned: the replica has it too
      assert.matches("cli%-job%-1", g.replica:cli("XRANGE", "moongraph:jobs", "-", "+"))
    end)

    it("submit says so when no replica confirmed the job in time", function()
      local lone = servers.redis()
      local ok, err = pcall(mg.run, function()
        local c = assert(client.connect(lone.url, { replicas = 1, replicas_timeout = 0.2 }))
        local id, serr = c:submit { job_id = "lonely-1", input = { message = "hi" } }
        assert.is_nil(id)
        assert.equal("job lonely-1 reached 0 of 1 replicas within 0.2 s, so a failover could lose it; "
          .. "submitting it again with the same job_id is safe (it is answered once)", serr)
        c:close()
        assert.equal(0, assert(client.connect(lone.url)).replicas)
        assert.has_error(function() client.connect(lone.url, { replicas = -1 }) end,
          "bad option 'replicas' to 'connect' (non-negative integer expected)")
      end)
      lone:destroy()
      assert(ok, err)
    end)

    it("asks the sentinels in turn: an unreachable one first does not matter", function()
      local dead = servers.redis()
      local dead_port = dead.port
      dead:destroy()
      local url = g.url:gsub("@", "@127.0.0.1:" .. dead_port .. ",", 1)
      mg.run(function()
        local r = assert(redis.connect(url))
        assert.equal("OK", r:call("SET", "k2", "v2"))
        r:close()
      end)
      assert.equal("v2", g.master:cli("GET", "k2"))
    end)

    it("reports why it cannot connect: unknown master, wrong passwords (at once), no sentinel", function()
      mg.run(function()
        local base = g.url:match("^(redis%-sentinel://[^/]*/)")
        local t0 = mg.now()
        local _, err = redis.connect(base:gsub("data%-pw", "nope") .. "mymaster?sentinel_password=sent-pw")
        assert.matches("AUTH on 127.0.0.1:" .. g.master.port .. " failed", err)
        _, err = redis.connect(base .. "othermaster?sentinel_password=sent-pw")
        assert.matches("no sentinel gave the address of master 'othermaster'", err)
        assert.matches("does not know master 'othermaster'", err)
        _, err = redis.connect(base .. "mymaster?sentinel_password=wrong")
        assert.matches("AUTH on sentinel 127.0.0.1:%d+ failed", err)
        assert.is_true(mg.now() - t0 < 1, "a refusal was retried as if a failover were going on")
        -- unreachable sentinels may come back: tried until the connect timeout
        t0 = mg.now()
        _, err = redis.connect("redis-sentinel://127.0.0.1:1/mymaster?connect_timeout=0.5")
        assert.matches("no sentinel gave the address of master 'mymaster' %(redis: cannot connect to 127.0.0.1:1", err)
        local took = mg.now() - t0
        assert.is_true(took >= 0.3 and took < 2, "took " .. took .. " s")
      end)
    end)

    it("refuses an address that is no master (ROLE), within the command's time", function()
      -- a sentinel told to watch the replica as if it were a master
      local wrong = servers.redis { sentinel_of = g.replica.port, master_name = "fake",
                                    master_password = "data-pw" }
      local ok, err = pcall(function()
        mg.run(function()
          local url = "redis-sentinel://:data-pw@127.0.0.1:" .. wrong.port .. "/fake?connect_timeout=0.4"
          local t0 = mg.now()
          local r, cerr = redis.connect(url)
          assert.is_nil(r)
          assert.matches("127.0.0.1:" .. g.replica.port .. ", given as the master, is a slave", cerr)
          assert.is_true(mg.now() - t0 < 2)
        end)
      end)
      wrong:destroy()
      assert(ok, err)
    end)

    it("a command refused by a demoted master (READONLY) goes to the master found again", function()
      mg.run(function()
        local r = assert(redis.connect(g.url, { timeout = 5 }))
        assert.equal("OK", r:call("SET", "before", "1"))
        -- the master becomes a replica (of nothing reachable) behind the
        -- connection's back, and is made a master again 0.5 s later
        local dead = servers.redis()
        local dead_port = dead.port
        dead:destroy()
        assert.equal("OK", g.master:cli("REPLICAOF", "127.0.0.1", tostring(dead_port)))
        local restorer = mg.spawn(function()
          mg.sleep(0.5)
          assert.equal("OK", g.master:cli("REPLICAOF", "NO", "ONE"))
        end)
        local t0 = mg.now()
        assert.equal("OK", r:call("SET", "after", "2"))
        assert.is_true(mg.now() - t0 >= 0.4, "the SET did not wait for a master")
        restorer:join()
        -- the same for a pipeline (a write in it was refused: none ran)
        assert.equal("OK", g.master:cli("REPLICAOF", "127.0.0.1", tostring(dead_port)))
        restorer = mg.spawn(function()
          mg.sleep(0.3)
          assert.equal("OK", g.master:cli("REPLICAOF", "NO", "ONE"))
        end)
        assert.same({ "1", "OK", 1 }, r:pipeline { { "GET", "before" }, { "SET", "p", "3" }, { "INCR", "n" } })
        restorer:join()
        -- within a shorter timeout it fails with the reason
        local short = assert(redis.connect(g.url, { timeout = 0.3 }))
        assert.equal("OK", g.master:cli("REPLICAOF", "127.0.0.1", tostring(dead_port)))
        local res, err = short:call("SET", "late", "x")
        assert.equal("OK", g.master:cli("REPLICAOF", "NO", "ONE"))
        assert.is_nil(res)
        assert.matches("is a slave", err)
        r:close()
        short:close()
      end)
      assert.equal("2", g.master:cli("GET", "after"))
      assert.equal("3", g.master:cli("GET", "p"))
      g:wait_ready(30)
    end)
  end)

  describe("a failover under a running worker", function()
    local env

    setup(function()
      env = wenv.new { sentinel = {} }
      env.sentinel:wait_ready(30)
    end)
    teardown(function() if env then env:destroy() end end)

    it("kill -9 of the master in the middle of 200 jobs: every job answered exactly once", function()
      local g = env.sentinel
      local old_port = g.master.port
      local w = env:worker { "--script", STEPS, "--concurrency", "8",
                             "--claim-idle", "2", "--claim-interval", "0.25" }
      local N = 200
      mg.run(function()
        w:wait_started(30)
        local db = require("moongraph.pg").connect(env.pg_url)
        local c = assert(client.connect(env.redis_url))
        assert.equal(1, c.replicas)            -- submit waits for the replica
        local ids = {}
        for i = 1, N do
          ids[i] = assert(c:submit { thread_id = "conv-" .. i, job_id = string.format("job-%04d", i),
                                     input = { message = "sleep=0.08 tokens=4 gap=0.01 job " .. i } })
        end
        local function done() return assert(db:query("SELECT count(*)::int AS n FROM job_results"))[1].n end
        wenv.eventually("a quarter of the results", 30, function() return done() >= N / 4 end)
        assert.is_true(done() < N, "the run ended before the failover")
        g.master:stop("kill")
        local t_kill = mg.now()
        wenv.eventually("the sentinels to promote the replica", 30, function()
          local p = g:master_port()
          return p and p ~= old_port
        end)
        local failover_s = mg.now() - t_kill
        assert.equal(g.replica.port, g:master_port())
        wenv.eventually("200 results", 40, function() return done() == N end)
        local r = c.redis
        wenv.eventually("every job acknowledged", 20, function()
          local p = r:call("XPENDING", "moongraph:jobs", "moongraph")
          return type(p) == "table" and p[1] == 0
        end)
        -- exactly once: one result per job, one record per job, one answer
        -- and one done event per job on the new master
        local rows = assert(db:query("SELECT job_id, status FROM job_results"))
        assert.equal(N, #rows)
        local by = {}
        for _, row in ipairs(rows) do by[row.job_id] = row.status end
        for _, id in ipairs(ids) do assert.equal("done", by[id], id) end
        local rec = assert(db:query(
          "SELECT count(*)::int AS n, count(DISTINCT job_id)::int AS jobs FROM stepspec_turns"))[1]
        assert.equal(N, rec.n)
        assert.equal(N, rec.jobs)
        for _, id in ipairs(ids) do
          local answers, dones = 0, 0
          for _, e in ipairs(assert(r:call("XRANGE", "moongraph:events:" .. id, "-", "+"))) do
            if e[2][2] == "answer" then answers = answers + 1 end
            if e[2][2] == "done" then dones = dones + 1 end
          end
          assert.equal(1, answers, id .. " answers")
          assert.equal(1, dones, id .. " done events")
        end
        assert.equal(0, r:call("XLEN", "moongraph:jobs"))
        assert.equal(0, r:call("XLEN", "moongraph:jobs:dead"))
        assert.equal("master", r:call("ROLE")[1])
        print(string.format("\n  failover: replica promoted %.1f s after the kill", failover_s))
        c:close()
        db:close()
      end)
      assert.is_true(w:running(), "the worker died with the master")
      if os.getenv("SENTINEL_SPEC_LOG") then io.stderr:write(w:log()) end
      w:signal("TERM")
      mg.run(function() assert.equal(0, w:wait(30)) end)
    end)
  end)
end)
