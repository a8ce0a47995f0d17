-- Who may call `moongraph serve`: failed authentications are limited per
-- client address (behind a trusted proxy, the address it forwarded), and
-- ids a client chooses are global but answer alike whoever holds them.
local lgserve = require "lgserve"

local KEYS = "MOONGRAPH_API_KEYS='alice-key-1=alice,bob-key-22=bob'"
local ALICE, BOB = "alice-key-1", "bob-key-22"

describe("serve: failed authentication", function()
  local s
  setup(function()
    s = lgserve.start { env = KEYS, args = { "--trusted-proxy", "10.9.0.0/16" } }
  end)
  teardown(function() if s then s:stop() end end)

  it("answers 429 to an address past 10 failures, whatever key it sends, until they age out", function()
    local statuses = {}
    for i = 1, 12 do
      statuses[i] = s:curl({ "/threads/search", "-X", "POST", "-d", "{}", "-H", "x-api-key: guess-" .. i }).status
    end
    for i = 1, 10 do assert.equal(401, statuses[i], "attempt " .. i) end
    assert.equal(429, statuses[11])
    local r = s:curl { "/threads/search", "-X", "POST", "-d", "{}", "-H", "x-api-key: " .. ALICE }
    assert.equal(429, r.status)
    assert.matches("^%d+$", r.headers["retry-after"])
    assert.matches("too many failed authentications from this address", r.json.detail)
    -- the Chat API shares the budget
    assert.equal(429, s:curl({ "/chat/conversations", "-H", "x-api-key: " .. ALICE }).status)
  end)

  it("counts a forwarded address only when the proxy is trusted", function()
    -- loopback is no trusted proxy here: its X-Forwarded-For is ignored
    -- (the spec above already used up loopback's budget)
    local r = s:curl { "/threads/search", "-X", "POST", "-d", "{}", "-H", "x-api-key: " .. ALICE,
      "-H", "X-Forwarded-For: 198.51.100.7" }
    assert.equal(429, r.status)
  end)
end)

describe("serve: failed authentication behind a trusted proxy", function()
  local s
  setup(function()
    s = lgserve.start { env = KEYS, args = { "--trusted-proxy", "127.0.0.1" } }
  end)
  teardown(function() if s then s:stop() end end)

  it("limits each forwarded client on its own", function()
    local function try(addr, key)
      return s:curl({ "/threads/search", "-X", "POST", "-d", "{}", "-H", "x-api-key: " .. key,
        "-H", "X-Forwarded-For: " .. addr }).status
    end
    for i = 1, 10 do assert.equal(401, try("198.51.100.7", "wrong-" .. i)) end
    assert.equal(429, try("198.51.100.7", ALICE))
    -- a client's own X-Forwarded-For entries sit left of the proxy's: not taken
    assert.equal(429, try("203.0.113.1, 198.51.100.7", ALICE))
    assert.equal(200, try("198.51.100.8", ALICE))
  end)
end)

describe("serve: ids a client chooses", function()
  local s
  setup(function() s = lgserve.start { env = KEYS } end)
  teardown(function() if s then s:stop() end end)

  it("are global: taking one someone holds answers the same 409 whoever holds it", function()
    local function create(key)
      return s:curl { "/threads", "-X", "POST", "-H", "x-api-key: " .. key, "-H", "Content-Type: application/json",
        "-d", '{"thread_id": "shared-name"}' }
    end
    assert.equal(200, create(ALICE).status)
    local own, other = create(ALICE), create(BOB)
    assert.equal(409, own.status)
    assert.equal(409, other.status)
    assert.equal(own.json.detail, other.json.detail)
    -- and reading it is for its owner
    assert.equal(404, s:curl({ "/threads/shared-name", "-H", "x-api-key: " .. BOB }).status)
    assert.equal(200, s:curl({ "/threads/shared-name", "-H", "x-api-key: " .. ALICE }).status)
  end)

  it("made by the server are unguessable: uuid4 for threads and runs", function()
    local a = s:curl { "/threads", "-X", "POST", "-H", "x-api-key: " .. ALICE, "-d", "{}" }.json.thread_id
    local b = s:curl { "/threads", "-X", "POST", "-H", "x-api-key: " .. ALICE, "-d", "{}" }.json.thread_id
    local pattern = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"
    assert.matches(pattern, a)
    assert.matches(pattern, b)
    assert.not_equal(a:sub(1, 8), b:sub(1, 8))
  end)
end)
