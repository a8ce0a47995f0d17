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
local profile = require "scripts.eco.profile"

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
      -- a turn committed that L1 did not get: L1 is not used, and gets L2
      local t4 = { thread_id = "th", user_id = "u7", job_id = "j4", turn = 4, intent = "waste",
                   message = "q4", answer = "a4" }
      assert(db:transaction(function(tx) return assert(mem:record(tx, t4)) end))
      o.behind = assert(mem:load("th", "u7"))
      o.behind_l1 = assert(mem:load_l1("th"))
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
      assert.same({ role = "assistant", content = "a3", turn = 3, intent = "location" }, m.messages[4])
      assert.same({ role = "user", content = "q2", turn = 2, intent = "waste" }, m.messages[1])
      assert.equal("integer", math.type(m.messages[1].turn))
    end
    assert.equal("redis", out.l1.source)
    local last = out.behind.messages[#out.behind.messages]
    assert.same({ "postgres", 4, "a4" }, { out.behind.source, out.behind.turn, last.content })
    assert.same({ "redis", 4 }, { out.behind_l1.source, out.behind_l1.turn })
    assert.equal("postgres", out.l2.source)
    assert.equal("redis", out.rewarmed.source)
    assert.equal(3, out.profile.turns)
    assert.equal("location", out.profile.last_intent)
    assert.same({ waste = 2, location = 1 }, out.profile.intents)
    assert.equal("서울특별시 강남구", out.profile.last_location)
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
    assert.equal("unavailable", l1_err.code)    -- Redis could not be asked, not "nothing cached"
    assert.equal("postgres", m.source)
    assert.equal("waste", m.intent)
    assert.equal(2, #m.messages)
  end)

  it("is read along with a claim: L1 checked against L2's turn, or L2 when L1 has nothing", function()
    local url = fresh_db()
    local out = mg.run(function()
      local db = assert(pg.connect(url))
      local r = assert(redis.connect(rsrv.url))
      local mem = memory.new { redis = r, db = db, key = config.key_helper("mgspec3") }
      -- the worker's claim: a statement sent, the prefetch, then the claim's
      -- result (with the COMMIT, unless the prefetch's query carried it)
      local function claim(thread)
        local reads = mem:prefetch(thread, "u")   -- (before the claim: L1)
        if not reads then return "none" end
        return assert(db:transaction(function(tx)
          local claimed = assert(tx:defer("SELECT 1 AS claimed"))
          local after = reads(tx)
          if tx:is_open() then tx:commit_with_next() end
          assert(claimed())
          return { after() }
        end))
      end
      local function record(turn)
        assert(db:transaction(function(tx)
          return assert(mem:record(tx, { thread_id = "th", user_id = "u", job_id = "j" .. turn, turn = turn,
            intent = "waste", location = "부산", message = "q" .. turn, answer = "a" .. turn }))
        end))
      end
      local o = {}
      o.new = claim("th")[1]                -- (the Store reads its schema first)
      record(1)
      record(2)
      o.l2 = claim("th")[1]
      assert(mem:cache("th", o.l2))
      o.l1 = claim("th")[1]
      record(3)                             -- a turn L1 did not get
      o.behind = claim("th")
      rsrv:stop("kill")
      o.no_redis = claim("th")
      rsrv:start()
      return o
    end)
    assert.same({ "new", 0 }, { out.new.source, out.new.turn })
    assert.same({ "postgres", 2, "부산", 4 }, { out.l2.source, out.l2.turn, out.l2.location, #out.l2.messages })
    assert.same({ "redis", 2, 4 }, { out.l1.source, out.l1.turn, #out.l1.messages })
    assert.same({}, out.behind)             -- after() gave nil: the input hook reads L2
    assert.equal("none", out.no_redis)
  end)

  describe("the user profile in the Store", function()
    local function turn(job, intent, location, thread)
      return { thread_id = thread or "th", user_id = "u1", job_id = job, turn = 1, intent = intent,
               location = location, message = "q", answer = "a" }
    end

    it("is kept under {eco, users, user_id} / profile, and a new thread of the user starts from it", function()
      local url = fresh_db()
      local item, m = mg.run(function()
        local db = assert(pg.connect(url))
        local mem = memory.new { redis = assert(redis.connect(rsrv.url)), db = db, key = config.key_helper("p1") }
        assert(db:transaction(function(tx) return assert(mem:record(tx, turn("j1", "waste", "부산광역시 해운대구"))) end))
        assert(db:transaction(function(tx) return assert(mem:record(tx, turn("j2", "location", nil))) end))
        return mg.store.postgres(db):get({ "eco", "users", "u1" }, "profile"), assert(mem:load("other", "u1"))
      end)
      assert.same({ last_location = "부산광역시 해운대구", last_intent = "location",
                    intents = { waste = 1, location = 1 }, turns = 2 }, item.value)
      assert.equal("new", m.source)
      assert.equal(0, m.turn)
      assert.equal("부산광역시 해운대구", m.location)     -- the profile's, for the new thread
    end)

    it("is written in the result's transaction: rolled back with it", function()
      local url = fresh_db()
      local before, after = mg.run(function()
        local db = assert(pg.connect(url))
        local mem = memory.new { redis = assert(redis.connect(rsrv.url)), db = db, key = config.key_helper("p2") }
        assert(db:transaction(function(tx) return assert(mem:record(tx, turn("j1", "waste", "서울특별시 강남구"))) end))
        local b = assert(mem:profile("u1"))
        local ok, err = db:transaction(function(tx)
          assert(mem:record(tx, turn("j2", "location", "대전광역시 서구")))
          error("the result could not be stored", 0)
        end)
        assert.is_nil(ok)
        assert.matches("could not be stored", err)
        return b, assert(mem:profile("u1"))
      end)
      assert.same(before, after)
      assert.same({ last_location = "서울특별시 강남구", last_intent = "waste", intents = { waste = 1 }, turns = 1 }, after)
    end)

    it("counts again from this turn a count that was damaged, instead of failing the turn", function()
      local url = fresh_db()
      local p1, p2 = mg.run(function()
        local db = assert(pg.connect(url))
        local mem = memory.new { redis = assert(redis.connect(rsrv.url)), db = db, key = config.key_helper("p4") }
        local s = mg.store.postgres(db)
        assert(s:put(profile.namespace("u1"), "profile",
          { turns = "7", intents = { waste = 2.5, bus = 3 }, last_location = "부산" }))
        assert(db:transaction(function(tx) return assert(mem:record(tx, turn("j1", "waste", nil))) end))
        local first = assert(mem:profile("u1"))
        assert(s:put(profile.namespace("u1"), "profile", { turns = 4, intents = "waste" }))
        assert(db:transaction(function(tx) return assert(mem:record(tx, turn("j2", "bus", nil))) end))
        return first, assert(mem:profile("u1"))
      end)
      assert.same({ turns = 1, intents = { waste = 1, bus = 3 }, last_location = "부산", last_intent = "waste" }, p1)
      assert.same({ turns = 5, intents = { bus = 1 }, last_intent = "bus" }, p2)
    end)

    it("counts every turn when two turns of one user are recorded at once", function()
      local url = fresh_db()
      local p = mg.run(function()
        local dbs, mems = {}, {}
        for i = 1, 2 do
          dbs[i] = assert(pg.connect(url))
          mems[i] = memory.new { redis = assert(redis.connect(rsrv.url)), db = dbs[i], key = config.key_helper("p3") }
        end
        local none, err = mems[1]:profile("nobody")     -- an unknown user; the schema is in place
        assert.is_nil(none)
        assert.is_nil(err)
        local tasks = {}
        for k = 1, 20 do
          local i = k % 2 + 1
          tasks[k] = function()
            assert(dbs[i]:transaction(function(tx)
              assert(mems[i]:record(tx, turn("j" .. k, k % 4 == 0 and "location" or "waste", nil, "th" .. k)))
              mg.sleep(0.005)                             -- the transaction stays open a while
              return true
            end))
          end
        end
        mg.gather(tasks)
        return assert(mems[1]:profile("u1"))
      end)
      assert.equal(20, p.turns)
      assert.same({ waste = 15, location = 5 }, p.intents)
    end)

    it("migration 2 copies the old user_profiles rows into the Store, once, keeping a profile already there", function()
      n = n + 1
      local url = psrv:create_database("ecomem" .. n)
      local copied, again, p, kept = mg.run(function()
        local db = assert(pg.connect(url))
        -- the table as migration 1 made it, with a row an earlier version wrote
        assert(migrations.migrate(db, { { scope = "eco", list = { memory.migrations[1] } } }))
        assert(db:query([[INSERT INTO user_profiles (user_id, location, turns, last_intent, intents)
          VALUES ('old', '광주광역시 북구', 7, 'waste', '{"waste": 5, "weather": 2}'::jsonb),
                 ('newer', NULL, 1, NULL, '{}'::jsonb)]]))
        local s = mg.store.postgres(db)
        assert(s:put(profile.namespace("newer"), "profile", { turns = 9, intents = {} }))
        local applied = assert(migrations.migrate(db, { { scope = "eco", list = memory.migrations } }))
        local c = 0
        for _, m in ipairs(applied) do if m.scope == "eco" and m.version == 2 then c = c + 1 end end
        local n2 = assert(db:transaction(function(tx) return profile.import(tx) end))
        return c, n2, assert(profile.get(s, "old")), assert(profile.get(s, "newer"))
      end)
      assert.equal(1, copied)
      assert.equal(0, again)                        -- a second run finds every profile there
      assert.same({ last_location = "광주광역시 북구", last_intent = "waste",
                    intents = { waste = 5, weather = 2 }, turns = 7 }, p)
      assert.equal(9, kept.turns)                   -- the Store's own profile is newer
    end)
  end)
end)
