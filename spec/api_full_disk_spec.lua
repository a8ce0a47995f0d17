-- `moongraph serve` on a disk that fills up (a tmpfs of its own,
-- spec/support/fulldisk.lua): nothing accepted is lost, nothing is left
-- half written, and the clients hear 503 without the server's paths.
local chatserve = require "chatserve"
local fulldisk = require "fulldisk"
local cjson = require "cjson"

local GATE = { "--script", "gate=spec/fixtures/chat_gate.lua", "--rate-limit", "0" }

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function count(text, pattern)
  local n = 0
  for _ in (text or ""):gmatch(pattern) do n = n + 1 end
  return n
end

-- every file the server wrote is whole: JSON records parse, logs end in a
-- newline and every line of theirs is a record, none is empty
local function all_whole(d)
  local p = assert(io.popen("find " .. d:path("state") .. " -type f"))
  local files = {}
  for path in p:lines() do files[#files + 1] = path end
  p:close()
  assert.is_true(#files > 0)
  for _, path in ipairs(files) do
    local body = assert(slurp(path))
    assert.is_true(#body > 0, path .. " is empty")
    if path:match("%.json$") then
      assert.is_table(cjson.decode(body), path)
    elseif path:match("%.log$") then
      assert.equal("\n", body:sub(-1), path .. " ends in half a line")
      for line in body:gmatch("([^\n]*)\n") do
        -- (job events: "id\ttype\tjson"; checkpoint logs: "length json")
        assert.is_truthy(line:match("^%d+\t[%w_]+\t{") or line:match("^%d+ {") or line:match("^{"),
          path .. ": " .. line)
      end
    end
  end
end

describe("serve on a full disk", function()
  local d, s
  setup(function()
    d = fulldisk.new("16m")
    s = chatserve.start { prefix = d.prefix, data = d.dir .. "/state", args = GATE }
  end)
  teardown(function()
    if s then s:stop() end
    if d then d:destroy() end
  end)
  before_each(function()
    s:close_gate()
    d:free()
  end)

  local function events_log(job_id) return slurp(d:path("state/chat/events/" .. job_id .. ".log")) or "" end

  -- a message accepted, its run held mid-answer at the gate, the disk
  -- full, then the run let go: its outcome cannot be stored
  local function outcome_unstorable()
    local j = s:post({ message = "paper?" }).json
    chatserve.wait_until(function() return count(events_log(j.job_id), "\ttoken\t") >= 5 end, 20, "five tokens")
    d:fill()
    local before = #s:stderr()
    s:open_gate()
    chatserve.wait_until(function() return s:stderr():find("trying again", before, true) end, 20,
      "the server to find it cannot store the outcome")
    return j
  end

  it("stores and streams an accepted answer once space returns, not before", function()
    local j = outcome_unstorable()
    -- nothing says it is done while it is not stored
    assert.equal(0, count(events_log(j.job_id), "\tdone\t"))
    local conv = s:curl({ "/chat/conversations/" .. j.conversation_id }).json
    assert.equal(1, #conv.messages)
    d:free()
    local st = s:stream(j.job_id, { timeout = 60 })
    local last = st.events[#st.events]
    assert.equal("done", last.event)
    assert.equal("answer", st.events[#st.events - 1].event)
    conv = s:curl({ "/chat/conversations/" .. j.conversation_id }).json
    assert.equal(2, #conv.messages)
    assert.equal("assistant", conv.messages[2].role)
    assert.equal(last.json.status, conv.messages[2].status)
    local text = slurp(d:path("state/chat/jobs/" .. j.job_id .. ".json"))
    assert.is_string(text)
    local rec = cjson.decode(text)
    assert.equal(last.json.status, rec.status)
    all_whole(d)
  end)

  it("answers 503 with the request id, not its paths, while nothing can be stored, and leaves no empty file", function()
    s:open_gate()
    d:fill()
    local r = s:post({ message = "hello" })
    assert.equal(503, r.status)
    assert.equal("the service is unavailable: retry later", r.json.error)
    assert.equal(r.headers["x-request-id"], r.json.request_id)
    assert.is_nil(r.body:find("/", 1, true))
    -- the detail is the operator's, under that id
    assert.is_truthy(s:stderr():find("[" .. r.json.request_id .. "] POST /chat/messages: 503: ", 1, true))
    assert.is_truthy(s:stderr():find("No space left on device", 1, true))
    local t = s:curl { "-X", "POST", "/threads", "-H", "Content-Type: application/json", "-d", "{}" }
    assert.equal(503, t.status)
    assert.equal("the service is unavailable: retry later", t.json.detail)
    local run = s:curl { "-X", "POST", "/runs/wait", "-H", "Content-Type: application/json",
      "-d", '{"assistant_id": "gate", "input": {"message": "x"}}' }
    assert.is_true(run.status < 500 or run.status == 503, run.body)
    assert.is_nil(run.body:find(d.dir, 1, true), run.body)
    d:free()
    all_whole(d)
    local j = s:post({ message = "hello again" })
    assert.equal(202, j.status)
    assert.equal("done", s:stream(j.json.job_id).events[#s:stream(j.json.job_id).events].event)
  end)

  it("finishes after a crash an answer that could not be stored, exactly once", function()
    local j = outcome_unstorable()
    s:stop("KILL")
    d:free()
    s = chatserve.start { prefix = d.prefix, data = d.dir .. "/state", args = GATE }
    local st = s:stream(j.job_id, { timeout = 60 })
    assert.equal("done", st.events[#st.events].event)
    local conv = s:curl({ "/chat/conversations/" .. j.conversation_id }).json
    assert.equal(2, #conv.messages)
    assert.equal("assistant", conv.messages[2].role)
    all_whole(d)
  end)
end)
