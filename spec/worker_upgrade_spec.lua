-- Upgrading: a worker started on a database that an earlier worker made
-- (spec/fixtures/worker_schema_v2.sql: the Eco² memory tables created as
-- the worker's own migration 2, one answered turn) takes it over without
-- applying anything twice, and a job in the earlier format, queued as an
-- older `submit` did, carries that conversation on.
local mg = require "moongraph"
local cjson = require "cjson"
local pg = require "moongraph.pg"
local wenv = require "worker_env"
local client = require "moongraph.worker.client"
local results = require "moongraph.worker.results"

describe("moongraph worker on a database made by an earlier version", function()
  local env, url
  setup(function()
    env = wenv.new()
    url = env.pg:create_database("upgraded")
    env.pg:psql(assert(wenv.read_file("spec/fixtures/worker_schema_v2.sql")), "upgraded")
  end)
  teardown(function() if env then env:destroy() end end)

  it("upgrades the schema and answers the next turn of an old conversation", function()
    local w = env:worker { "--pg", url, "--script", "chat=scripts/eco/chat.lua" }
    mg.run(function()
      w:wait_started()
      local r = env:conns()
      local db = assert(pg.connect(url))
      local c = assert(client.connect { redis = r })
      -- the job as an earlier `moongraph submit` queued it
      assert(r:call("XADD", "moongraph:jobs", "*", "job", cjson.encode {
        job_id = "new-j2", thread_id = "old-conv", user_id = "old-user", message = "그럼 플라스틱은?" }))
      local list = {}
      local last, done = c:follow("new-j2", { idle_timeout = 30, block = 0.5,
        on_event = function(ev) list[#list + 1] = ev end })
      assert(last, tostring(done))
      assert.equal("done", done.data.status)
      local row = assert(results.get(db, "new-j2"))
      assert.equal("done", row.status)
      assert.equal(2, row.state.turn)                            -- after the stored turn 1
      assert.equal("waste", row.state.prev_intent)               -- its intent, from memory
      assert.equal("서울특별시 강남구", row.state.user_location)   -- the profile's location
      local msgs = assert(db:query("SELECT turn, role, job_id FROM messages WHERE thread_id = 'old-conv' ORDER BY id"))
      assert.equal(4, #msgs)
      assert.same({ 2, "user", "new-j2" }, { msgs[3].turn, msgs[3].role, msgs[3].job_id })
      -- the old profile row was copied into the Store, and the turn counted there
      local prof = assert(require("scripts.eco.profile").get(mg.store.postgres(db), "old-user"))
      assert.same({ 2, { waste = 2 } }, { prof.turns, prof.intents })
      local old = assert(db:query("SELECT turns FROM user_profiles WHERE user_id = 'old-user'"))[1]
      assert.equal(1, old.turns)                                 -- no longer written, still readable
      -- the old result is still there, and the migrations are recorded once each
      local old_result = assert(results.get(db, "old-j1"))
      assert.equal("done", old_result.status)
      assert.same({ intent = "waste", turn = 1 }, old_result.state)   -- json now, read the same
      local rec = assert(db:query("SELECT scope, version FROM moongraph_worker_migrations ORDER BY scope, version"))
      local got = {}
      for i, m in ipairs(rec) do got[i] = m.scope .. ":" .. m.version end
      assert.same({ "eco:1", "eco:2", "eco:3", "worker:1", "worker:2", "worker:3", "worker:4", "worker:5", "worker:6", "worker:7" }, got)
    end)
    w:signal("TERM")
    mg.run(function() assert.equal(0, w:wait()) end)
    local applied = {}
    for i, l in ipairs(w:logged("migration applied")) do applied[i] = l.scope .. ":" .. math.tointeger(l.version) end
    table.sort(applied)
    assert.same({ "eco:1", "eco:2", "eco:3", "worker:3", "worker:4", "worker:5", "worker:6", "worker:7" }, applied)
    assert.same({}, w:logged("does not list"))
  end)
end)
