-- Errors as values (moongraph.errors, runtime/errors.c): a code made where
-- the fact is known, checked against real Postgres, Redis, HTTP servers and
-- programs, and read like the strings they used to be.
local mg = require "moongraph"
local errors = require "moongraph.errors"
local pg = require "moongraph.pg"
local redis = require "moongraph.redis"
local http = require "moongraph.http"
local process = require "moongraph.process"
local servers = require "servers"
local testserver = require "testserver"

describe("moongraph.errors", function()
  describe("a value that reads like its message", function()
    local err = errors.new("timeout", "timeout after 2s", { retryable = true, details = { host = "h:1" } })

    it("keeps its code, retryable and details", function()
      assert.is_true(errors.is(err))
      assert.same({ "timeout", true, "h:1" }, { err.code, err.retryable, err.details.host })
      assert.equal("timeout", errors.code(err))
      assert.is_true(errors.retryable(err))
      assert.same({ host = "h:1" }, errors.details(err))
    end)

    it("gives its message to tostring, .., %s, # and string methods", function()
      assert.equal("timeout after 2s", tostring(err))
      assert.equal("x: timeout after 2s", "x: " .. err)
      assert.equal("timeout after 2s!", err .. "!")
      assert.equal("[timeout after 2s]", string.format("[%s]", err))
      assert.equal(16, #err)
      assert.equal(9, (err:find("after", 1, true)))
      assert.equal("2s", err:match("%d+s"))
      assert.equal("TIMEOUT AFTER 2S", err:upper())
      assert.matches("after 2s", err)                -- luassert sees a string
    end)

    it("travels through error() and pcall unchanged", function()
      local ok, got = pcall(error, err)
      assert.is_false(ok)
      assert.equal(err, got)
    end)

    it("leaves plain strings without a code", function()
      assert.is_false(errors.is("boom"))
      assert.is_nil(errors.code("boom"))
      assert.is_false(errors.retryable("boom"))
      assert.is_false(errors.has("boom", "timeout"))
      assert.equal("boom", errors.message("boom"))
    end)

    it("matches a code exactly or by its server's name", function()
      local e = errors.new("pg:40001", "could not serialize")
      assert.is_true(errors.has(e, "pg:40001"))
      assert.is_true(errors.has(e, "timeout", "pg"))
      assert.is_false(errors.has(e, "pg:4"))
      assert.is_false(errors.has(e, "redis"))
    end)

    it("wraps a cause, keeping its retryable, and finds it again", function()
      local cause = errors.new("unavailable", "redis: connection lost", { retryable = true })
      local w = errors.wrap(cause, "node_failed", "node 'x' failed: " .. cause, { node = "x" })
      assert.same({ "node_failed", true, "x" }, { w.code, w.retryable, w.details.node })
      assert.equal(cause, errors.find(w, "unavailable"))
      assert.equal(w, errors.find(w, "node_failed"))
      assert.is_nil(errors.find(w, "conflict"))
      assert.equal("unavailable", errors.wrap(cause, nil, "again").code)   -- the cause's code
      assert.equal("failed", errors.wrap("plain", nil, "again").code)
      assert.is_false(errors.wrap("plain", "x", "y").retryable)
    end)

    it("refuses a code that is not a string", function()
      assert.has_error(function() errors.new(nil, "m") end, "bad argument #1 to 'new' (code string expected)")
    end)
  end)

  describe("made by the clients", function()
    local psrv, purl, rsrv, hsrv
    setup(function()
      psrv = servers.postgres()
      purl = psrv:create_database("errors_spec")
      rsrv = servers.redis()
      hsrv = testserver.start()
    end)
    teardown(function()
      if psrv then psrv:destroy() end
      if rsrv then rsrv:destroy() end
      if hsrv then hsrv:stop() end
    end)

    it("Postgres: the SQLSTATE, retryable where waiting heals it", function()
      local div, ser, missing, refused = mg.run(function()
        local db = assert(pg.connect(purl))
        local _, e1 = db:query("SELECT 1/0")
        local _, e2 = db:query("DO $$ BEGIN RAISE EXCEPTION 'busy' USING ERRCODE = '40001'; END $$")
        local _, e3 = db:query("SELECT * FROM no_such_table")
        local _, e4 = pg.connect("postgresql://nobody@127.0.0.1:1/x", { connect_timeout = 2 })
        return e1, e2, e3, e4
      end)
      assert.same({ "pg:22012", false, "22012" }, { div.code, div.retryable, div.details.sqlstate })
      assert.matches("^pg: ERROR: division by zero", tostring(div))
      assert.same({ "pg:40001", true }, { ser.code, ser.retryable })
      assert.same({ "pg:42P01", false }, { missing.code, missing.retryable })
      assert.same({ "unavailable", true }, { refused.code, refused.retryable })
    end)

    it("Postgres: a pool with no connection free in time is a timeout", function()
      local err = mg.run(function()
        local pool = assert(pg.pool(purl, { size = 1, acquire_timeout = 0.05 }))
        local holder = mg.spawn(function()
          return pool:transaction(function() mg.sleep(0.3) return true end)
        end)
        mg.sleep(0.02)
        local _, e = pool:query("SELECT 1")
        holder:join()
        pool:close()
        return e
      end)
      assert.same({ "timeout", true }, { err.code, err.retryable })
    end)

    it("Redis: the error reply's first word, retryable for a server that is not ready", function()
      local wrongtype, busygroup, closed = mg.run(function()
        local r = assert(redis.connect(rsrv.url))
        assert(r:call("SET", "k", "v"))
        local _, e1 = r:call("LPUSH", "k", "x")
        assert(r:call("XGROUP", "CREATE", "s", "g", "0", "MKSTREAM"))
        local _, e2 = r:call("XGROUP", "CREATE", "s", "g", "0", "MKSTREAM")
        r:close()
        local _, e3 = r:call("PING")
        return e1, e2, e3
      end)
      assert.same({ "redis:WRONGTYPE", false }, { wrongtype.code, wrongtype.retryable })
      assert.matches("^WRONGTYPE", tostring(wrongtype))
      assert.equal("redis:BUSYGROUP", busygroup.code)
      assert.same({ "cancelled", false }, { closed.code, closed.retryable })
    end)

    it("Redis: nested error replies are values too", function()
      local res = mg.run(function()
        local r = assert(redis.connect(rsrv.url))
        return assert(r:pipeline({ { "PING" }, { "NOSUCHCOMMAND" } }))
      end)
      assert.equal("PONG", res[1])
      assert.is_false(res[2][1])
      assert.equal("redis:ERR", res[2][2].code)
    end)

    it("HTTP: timeouts, refused connections and bodies over the limit", function()
      local slow, refused, big = mg.run(function()
        local _, e1 = http.get(hsrv.url .. "/delay?ms=2000", { timeout = 0.1 })
        local _, e2 = http.get("http://127.0.0.1:1/")
        local _, e3 = http.get(hsrv.url .. "/delay?ms=0&bytes=5000", { max_body = 10 })
        return e1, e2, e3
      end)
      assert.same({ "timeout", true }, { slow.code, slow.retryable })
      assert.same({ "unavailable", true, "127.0.0.1:1" }, { refused.code, refused.retryable, refused.details.host })
      assert.same({ "too_large", false }, { big.code, big.retryable })
    end)

    it("files: a missing file is not_found, a held lock busy, with the errno name kept", function()
      local core = require "moongraph.core"
      local dir = require("tmp").dir("errors")
      local missing, name, held, hname = mg.run(function()
        local _, e, n = core.files.read(dir .. "/nothing")
        local lock = assert(core.files.lock(dir .. "/l"))
        local _, e2, n2 = core.files.lock(dir .. "/l")
        lock:unlock()
        return e, n, e2, n2
      end)
      assert.same({ "not_found", false, "ENOENT", "ENOENT" }, { missing.code, missing.retryable, missing.details.errno, name })
      assert.same({ "busy", true, "EWOULDBLOCK" }, { held.code, held.retryable, hname })
    end)

    it("a program that does not exist is not_found", function()
      local _, err = mg.run(function() return process.run({ "/no/such/program" }) end)
      assert.same({ "not_found", false }, { err.code, err.retryable })
    end)
  end)

  describe("made by the engine", function()
    it("a node's failure names the node and keeps its cause", function()
      local cause = errors.new("unavailable", "redis: connection lost", { retryable = true })
      local g = mg.graph { "x" }
      g:add_node("fetch", function() error(cause) end)
      g:add_edge(mg.START, "fetch")
      local _, err = mg.run(function() return g:compile():invoke({}) end)
      assert.equal("node_failed", err.code)
      assert.equal("fetch", err.details.node)
      assert.equal(cause, err.details.cause)
      assert.is_true(err.retryable)
      assert.equal("node 'fetch' failed: redis: connection lost", tostring(err))
    end)

    it("a node over its timeout is a timeout inside node_failed", function()
      local g = mg.graph { "x" }
      g:add_node("slow", function() mg.sleep(1) end, { timeout = 0.05 })
      g:add_edge(mg.START, "slow")
      local _, err = mg.run(function() return g:compile():invoke({}) end)
      assert.equal("node_failed", err.code)
      assert.equal("timeout", errors.find(err, "timeout").code)
    end)

    it("a saver that fails is a checkpointer error with its cause", function()
      local saver = mg.checkpoint.memory()
      function saver.get() return nil, errors.new("unavailable", "db away", { retryable = true }) end
      local g = mg.graph { "x" }
      g:add_node("a", function() return { x = 1 } end)
      g:add_edge(mg.START, "a")
      local _, err = mg.run(function()
        return g:compile { checkpointer = saver }:invoke({}, { thread_id = "t" })
      end)
      assert.equal("checkpointer", err.code)
      assert.is_true(err.retryable)
      assert.equal("unavailable", err.details.cause.code)
      assert.equal("checkpointer get failed: db away", tostring(err))
    end)
  end)
end)
