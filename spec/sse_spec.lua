local core = require "moongraph.core"
local sse = core.sse

-- Feed `chunks` (a list of strings) and return every event.
local function parse(chunks, max)
  local p = sse.new(max)
  local out = {}
  for _, c in ipairs(chunks) do
    local evs, err = p:feed(c)
    if not evs then return nil, err, out end
    for _, e in ipairs(evs) do out[#out + 1] = e end
  end
  return out
end

local function bytes(s)
  local t = {}
  for i = 1, #s do t[i] = s:sub(i, i) end
  return t
end

describe("sse parser", function()
  it("parses a simple event", function()
    assert.same({ { event = "message", data = "hello" } }, parse({ "data: hello\n\n" }))
  end)

  it("joins multi-line data with LF and drops the final LF", function()
    assert.same({ { event = "message", data = "a\nb\n" } },
      parse({ "data: a\ndata: b\ndata\n\n" }))
  end)

  it("reads event, id and retry fields", function()
    local evs = parse({ "event: add\nid: 42\nretry: 1500\ndata: x\n\n" })
    assert.same({ { event = "add", data = "x", id = "42", retry = 1500 } }, evs)
  end)

  it("keeps the last event id for later events and exposes it", function()
    local p = sse.new()
    local evs = p:feed("id: 7\ndata: a\n\ndata: b\n\n")
    assert.equal("7", evs[1].id)
    assert.equal("7", evs[2].id)
    assert.equal("7", p:last_event_id())
  end)

  it("ignores an id containing NUL and a retry that is not all digits", function()
    local p = sse.new()
    local evs = p:feed("id: 1\n\nid: a\0b\nretry: 12a\ndata: x\n\n")
    assert.same({ { event = "message", data = "x", id = "1" } }, evs)
    assert.is_nil(p:retry())
  end)

  it("remembers the reconnection time from a retry-only block", function()
    local p = sse.new()
    assert.same({}, p:feed("retry: 3000\n\n"))
    assert.equal(3000, p:retry())
  end)

  it("skips comments and unknown fields, and blocks without data", function()
    assert.same({ { event = "message", data = "x" } },
      parse({ ": keep-alive\n\nevent: ping\n\nfoo: bar\ndata: x\n\n" }))
  end)

  it("resets the event name after each dispatch", function()
    local evs = parse({ "event: a\ndata: 1\n\ndata: 2\n\n" })
    assert.equal("a", evs[1].event)
    assert.equal("message", evs[2].event)
  end)

  it("removes one leading space only, and takes a line without colon as a field name", function()
    assert.same({ { event = "message", data = " two\n" } },
      parse({ "data:  two\ndata\n\n" }))
  end)

  it("accepts CR, LF and CRLF line endings", function()
    local want = { { event = "message", data = "a" }, { event = "message", data = "b" },
                   { event = "message", data = "c" } }
    assert.same(want, parse({ "data: a\r\rdata: b\n\ndata: c\r\n\r\n" }))
  end)

  it("handles CRLF split across chunks as one line ending", function()
    assert.same({ { event = "message", data = "a\nb" } },
      parse({ "data: a\r", "\ndata: b\r", "\n\r", "\n" }))
  end)

  it("gives the same events for any chunking, down to single bytes", function()
    local stream = "\239\187\191event: e\r\ndata: x\r\n: c\rdata: y\n\nid: 9\nretry: 5\ndata: z\r\n\r\n"
    local whole = parse({ stream })
    assert.equal(2, #whole)
    assert.same(whole, parse(bytes(stream)))
    for cut = 0, #stream do
      assert.same(whole, parse({ stream:sub(1, cut), stream:sub(cut + 1) }))
    end
  end)

  it("drops a leading BOM, even split across chunks, and only at the start", function()
    assert.same({ { event = "message", data = "x" } }, parse({ "\239", "\187", "\191data: x\n\n" }))
    -- not a BOM after all: the bytes are part of the field name
    assert.same({}, parse({ "\239\187data: x\n\n" }))
    local evs = parse({ "data: x\n\n\239\187\191data: y\n\n" })
    assert.equal(1, #evs)
  end)

  it("keeps NUL bytes in data", function()
    assert.same({ { event = "message", data = "a\0b" } }, parse({ "data: a\0b\n\n" }))
  end)

  it("does not dispatch an unterminated last event", function()
    assert.same({}, parse({ "data: x\n" }))
  end)

  it("parses an OpenAI-style stream", function()
    local evs = parse({ 'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n', "data: [DONE]\n\n" })
    assert.equal(2, #evs)
    assert.equal("[DONE]", evs[2].data)
  end)

  it("fails clearly when a line exceeds max_bytes, and stays failed until reset", function()
    local p = sse.new(16)
    local evs, err = p:feed("data: short\n\ndata: " .. string.rep("x", 32) .. "\n\n")
    assert.is_nil(evs)
    assert.matches("exceeds 16 bytes", err)
    local again, err2 = p:feed("data: ok\n\n")
    assert.is_nil(again)
    assert.matches("exceeds 16 bytes", err2)
    p:reset()
    assert.same({ { event = "message", data = "ok" } }, p:feed("data: ok\n\n"))
  end)

  it("bounds the data of one event by max_bytes too", function()
    local p = sse.new(12)
    local evs, err = p:feed("data: 12345\ndata: 12345\ndata: 1\n\n")
    assert.is_nil(evs)
    assert.matches("exceeds 12 bytes", err)
  end)

  it("reset forgets a half-read event and the last id", function()
    local p = sse.new()
    p:feed("id: 3\ndata: partial")
    p:reset()
    assert.same({ { event = "message", data = "new" } }, p:feed("data: new\n\n"))
    assert.is_nil(p:last_event_id())
  end)

  it("rejects bad arguments", function()
    assert.has_error(function() sse.new(-1) end, "bad argument #1 to 'new' (max_bytes must be >= 0)")
    assert.has_error(function() sse.new():feed(nil) end,
      "bad argument #1 to 'feed' (string expected, got nil)")
  end)
end)
