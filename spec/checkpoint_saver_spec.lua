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

describe("file saver layout", function()
  it("writes one directory per thread with readable JSON and no temp files left", function()
    local dir = tmp.dir("saver")
    mg.run(function()
      local s = checkpoint.file(dir)
      local c = assert(s:put({ thread_id = "user 42/chat" }, cp("00ab", { msg = "héllo" }), { source = "input" }))
      assert(s:put_writes(c, "1:rag", { { "docs", { "a" } } }))
    end)
    local tdir = dir .. "/user%2042%2Fchat/root"
    local f = assert(io.open(tdir .. "/00ab.json"))
    local text = f:read("a")
    f:close()
    assert.matches('\n"checkpoint": {\n  "id"', text)
    local doc = json.decode(text)
    assert.equal("héllo", doc.checkpoint.values.msg)
    assert.equal("input", doc.metadata.source)
    local w = assert(io.open(tdir .. "/00ab.1%3Arag.writes.json"))
    local wdoc = json.decode(w:read("a"))
    w:close()
    assert.equal("1:rag", wdoc.task_id)
    assert.same({ { "docs", { "a" } } }, wdoc.writes)
    local p = io.popen("find " .. dir .. " -name '*.tmp.*' | wc -l")
    assert.equal("0", p:read("l"))
    p:close()
  end)

  it("survives a torn temp file next to a checkpoint", function()
    local dir = tmp.dir("saver")
    mg.run(function()
      local s = checkpoint.file(dir)
      assert(s:put({ thread_id = "t" }, cp("0001", { ok = true }), {}))
    end)
    local f = assert(io.open(dir .. "/t/root/0002.json.tmp.99.1", "w"))
    f:write('{"checkpoint": {"id": "00')
    f:close()
    mg.run(function()
      local s = checkpoint.file(dir)
      assert.is_true(s:get({ thread_id = "t" }).checkpoint.values.ok)
    end)
  end)
end)
