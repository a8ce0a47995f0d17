-- Acceptance: recoverable streaming with `moongraph submit`. A client that
-- disconnects mid-stream and reconnects with its last id receives every
-- remaining event once, in order. And how submit builds a job's input.
local mg = require "moongraph"
local cjson = require "cjson"
local wenv = require "worker_env"

local STEPS = "steps=spec/support/worker_scripts/steps.lua"

-- Complete JSON lines a process wrote to stdout so far.
local function lines(p)
  local out = {}
  for line in p:output():gmatch("([^\n]*)\n") do out[#out + 1] = cjson.decode(line) end
  return out
end

describe("moongraph submit", function()
  local env, w
  setup(function()
    env = wenv.new()
    w = env:worker { "--script", STEPS }
    mg.run(function() w:wait_started() end)
  end)
  teardown(function() if env then env:destroy() end end)

  it("a client killed mid-stream reconnects with its last id and gets the rest once, in order", function()
    local first = env:spawn { "submit", "--redis", env.redis_url, "--json", "--follow",
                              "--job", "stream-1", "--thread", "t-stream", "tokens=80 gap=0.02" }
    mg.run(function()
      wenv.eventually("the first client to see 20 events", 20, function() return #lines(first) >= 20 end)
    end)
    first:signal("KILL")
    mg.run(function() first:wait(10) end)
    local seen = lines(first)
    local last_id = seen[#seen].id
    assert.matches("^%d+%-%d+$", last_id)
    assert.is_string(seen[#seen].type)
    assert.is_not.equal("done", seen[#seen].type)
    local second = env:spawn { "submit", "--redis", env.redis_url, "--json",
                               "--attach", "stream-1", "--last-id", last_id }
    local code = mg.run(function() return second:wait(30) end)
    assert.equal(0, code)
    local rest = lines(second)
    local all = mg.run(function()
      local r = env:conns()
      return r:call("XRANGE", "moongraph:events:stream-1", "-", "+")
    end)
    -- what the two connections received, together, is the stream exactly
    local got = {}
    for _, ev in ipairs(seen) do got[#got + 1] = ev.id .. " " .. ev.type end
    for _, ev in ipairs(rest) do got[#got + 1] = ev.id .. " " .. ev.type end
    local want = {}
    for _, e in ipairs(all) do want[#want + 1] = e[1] .. " " .. e[2][2] end
    assert.same(want, got)
    assert.equal("done", rest[#rest].type)
    local tokens = 0
    for _, ev in ipairs(rest) do if ev.type == "token" then tokens = tokens + 1 end end
    assert.is_true(tokens > 0, "the reconnection came after the last token")
    -- and the tokens of both add up to the stored answer
    local text = {}
    for _, ev in ipairs(seen) do if ev.type == "token" then text[#text + 1] = ev.data.text end end
    for _, ev in ipairs(rest) do if ev.type == "token" then text[#text + 1] = ev.data.text end end
    assert.equal(rest[#rest - 1].data.answer, "v1: " .. table.concat(text))
  end)

  it("prints the answer as it streams and exits 0", function()
    local p = env:spawn { "submit", "--redis", env.redis_url, "--follow", "--thread", "t-plain", "tokens=4 gap=0" }
    local code = mg.run(function() return p:wait(30) end)
    assert.equal(0, code)
    local out = p:output()
    local job_id, text = out:match("^(j%-[%w%-]+)\n(.*)$")
    assert.is_string(job_id)
    assert.equal("t1 t2 t3 t4 \n", text)
    assert.matches("· done: done", p:log(), 1, true)
  end)

  it("exits 1 when the job fails, and 2 on bad usage", function()
    local p = env:spawn { "submit", "--redis", env.redis_url, "--follow", "please fail" }
    assert.equal(1, mg.run(function() return p:wait(30) end))
    assert.matches("asked to fail", p:log(), 1, true)
    local bad = env:spawn { "submit", "--redis", env.redis_url, "--attach", "x", "message too" }
    assert.equal(2, mg.run(function() return bad:wait(30) end))
    assert.matches("no MESSAGE", bad:log(), 1, true)
  end)

  it("builds the job's input from --input, then each --set, then MESSAGE", function()
    -- (another prefix: no worker takes the job, so it can be read back)
    local p = env:spawn { "submit", "--redis", env.redis_url, "--prefix", "held", "--job", "in-1",
                          "--thread", "t-in", "--user", "u-in", "--script", "plain",
                          "--input", '{"a": 1, "nested": {"b": [1, 2]}, "message": "from json", "k": "json"}',
                          "--set", "k=v=w", "--set", "empty=", "the message" }
    assert.equal(0, mg.run(function() return p:wait(30) end))
    assert.equal("in-1\n", p:output())
    local entries = mg.run(function() return env:conns():call("XRANGE", "held:jobs", "-", "+") end)
    assert.equal(1, #entries)
    assert.equal("job", entries[1][2][1])
    local j = cjson.decode(entries[1][2][2])
    assert.same({ job_id = "in-1", thread_id = "t-in", user_id = "u-in", script = "plain",
                  input = { a = 1, nested = { b = { 1, 2 } }, message = "the message", k = "v=w", empty = "" } }, j)
    -- an input alone, without MESSAGE
    local q = env:spawn { "submit", "--redis", env.redis_url, "--prefix", "held", "--job", "in-2", "--set", "x=1" }
    assert.equal(0, mg.run(function() return q:wait(30) end))
    entries = mg.run(function() return env:conns():call("XRANGE", "held:jobs", "-", "+") end)
    assert.same({ x = "1" }, cjson.decode(entries[2][2][2]).input)
  end)

  it("refuses a bad --input or --set, and the Eco²-only --location, with exit 2", function()
    local cases = {
      { { "--input", "{bad" }, "moongraph submit: --input: invalid JSON" },
      { { "--input", "[1]" }, "moongraph submit: --input: a JSON object expected" },
      { { "--input", "[]" }, "moongraph submit: --input: a JSON object expected" },
      { { "--input", '"text"' }, "moongraph submit: --input: a JSON object expected" },
      { { "--set", "novalue" }, "moongraph submit: --set: KEY=VALUE expected, got 'novalue'" },
      { { "--set", "=v" }, "moongraph submit: --set: KEY=VALUE expected, got '=v'" },
      { {}, "moongraph submit: missing MESSAGE (or --input JSON, --set KEY=VALUE)" },
      { { "  " }, "moongraph submit: MESSAGE is empty" },
      { { "--location", "x", "hi" }, "moongraph submit: unknown option --location" },
      { { "--attach", "j", "--set", "a=b" }, "--attach follows an existing job: no MESSAGE, --input or --set" },
      { { "--job", "bad id", "hi" }, "moongraph submit: field 'job_id' must be 1..200 letters" },
    }
    for _, c in ipairs(cases) do
      local args = { "submit", "--redis", env.redis_url, "--prefix", "refused" }
      for _, a in ipairs(c[1]) do args[#args + 1] = a end
      local p = env:spawn(args)
      assert.equal(2, mg.run(function() return p:wait(30) end), table.concat(c[1], " "))
      assert.matches(c[2], p:log(), 1, true)
      assert.equal("", p:output())
    end
    assert.equal(0, mg.run(function() return env:conns():call("EXISTS", "refused:jobs") end))
  end)
end)
