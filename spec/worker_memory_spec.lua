-- Conversation memory and job results against real Redis and PostgreSQL:
-- versioned migrations, L1 (Redis) and L2 (Postgres) memory, results stored
-- once.
local mg = require "moongraph"
local redis = require "moongraph.redis"
local pg = require "moongraph.pg"
local servers = require "servers"
local migrations = require "moongraph.worker.migrations"
local memory = require "moongraph.worker.memory"
local results = require "moongraph.worker.results"
local config = require "moongraph.worker.config"

local rsrv, psrv, n = nil, nil, 0

local function fresh_db()
  n = n + 1
  return psrv:create_database("mem" .. n)
end

describe("worker memory", function()
  setup(function()
    rsrv = servers.redis()
    psrv = servers.postgres()
  end)
  teardown(function()
    if rsrv then rsrv:destroy() end
    if psrv then psrv:destroy() end
  end)

  it("applies the migrations once, also when workers start together", function()
    local url = fresh_db()
    local a, b, again, cur = mg.run(function()
      local t1 = mg.spawn(function() return migrations.migrate(assert(pg.connect(url))) end)
      local t2 = mg.spawn(function() return migrations.migrate(assert(pg.connect(url))) end)
      local _, x = assert(t1:join())
      local _, y = assert(t2:join())
      local db = assert(pg.connect(url))
      return x, y, assert(migrations.migrate(db)), migrations.current(db)
    end)
    assert.equal(#migrations.list, #a + #b)          -- one of them did the work
    assert.same({}, again)
    assert.equal(migrations.list[#migrations.list].version, cur)
  end)

  it("stores a result once; a second commit returns the first", function()
    local url = fresh_db()
    local first, second, recorded = mg.run(function()
      local db = assert(pg.connect(url))
      assert(migrations.migrate(db))
      local calls = 0
      local also = function() calls = calls + 1 return true end
      local row = { job_id = "j1", thread_id = "t1", user_id = "u1", status = "done",
                    answer = "first", state = { intent = "waste", n = 2, f = 0.5 } }
      local i1, r1 = results.commit(db, row, also)
      local i2, r2 = results.commit(db, { job_id = "j1", thread_id = "t1", status = "done", answer = "second" }, also)
      return { i1, r1.answer }, { i2, r2.answer, r2.state }, calls
    end)
    assert.same({ true, "first" }, first)
    assert.same({ false, "first", { intent = "waste", n = 2, f = 0.5 } }, second)
    assert.equal(1, recorded)
  end)

  it("records turns in Postgres and reads them back through Redis", function()
    local url = fresh_db()
    local keys = config.keys("mgspec")
    local out = mg.run(function()
      local db = assert(pg.connect(url))
      assert(migrations.migrate(db))
      local r = assert(redis.connect(rsrv.url))
      local mem = memory.new { redis = r, db = db, keys = keys, recent = 4 }
      local o = {}
      o.new = assert(mem:load("th", "u7"))
      local m = o.new
      for turn = 1, 3 do
        local t = { thread_id = "th", user_id = "u7", job_id = "j" .. turn, turn = turn,
                    intent = turn == 3 and "location" or "waste", location = "서울특별시 강남구",
                    summary = { turns = turn }, message = "q" .. turn, answer = "a" .. turn }
        assert(db:transaction(function(tx) return assert(mem:record(tx, t)) end))
        m = memory.after(m, t)
        assert(mem:cache("th", m))
      end
      o.l1 = assert(mem:load("th", "u7"))
      assert(mem:invalidate("th"))
      o.l2 = assert(mem:load("th", "u7"))
      o.rewarmed = assert(mem:load_l1("th"))
      o.profile = assert(mem:profile("u7"))
      o.ttl = r:call("TTL", keys.memory .. "th:recent")
      return o
    end)
    assert.same({ "new", 0 }, { out.new.source, out.new.turn })
    for _, name in ipairs { "l1", "l2" } do
      local m = out[name]
      assert.equal(3, m.turn)
      assert.equal("location", m.intent)
      assert.equal("서울특별시 강남구", m.location)
      assert.same({ turns = 3 }, m.summary)
      local contents = {}
      for i, x in ipairs(m.messages) do contents[i] = x.role .. ":" .. x.content end
      assert.same({ "user:q2", "assistant:a2", "user:q3", "assistant:a3" }, contents)
    end
    assert.equal("redis", out.l1.source)
    assert.equal("postgres", out.l2.source)
    assert.equal("redis", out.rewarmed.source)
    assert.equal(3, out.profile.turns)
    assert.equal("location", out.profile.last_intent)
    assert.same({ waste = 2, location = 1 }, out.profile.intents)
    assert.is_true(out.ttl > 0 and out.ttl <= 86400)
  end)

  it("reads Postgres when Redis is unreachable", function()
    local url = fresh_db()
    local m = mg.run(function()
      local db = assert(pg.connect(url))
      assert(migrations.migrate(db))
      local r = assert(redis.connect(rsrv.url))
      local mem = memory.new { redis = r, db = db, keys = config.keys("mgspec2") }
      assert(db:transaction(function(tx)
        return assert(mem:record(tx, { thread_id = "x", user_id = "u", job_id = "j", turn = 1,
          intent = "waste", message = "q", answer = "a" }))
      end))
      rsrv:stop("kill")
      local got = assert(mem:load("x", "u"))
      rsrv:start()
      return got
    end)
    assert.equal("postgres", m.source)
    assert.equal("waste", m.intent)
    assert.equal(2, #m.messages)
  end)
end)
