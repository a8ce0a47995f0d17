-- The Redis and cached (Redis + Postgres) checkpoint savers against real,
-- throwaway servers.
local mg = require "moongraph"
local redis = require "moongraph.redis"
local rsaver = require "moongraph.checkpoint.redis"
local postgres = require "moongraph.checkpoint.postgres"
local cached = require "moongraph.checkpoint.cached"
local servers = require "servers"

local function cp(id, values, step)
  return { v = 1, id = id, ts = "2025-01-01T00:00:00Z", step = step or 0, values = values or {}, next = {} }
end

describe("redis checkpoint saver", function()
  local srv
  local n = 0

  setup(function() srv = servers.redis() end)
  teardown(function() if srv then srv:destroy() end end)

  -- each saver gets its own key prefix, so each starts empty
  local function fresh(opts)
    n = n + 1
    opts = opts or {}
    opts.prefix = "spec" .. n
    return rsaver.new(srv.url, opts)
  end

  require("saver_contract")("redis", function() return fresh() end, _ENV)

  it("keeps one thread's keys under one hash tag and thread ids apart", function()
    mg.run(function()
      local s = fresh()
      assert(s:put({ thread_id = "a:b" }, cp("0001", { who = "a:b" }), {}))
      assert(s:put({ thread_id = "a", checkpoint_ns = "b" }, cp("0002", { who = "a/b" }), {}))
      assert(s:put({ thread_id = "{x}" }, cp("0003", { who = "{x}" }), {}))
      assert.equal("a:b", s:get({ thread_id = "a:b" }).checkpoint.values.who)
      assert.equal("a/b", s:get({ thread_id = "a", checkpoint_ns = "b" }).checkpoint.values.who)
      assert.equal("{x}", s:get({ thread_id = "{x}" }).checkpoint.values.who)
      local r = assert(redis.connect(srv.url))
      local keys = r:call("KEYS", s.prefix .. ":*")
      assert.is_true(#keys >= 3, "keys: " .. #keys)
      local tags, ntags = {}, 0
      for _, k in ipairs(keys) do
        local tag = k:match("^" .. s.prefix .. ":{([^{}]+)}:")
        assert.is_string(tag, k)
        if not tags[tag] then tags[tag], ntags = true, ntags + 1 end
      end
      -- one tag per thread: "a:b", "a" (namespace "b") and "{x}" stay apart
      assert.equal(3, ntags)
      assert.is_nil(s:get { thread_id = "a" })
    end)
  end)

  it("expires every key it writes after ttl", function()
    mg.run(function()
      local s = fresh { ttl = 30 }
      local c = assert(s:put({ thread_id = "t" }, cp("0001"), {}))
      assert(s:put_writes(c, "1:a", { { "x", 1 } }))
      local r = assert(redis.connect(srv.url))
      local keys = r:call("KEYS", s.prefix .. ":*")
      assert.equal(4, #keys)
      for _, k in ipairs(keys) do
        local ms = r:call("PTTL", k)
        assert.is_true(ms > 0 and ms <= 30000, k .. " " .. ms)
      end
    end)
  end)

  it("accepts a connection or a pool", function()
    mg.run(function()
      local conn = assert(redis.connect(srv.url))
      n = n + 1
      local s = rsaver.new(conn, { prefix = "conn" .. n })
      assert(s:put({ thread_id = "t" }, cp("0001", { ok = true }), {}))
      assert.is_true(s:get({ thread_id = "t" }).checkpoint.values.ok)
    end)
  end)

  it("reports a corrupt record instead of returning it", function()
    mg.run(function()
      local s = fresh()
      assert(s:put({ thread_id = "t" }, cp("0001"), {}))
      local r = assert(redis.connect(srv.url))
      r:call("HSET", s.prefix .. ":{t}::cp:0001", "cp", "{not json")
      local tup, err = s:get { thread_id = "t" }
      assert.is_nil(tup)
      assert.matches("corrupt", err)
    end)
  end)

  it("raises on bad arguments", function()
    assert.has_error(function() rsaver.new(42) end,
      "bad argument #1 to 'redis': Redis URL, connection or pool expected, got number")
    assert.has_error(function() rsaver.new("http://x") end,
      "bad argument #1 to 'redis': unsupported URL scheme 'http' (redis://, redis-sentinel:// or unix://)")
    assert.has_error(function() rsaver.new(srv.url, { ttl = 0 }) end,
      "bad argument #2 to 'redis': ttl must be a positive number of seconds")
    assert.has_error(function() rsaver.new(srv.url, { colour = "red" }) end,
      "bad argument #2 to 'redis': unknown option 'colour'")
  end)

  it("fails with the reason when Redis is unreachable", function()
    mg.run(function()
      local s = rsaver.new("redis://127.0.0.1:1/0")
      local ok, err = s:put({ thread_id = "t" }, cp("0001"), {})
      assert.is_nil(ok)
      assert.matches("cannot connect", err)
    end)
  end)
end)

describe("cached checkpoint saver", function()
  local rsrv, psrv
  local n = 0

  setup(function()
    rsrv = servers.redis()
    psrv = servers.postgres()
  end)
  teardown(function()
    if rsrv then rsrv:destroy() end
    if psrv then psrv:destroy() end
  end)

  local function fresh()
    n = n + 1
    local l1 = rsaver.new(rsrv.url, { ttl = 3600, prefix = "cache" .. n })
    local durable = postgres.new(psrv:create_database("cached_" .. n))
    return cached.new(l1, durable), l1, durable
  end

  require("saver_contract")("cached", function() return (fresh()) end, _ENV)

  it("answers reads from Redis when it holds the current checkpoint", function()
    mg.run(function()
      local s, l1 = fresh()
      local c = assert(s:put({ thread_id = "t" }, cp("0001", { big = string.rep("x", 4096) }), {}))
      assert(s:put_writes(c, "1:a", { { "x", 1 } }))
      local tup = assert(s:get { thread_id = "t" })
      assert.equal(4096, #tup.checkpoint.values.big)
      assert.same({ { "1:a", "x", 1 } }, tup.pending_writes)
      assert.equal(1, s.hits)
      assert.is_nil(s.misses)
      assert.is_not_nil(l1:get { thread_id = "t", checkpoint_id = "0001" })
    end)
  end)

  it("never serves a stale cache entry", function()
    mg.run(function()
      local s, l1, durable = fresh()
      local c1 = assert(s:put({ thread_id = "t" }, cp("0001", { n = 1 }), {}))
      -- a later checkpoint and a task's writes that reached Postgres only
      local c2 = assert(durable:put(c1, cp("0002", { n = 2 }, 1), {}))
      assert(durable:put_writes(c2, "2:a", { { "y", true } }))
      local tup = assert(s:get { thread_id = "t" })
      assert.equal(2, tup.checkpoint.values.n)
      assert.same({ { "2:a", "y", true } }, tup.pending_writes)
      assert.equal(1, s.misses)
      -- the miss refilled Redis: the next read is a hit
      assert.is_not_nil(l1:get { thread_id = "t", checkpoint_id = "0002" })
      assert(s:get { thread_id = "t" })
      assert.equal(1, s.hits)
      -- pending writes added, or a task's replaced (a resumed task), behind
      -- the cache's back are seen too: they always come from Postgres
      assert(durable:put_writes(c2, "2:b", { { "z", 3 } }))
      tup = assert(s:get { thread_id = "t" })
      assert.same({ { "2:a", "y", true }, { "2:b", "z", 3 } }, tup.pending_writes)
      assert(durable:put_writes(c2, "2:a", { { "y", false } }))
      tup = assert(s:get { thread_id = "t" })
      assert.same({ { "2:a", "y", false }, { "2:b", "z", 3 } }, tup.pending_writes)
      assert.equal(2, tup.checkpoint.values.n)
      assert.same({ 1, 3 }, { s.misses, s.hits })     -- the checkpoint itself from Redis
    end)
  end)

  it("keeps working from Postgres while Redis is down", function()
    mg.run(function()
      local s = fresh()
      local c = assert(s:put({ thread_id = "t" }, cp("0001", { n = 1 }), {}))
      rsrv:stop()
      c = assert(s:put(c, cp("0002", { n = 2 }, 1), {}))
      assert.is_true(s:put_writes(c, "2:a", { { "n", 3 } }))
      local tup = assert(s:get { thread_id = "t" })
      assert.equal(2, tup.checkpoint.values.n)
      assert.matches("redis", s.cache_error)
      rsrv:start()
      tup = assert(s:get { thread_id = "t" })              -- Redis is empty again: a miss
      assert.equal(2, tup.checkpoint.values.n)
      assert.same({ { "2:a", "n", 3 } }, tup.pending_writes)
    end)
  end)

  it("write_through = false: writes reach Postgres only; a read fills Redis, uncache empties it", function()
    mg.run(function()
      n = n + 1
      local l1 = rsaver.new(rsrv.url, { ttl = 3600, prefix = "cache" .. n })
      local durable = postgres.new(psrv:create_database("cached_" .. n))
      local s = cached.new(l1, durable, { write_through = false })
      local c = assert(s:put({ thread_id = "t" }, cp("0001", { n = 1 }), {}))
      assert(s:put_writes(c, "1:a", { { "x", 1 } }))
      assert(s:put_batch { { op = "put", a = c, b = cp("0002", { n = 2 }, 1), c = {} } })
      assert.is_nil(l1:get { thread_id = "t" })
      local tup = assert(s:get { thread_id = "t" })
      assert.equal(2, tup.checkpoint.values.n)
      assert.equal(1, s.misses)
      assert.is_not_nil(l1:get { thread_id = "t", checkpoint_id = "0002" })
      assert(s:get { thread_id = "t" })
      assert.equal(1, s.hits)
      -- deleted in the caller's transaction: gone only once it commits
      local db = durable.db
      local _, err = db:transaction(function(tx)
        assert(s:delete_thread_in(tx, "t"))
        error("changed my mind", 0)
      end)
      assert.equal("changed my mind", err)
      assert.is_not_nil(s:get { thread_id = "t" })
      assert(db:transaction(function(tx) return s:delete_thread_in(tx, "t") end))
      assert.is_nil(s:get { thread_id = "t" })
      assert.is_not_nil(l1:get { thread_id = "t" })
      assert.is_true(s:uncache("t"))
      assert.is_nil(l1:get { thread_id = "t" })
      assert.has_error(function() cached.new(l1, durable, { write_through = "no" }) end,
        "bad argument #3 to 'cached': write_through must be a boolean")
    end)
  end)

  it("raises unless given a saver and the Postgres saver", function()
    assert.has_error(function() cached.new({}, {}) end,
      "bad argument #1 to 'cached': a checkpoint saver (the Redis cache) expected")
    local l1 = rsaver.new("redis://127.0.0.1:1/0")
    assert.has_error(function() cached.new(l1, l1) end)   -- no head(): not the Postgres saver
  end)
end)
