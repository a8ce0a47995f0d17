-- The saver interface contract (spec/support/saver_contract.lua) run against
-- the savers of moongraph.checkpoint, and the file saver's on-disk layout.
local mg = require "moongraph"
local checkpoint = require "moongraph.checkpoint"
local tmp = require "tmp"
local json = require "moongraph.json"

local function cp(id, values, step)
  return { v = 1, id = id, ts = "2025-01-01T00:00:00Z", step = step or 0,
    values = values or {}, next = {} }
end

local contract = require "saver_contract"

contract("memory", function() return checkpoint.memory() end, _ENV)
contract("file", function() return checkpoint.file(tmp.dir("saver")) end, _ENV)

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("a")
  f:close()
  return text
end

local function append(path, text)
  local f = assert(io.open(path, "ab"))
  f:write(text)
  f:close()
end

-- The records of a log: each line "<bytes> <json>" whose length matches,
-- decoded; and how many other lines there are besides the header.
local function records(path)
  local out, other = {}, 0
  for line in read(path):gmatch("[^\n]+") do
    local len, text = line:match("^(%d+) (.*)$")
    if len and tonumber(len) == #text then
      out[#out + 1] = json.decode(text)
    elseif not line:match('^{"type":"log","format":1,"log":"[%x%-]+"}$') then
      other = other + 1
    end
  end
  return out, other
end

describe("file saver layout", function()
  it("appends readable JSON records to one log per thread and namespace", function()
    local dir = tmp.dir("saver")
    mg.run(function()
      local s = checkpoint.file(dir)
      local c = assert(s:put({ thread_id = "user 42/chat" }, cp("00ab", { msg = "héllo" }), { source = "input" }))
      assert(s:put_writes(c, "1:rag", { { "docs", { "a" } } }))
      assert(s:put({ thread_id = "user 42/chat", checkpoint_id = "00ab" }, cp("00ac"), { source = "loop" }))
    end)
    local log = dir .. "/user%2042%2Fchat/root/checkpoints.log"
    assert.matches('^{"type":"log","format":1,"log":"[%x%-]+"}\n', read(log))
    local r, other = records(log)
    assert.equal(3, #r)
    assert.equal(0, other)
    assert.same({ "checkpoint", "00ab", "héllo", "input" }, { r[1].type, r[1].id, r[1].checkpoint.values.msg, r[1].metadata.source })
    assert.is_nil(r[1].parent)
    assert.same({ "writes", "00ab", "1:rag" }, { r[2].type, r[2].id, r[2].task_id })
    assert.same({ { "docs", { "a" } } }, r[2].writes)
    assert.same({ "checkpoint", "00ac", "00ab" }, { r[3].type, r[3].id, r[3].parent })
    local p = io.popen("ls -A '" .. dir .. "/user%2042%2Fchat/root'")
    assert.equal("checkpoints.log", p:read("a"):gsub("%s+$", ""))
    p:close()
  end)

  it("refuses a put of a process that still knows a log another one removed and wrote again", function()
    local dir = tmp.dir("saver")
    mg.run(function()
      local a, b = checkpoint.file(dir), checkpoint.file(dir)   -- two processes
      local c = assert(a:put({ thread_id = "t" }, cp("0001", { x = "a" }), {}))
      assert(b:delete_thread("t"))
      -- b starts the thread again, its log longer than the one a knew
      local c5 = assert(b:put({ thread_id = "t" }, cp("0005", { x = string.rep("z", 500) }), {}))
      assert(b:put_writes(c5, "1:n", { { "y", 1 } }))
      local r, err = a:put(c, cp("0009", { x = "a2" }), {})
      assert.is_nil(r)
      assert.matches("checkpoint conflict: thread 't' is at checkpoint 0005, not 0001", err)
      -- and one of the same length as the old one: told apart by its header
      assert(a:delete_thread("u") and b:delete_thread("u"))
      local cu = assert(a:put({ thread_id = "u" }, cp("0001", { x = "a" }), {}))
      assert(b:delete_thread("u"))
      assert(b:put({ thread_id = "u" }, cp("0002", { x = "b" }), {}))
      r, err = a:put(cu, cp("0003", { x = "c" }), {})
      assert.is_nil(r)
      assert.matches("checkpoint conflict: thread 'u' is at checkpoint 0002, not 0001", err)
      assert.equal("0002", b:get({ thread_id = "u" }).checkpoint.id)
    end)
  end)

  it("appends to a log whose header is long", function()
    local dir = tmp.dir("saver")
    local path = dir .. "/t/root"
    assert(os.execute("mkdir -p '" .. path .. "'"))
    append(path .. "/checkpoints.log", '{"type":"log","format":1,"log":"' .. string.rep("a", 600) .. '"}\n')
    mg.run(function()
      local s = checkpoint.file(dir)
      assert.is_nil(s:get { thread_id = "t" })
      -- (a header compared in pieces: one longer than a piece is not taken as changed)
      local r, err = mg.timeout(10, s.put, s, { thread_id = "t" }, cp("0001", { n = 1 }), {})
      assert(r, tostring(err))
      assert.equal(1, s:get({ thread_id = "t" }).checkpoint.values.n)
    end)
  end)

  it("skips a record torn by a crash and appends after it", function()
    local dir = tmp.dir("saver")
    local log = dir .. "/t/root/checkpoints.log"
    mg.run(function()
      local s = checkpoint.file(dir)
      assert(s:put({ thread_id = "t" }, cp("0001", { ok = true }), {}))
    end)
    -- a put that never returned: its record cut short, no newline
    local whole = read(log):match("\n(%d+ [^\n]*)\n$")
    append(log, (whole:gsub('"0001"', '"0002"')):sub(1, 40))
    mg.run(function()
      local s = checkpoint.file(dir)
      local t = s:get({ thread_id = "t" })
      assert.equal("0001", t.config.checkpoint_id)
      assert.is_true(t.checkpoint.values.ok)
      assert(s:put({ thread_id = "t", checkpoint_id = "0001" }, cp("0003", { n = 3 }), {}))
      assert.equal("0003", s:get({ thread_id = "t" }).config.checkpoint_id)
      assert.same({ "0003", "0001" }, { s:list({ thread_id = "t" })[1].config.checkpoint_id,
                                        s:list({ thread_id = "t" })[2].config.checkpoint_id })
    end)
    -- the torn bytes stay a line of their own, before the next record
    local r, torn = records(log)
    assert.same({ "0001", "0003" }, { r[1].id, r[2].id })
    assert.equal(1, torn)
  end)

  it("reads a thread written one file per checkpoint, and goes on from it in the log", function()
    local dir = tmp.dir("saver")
    local ns = dir .. "/t%201/root"
    assert(os.execute("mkdir -p '" .. ns .. "'"))
    -- the earlier layout: <id>.json and <id>.<task>.writes.json
    append(ns .. "/0001.json", '{\n"checkpoint": ' .. json.encode(cp("0001", { a = 1 })) ..
      ',\n"metadata": {"step": 0}\n}\n')
    append(ns .. "/0002.json", '{\n"checkpoint": ' .. json.encode(cp("0002", { a = 2 }, 1)) ..
      ',\n"metadata": {"step": 1},\n"parent_checkpoint_id": "0001"\n}\n')
    append(ns .. "/0002.2%3Ab.writes.json", '{\n"task_id": "2:b",\n"writes": [["a", 5]]\n}\n')
    append(ns .. "/0002.2%3Aa.writes.json", '{\n"task_id": "2:a",\n"writes": [["a", 4]]\n}\n')
    mg.run(function()
      local s = checkpoint.file(dir)
      local t = s:get({ thread_id = "t 1" })
      assert.equal("0002", t.config.checkpoint_id)
      assert.equal("0001", t.parent_config.checkpoint_id)
      assert.same({ { "2:a", "a", 4 }, { "2:b", "a", 5 } }, t.pending_writes)
      -- a stale writer is refused, the head goes on
      local ok, err = s:put({ thread_id = "t 1", checkpoint_id = "0001" }, cp("0003"), {})
      assert.is_nil(ok)
      assert.matches("checkpoint conflict", err)
      assert(s:put({ thread_id = "t 1", checkpoint_id = "0002" }, cp("0003", { a = 9 }, 2), {}))
      local ids = {}
      for _, x in ipairs(s:list({ thread_id = "t 1" })) do ids[#ids + 1] = x.config.checkpoint_id end
      assert.same({ "0003", "0002", "0001" }, ids)
      assert.equal(9, s:get({ thread_id = "t 1" }).checkpoint.values.a)
    end)
  end)

  it("keeps the later of two records of one task's writes", function()
    local dir = tmp.dir("saver")
    mg.run(function()
      local s = checkpoint.file(dir)
      local c = assert(s:put({ thread_id = "t" }, cp("0001"), {}))
      assert(s:put_writes(c, "1:a", { { "x", 1 } }))
      assert(s:put_writes(c, "1:a", { { "x", 2 } }))
      assert.same({ { "1:a", "x", 2 } }, s:get({ thread_id = "t" }).pending_writes)
    end)
  end)

  it("sees another saver's checkpoints under the log's lock: a stale put is a conflict", function()
    local dir = tmp.dir("saver")
    mg.run(function()
      local a, b = checkpoint.file(dir), checkpoint.file(dir)
      assert(a:put({ thread_id = "t" }, cp("0001"), {}))
      assert.equal("0001", b:get({ thread_id = "t" }).config.checkpoint_id)   -- b has read the head
      assert(a:put({ thread_id = "t", checkpoint_id = "0001" }, cp("0002"), {}))
      local ok, err = b:put({ thread_id = "t", checkpoint_id = "0001" }, cp("0003"), {})
      assert.is_nil(ok)
      assert.matches("at checkpoint 0002, not 0001", err)
      assert(b:put({ thread_id = "t", checkpoint_id = "0002" }, cp("0003"), {}))
      assert.equal("0003", a:get({ thread_id = "t" }).config.checkpoint_id)
    end)
  end)
end)

describe("file saver log damaged", function()
  -- a log of three checkpoints, then cut at every byte, and bytes flipped
  local function make_log()
    local dir = tmp.dir("saver")
    mg.run(function()
      local s = checkpoint.file(dir)
      local c = assert(s:put({ thread_id = "t" }, cp("0001", { k = "한 글" }), {}))
      assert(s:put_writes(c, "1:a", { { "k", "x\ny" } }))
      c = assert(s:put(c, cp("0002", { k = 2 }, 1), {}))
      assert(s:put(c, cp("0003", { k = 3 }, 2), {}))
    end)
    return dir, dir .. "/t/root/checkpoints.log"
  end

  it("keeps the whole records of a log cut at any byte", function()
    local dir, log = make_log()
    local full = read(log)
    local ends = {}   -- byte offsets where each record's line ends
    for pos in full:gmatch("()\n") do ends[#ends + 1] = pos end
    for cut = 0, #full do
      local f = assert(io.open(log, "wb"))
      f:write(full:sub(1, cut))
      f:close()
      local whole = 0   -- checkpoint records whose line is complete
      for i = 2, #ends do
        if ends[i] <= cut and i ~= 3 then whole = whole + 1 end   -- line 3: the writes
      end
      mg.run(function()
        local s = checkpoint.file(dir)
        local list = assert(s:list({ thread_id = "t" }))
        assert.equal(whole, #list, "cut at " .. cut)
        if whole > 0 then
          assert.equal(string.format("%04d", whole), s:get({ thread_id = "t" }).config.checkpoint_id)
        end
      end)
    end
  end)

  it("reads around flipped bytes without raising", function()
    local dir, log = make_log()
    local full = read(log)
    math.randomseed(7)
    for _ = 1, 300 do
      local bytes = { full:byte(1, -1) }
      for _ = 1, math.random(1, 4) do
        bytes[math.random(#bytes)] = math.random(0, 255)
      end
      local f = assert(io.open(log, "wb"))
      f:write(string.char(table.unpack(bytes)))
      f:close()
      mg.run(function()
        local s = checkpoint.file(dir)
        local ok, list = pcall(s.list, s, { thread_id = "t" })
        assert.is_true(ok, tostring(list))
        assert.is_true(list == nil or #list <= 3)
        local gok, err = pcall(s.get, s, { thread_id = "t" })
        assert.is_true(gok, tostring(err))
      end)
    end
  end)
end)
