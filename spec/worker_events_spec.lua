-- Job event streams against a real redis-server: written in order, once,
-- through a Redis restart; followed with catch-up and reconnection.
local mg = require "moongraph"
local redis = require "moongraph.redis"
local servers = require "servers"
local events = require "moongraph.worker.events"
local cjson = require "cjson"

local srv

local function ids_increase(entries)
  local prev_ms, prev_seq = -1, -1
  for _, e in ipairs(entries) do
    local ms, seq = e[1]:match("^(%d+)%-(%d+)$")
    ms, seq = tonumber(ms), tonumber(seq)
    if not (ms > prev_ms or (ms == prev_ms and seq > prev_seq)) then return false end
    prev_ms, prev_seq = ms, seq
  end
  return true
end

local function field(e, name)
  for i = 1, #e[2] - 1, 2 do if e[2][i] == name then return e[2][i + 1] end end
end

describe("worker events", function()
  setup(function() srv = servers.redis { persist = true } end)
  teardown(function() if srv then srv:destroy() end end)

  it("counts XADDs refused because the stream already reaches their ids as written, asking the stream", function()
    local entries, flushed = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:ahead", {})
      em:push("token", { text = "0" })
      assert.is_true(em:flush())
      -- the stream moves past the ids the emitter makes next, as after a
      -- batch that went through but whose reply was lost
      local ahead = string.format("%d-0", math.floor(os.time() * 1000) + 3600 * 1000)
      assert(r:call("XADD", "ev:ahead", ahead, "type", "token", "data", "{}"))
      for i = 1, 5 do em:push("token", { text = tostring(i) }) end
      local ok = mg.timeout(5, function() return em:flush() end)
      em:close()
      return r:call("XRANGE", "ev:ahead", "-", "+"), ok
    end)
    assert.is_true(flushed)          -- not retried for ever
    assert.equal(2, #entries)        -- nothing written twice
  end)

  it("writes pushed events in order, many per round trip", function()
    local entries = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:order", {})
      for i = 1, 1000 do em:push("token", { text = tostring(i) }) end
      assert.is_true(em:flush())
      em:close()
      return r:call("XRANGE", "ev:order", "-", "+")
    end)
    assert.equal(1000, #entries)
    for i, e in ipairs(entries) do
      assert.equal("token", field(e, "type"))
      assert.equal('{"text":"' .. i .. '"}', field(e, "data"))
    end
    assert.is_true(ids_increase(entries))
  end)

  it("joins token pieces of one node that wait to be sent, never one already sent", function()
    local entries = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:tokens", {})
      em:push("node_start", { node = "a" })
      em:token("a", "x"); em:token("a", "y")
      em:token("b", "z"); em:token("b", "w")
      em:push("node_end", { node = "b" })
      em:token("b", "v")
      assert.is_true(em:flush())
      em:token("b", "u")   -- the last token is written: a new entry
      assert.is_true(em:flush())
      -- a batch tried while Redis is down keeps its entries as they were
      srv:stop("term")
      em:token("b", "1")
      mg.sleep(0.2)   -- the writer tried to send "1" and waits to retry
      em:token("b", "2"); em:token("b", "3")
      srv:start()
      assert.is_true(em:flush())
      em:close()
      return r:call("XRANGE", "ev:tokens", "-", "+")
    end)
    local got = {}
    for _, e in ipairs(entries) do
      local d = cjson.decode(field(e, "data"))
      got[#got + 1] = field(e, "type") .. " " .. d.node .. (d.text and (" " .. d.text) or "")
    end
    assert.same({
      "node_start a", "token a xy", "token b zw", "node_end b", "token b v", "token b u",
      "token b 1", "token b 23",
    }, got)
    assert.is_true(ids_increase(entries))
  end)

  it("with an interval, writes once per interval: the first event after a quiet spell, flush and close at once", function()
    local INTERVAL = 0.5
    local got = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local other = assert(redis.connect(srv.url))
      local key = "ev:interval"
      local em = events.emitter(r, key, { interval = INTERVAL })
      local g = {}
      em:push("node_start", { node = "answer" })
      mg.sleep(0.2)
      g.first = other:call("XLEN", key)   -- written at once
      local expect = {}
      for i = 1, 40 do   -- 0.4 s of tokens, held until the interval is over
        em:token("answer", tostring(i))
        expect[i] = tostring(i)
        mg.sleep(0.01)
      end
      g.expect = table.concat(expect)
      local t0 = mg.now()
      assert.is_true(em:flush())
      g.flush_wait = mg.now() - t0
      mg.sleep(INTERVAL + 0.1)   -- quiet: the next event goes at once
      em:push("node_end", { node = "answer" })
      mg.sleep(0.2)
      g.after_quiet = other:call("XLEN", key)
      em:token("answer", "!")
      em:close()
      t0 = mg.now()
      while not em.task:done() do mg.sleep(0.01) end
      g.close_wait = mg.now() - t0
      g.entries = r:call("XRANGE", key, "-", "+")
      return g
    end)
    assert.equal(1, got.first)
    assert.is_true(got.flush_wait < INTERVAL / 2, "flush waited " .. got.flush_wait .. " s")
    assert.is_true(got.close_wait < INTERVAL / 2, "close waited " .. got.close_wait .. " s")
    local tokens, text = 0, {}
    for _, e in ipairs(got.entries) do
      if field(e, "type") == "token" then
        tokens = tokens + 1
        text[#text + 1] = cjson.decode(field(e, "data")).text
      end
    end
    -- the 40 pieces: one write at the end of the first interval, the rest
    -- with the flush; then "!" on its own, written by close
    assert.is_true(tokens >= 2 and tokens <= 4, tokens .. " token events")
    assert.equal(got.expect .. "!", table.concat(text))
    assert.equal(#got.entries - 1, got.after_quiet)
    assert.equal("node_end", field(got.entries[#got.entries - 1], "type"))
    assert.equal("!", text[#text])
    assert.is_true(ids_increase(got.entries))
  end)

  it("with an interval, a backlog of a batch or more is written without waiting", function()
    local got = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local other = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:backlog", { interval = 5 })
      em:push("node_start", { node = "a" })
      mg.sleep(0.1)   -- written at once; the next write would wait 5 s
      local n = events.BATCH * 2 + 10
      for i = 1, n do em:push("node_end", { node = "a", i = i }) end
      mg.sleep(0.3)
      local written = other:call("XLEN", "ev:backlog")
      em:close()
      return { written = written, n = n }
    end)
    -- every full batch went; what is left of the backlog waits for the interval
    assert.equal(1 + events.BATCH * 2, got.written)
  end)

  it("keeps events pushed while Redis is down and writes them once it is back", function()
    local entries = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:restart", {})
      for i = 1, 50 do em:push("token", { text = tostring(i) }) end
      em:flush()
      srv:stop("term")
      for i = 51, 100 do em:push("token", { text = tostring(i) }) end
      mg.sleep(0.2)   -- the writer meets the outage and retries
      srv:start()
      for i = 101, 150 do em:push("token", { text = tostring(i) }) end
      em:flush()
      em:close()
      return r:call("XRANGE", "ev:restart", "-", "+")
    end)
    assert.equal(150, #entries)
    for i, e in ipairs(entries) do assert.equal('{"text":"' .. i .. '"}', field(e, "data")) end
    assert.is_true(ids_increase(entries))
  end)

  it("continues a stream after the ids of an earlier attempt", function()
    local entries = mg.run(function()
      local r = assert(redis.connect(srv.url))
      assert(r:call("XADD", "ev:resume", "99999999999999-5", "type", "node_start", "data", "{}"))
      local em = events.emitter(r, "ev:resume", {})
      em:push("node_end", { node = "a" })
      em:flush()
      return r:call("XRANGE", "ev:resume", "-", "+")
    end)
    assert.equal(2, #entries)
    assert.equal("99999999999999-6", entries[2][1])
  end)

  it("finishes a stream once: a second finish adds nothing", function()
    local entries, first, second, ttl = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:done", {})
      em:push("token", { text = "a" })
      em:flush()
      local list = { { "answer", { answer = "a" } }, { "done", { status = "done" } } }
      local a = events.finish(r, "ev:done", list, { ttl = 60 })
      local b = events.finish(r, "ev:done", list, { ttl = 60 })
      return r:call("XRANGE", "ev:done", "-", "+"), a, b, r:call("TTL", "ev:done")
    end)
    assert.is_true(first)
    assert.is_false(second)
    assert.equal(3, #entries)   -- the second finish added nothing
    assert.same({ "token", "answer", "done" },
      { field(entries[1], "type"), field(entries[2], "type"), field(entries[3], "type") })
    assert.is_true(ttl > 0 and ttl <= 60)
  end)

  it("follows from a last id: catch-up, then new events, to done", function()
    local got, last = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:follow", {})
      for i = 1, 10 do em:push("token", { text = tostring(i) }) end
      em:flush()
      local all = r:call("XRANGE", "ev:follow", "-", "+")
      local from = all[4][1]                      -- a client that saw 4 events
      local seen = {}
      local follower = mg.spawn(function()
        local c = assert(redis.connect(srv.url))
        return events.follow(c, "ev:follow", { last_id = from, block = 0.2,
          on_event = function(ev) seen[#seen + 1] = ev.data.text or ev.type end })
      end)
      mg.sleep(0.05)
      for i = 11, 20 do em:push("token", { text = tostring(i) }) end
      em:flush()
      events.finish(r, "ev:follow", { { "done", { status = "done" } } }, {})
      local ok, l = follower:join()
      assert(ok, l)
      return seen, l
    end)
    local want = {}
    for i = 5, 20 do want[#want + 1] = tostring(i) end
    want[#want + 1] = "done"
    assert.same(want, got)
    assert.matches("^%d+%-%d+$", last)
  end)

  it("a follower survives a Redis restart and gets every event once, in order", function()
    local got = mg.run(function()
      local r = assert(redis.connect(srv.url))
      local em = events.emitter(r, "ev:bounce", {})
      for i = 1, 5 do em:push("token", { text = tostring(i) }) end
      em:flush()
      local seen, retries = {}, 0
      local follower = mg.spawn(function()
        local c = assert(redis.connect(srv.url))
        return events.follow(c, "ev:bounce", { block = 0.2,
          on_retry = function() retries = retries + 1 end,
          on_event = function(ev) seen[#seen + 1] = ev.data.text or ev.type end })
      end)
      mg.sleep(0.1)
      srv:restart("term")
      for i = 6, 10 do em:push("token", { text = tostring(i) }) end
      em:flush()
      events.finish(r, "ev:bounce", { { "done", { status = "done" } } }, {})
      local ok, last, ferr = follower:join()
      assert(ok, last)
      assert(last, ferr)   -- follow ended at done, with the last id
      assert(retries > 0, "the follower never saw the restart")
      return seen
    end)
    assert.same({ "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "done" }, got)
  end)
end)
