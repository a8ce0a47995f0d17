-- The Eco² chat pipeline's conversation memory (scripts/eco/memory.lua)
-- against real Redis and PostgreSQL: L1 (Redis) and L2 (Postgres), its
-- schema applied in its own scope.
local mg = require "moongraph"
local redis = require "moongraph.redis"
local pg = require "moongraph.pg"
local servers = require "servers"
local migrations = require "moongraph.worker.migrations"
local config = require "moongraph.worker.config"
local memory = require "scripts.eco.memory"

local rsrv, psrv, n = nil, nil, 0

local function fresh_db()
  n = n + 1
  local url = psrv:create_database("ecomem" .. n)
  mg.run(function()
    assert(migrations.migrate(assert(pg.connect(url)), { { scope = "eco", list = memory.migrations } }))
  end)
  return url
end

describe("Eco² conversation memory", function()
  setup(function()
    rsrv = servers.redis()
    psrv = servers.postgres()
  end)
  teardown(function()
    if rsrv then rsrv:destroy() end
    if psrv then psrv:destroy() end
  end)

  it("records turns in Postgres and reads them back through Redis", function()
    local url = fresh_db()
    local key = config.key_helper("mgspec")
    local out = mg.run(function()
      local db = assert(pg.connect(url))
      local r = assert(redis.connect(rsrv.url))
      local mem = memory.new { redis = r, db = db, key = key, recent = 4 }
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
      o.ttl = r:call("TTL", "mgspec:memory:th:recent")
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
    local m, cached, l1, l1_err = mg.run(function()
      local db = assert(pg.connect(url))
      local r = assert(redis.connect(rsrv.url))
      local mem = memory.new { redis = r, db = db, key = config.key_helper("mgspec2") }
      assert(db:transaction(function(tx)
        return assert(mem:record(tx, { thread_id = "x", user_id = "u", job_id = "j", turn = 1,
          intent = "waste", message = "q", answer = "a" }))
      end))
      -- the thread is in L1 too, so only an unreachable Redis sends it to Postgres
      assert(mem:load("x", "u"))
      local in_l1 = assert(mem:load_l1("x"))
      rsrv:stop("kill")
      local no_l1, err = mem:load_l1("x")
      local got = assert(mem:load("x", "u"))
      rsrv:start()
      return got, in_l1, no_l1, err
    end)
    assert.equal("redis", cached.source)
    assert.is_nil(l1)
    assert.is_string(l1_err)    -- Redis could not be asked, not "nothing cached"
    assert.equal("postgres", m.source)
    assert.equal("waste", m.intent)
    assert.equal(2, #m.messages)
  end)
end)
