-- Lua files compiled once and kept between processes (moongraph.chunkcache):
-- a module or script run from the cache behaves exactly as from its source,
-- and an edited file is never run from a stale entry.
local cli = require "cli"
local tmp = require "tmp"

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function entries(dir)
  local n = 0
  local p = io.popen("ls -A '" .. dir .. "' 2>/dev/null")
  for l in p:lines() do
    if l:match("^luac%-") then n = n + 1 end
  end
  p:close()
  return n
end

describe("moongraph.chunkcache", function()
  local dir, cache, env

  before_each(function()
    dir = tmp.dir("chunkcache")
    cache = dir .. "/cache"
    env = "MOONGRAPH_CACHE_DIR=" .. cli.quote(cache) .. " LUA_PATH=" .. cli.quote(dir .. "/?.lua;;")
  end)
  after_each(function() tmp.remove(dir) end)

  local function run(...)
    return cli.run({ "run", dir .. "/main.lua", ... }, { env = env })
  end

  it("runs a required module from the cache, and an edited one from its new text", function()
    write(dir .. "/main.lua", 'print(require("greeting").text)')
    write(dir .. "/greeting.lua", 'return { text = "hello" }')
    local r = run()
    assert.equal(0, r.code, r.err)
    assert.equal("hello\n", r.out)
    assert.equal(2, entries(cache))        -- the script and the module
    r = run()
    assert.equal("hello\n", r.out)
    -- same size, same second: only the text tells the versions apart
    write(dir .. "/greeting.lua", 'return { text = "howdy" }')
    r = run()
    assert.equal(0, r.code, r.err)
    assert.equal("howdy\n", r.out)
    write(dir .. "/main.lua", 'print(require("greeting").text .. "!")')
    assert.equal("howdy!\n", run().out)
  end)

  it("keeps file names and line numbers in errors and tracebacks", function()
    write(dir .. "/main.lua", 'require("broken").fail()')
    write(dir .. "/broken.lua", 'local M = {}\n\nfunction M.fail()\n  error("boom")\nend\nreturn M\n')
    for _ = 1, 2 do   -- compiled, then from the cache
      local r = run()
      assert.are_not.equal(0, r.code)
      assert.matches("broken.lua:4: boom", r.err, 1, true)
      assert.matches("main.lua:1:", r.err, 1, true)
    end
  end)

  it("reports a syntax error as Lua does, and caches nothing for it", function()
    write(dir .. "/main.lua", 'require("bad")')
    write(dir .. "/bad.lua", 'local x = \nreturn x +')
    local r = run()
    assert.are_not.equal(0, r.code)
    assert.matches("error loading module 'bad' from file '.*bad.lua'", r.err)
    assert.matches("bad.lua:2:", r.err, 1, true)
    assert.equal(1, entries(cache))        -- main.lua only
  end)

  it("skips a #! first line and keeps the line numbers after it", function()
    write(dir .. "/main.lua", '#!/usr/bin/env moongraph\nlocal info = debug.getinfo(1, "l")\nprint(info.currentline)')
    for _ = 1, 2 do
      local r = run()
      assert.equal(0, r.code, r.err)
      assert.equal("2\n", r.out)
    end
  end)

  it("works with the cache off or unwritable", function()
    write(dir .. "/main.lua", 'print(require("greeting").text)')
    write(dir .. "/greeting.lua", 'return { text = "hello" }')
    for _, setting in ipairs { "off", "/proc/no-such-dir" } do
      local r = cli.run({ "run", dir .. "/main.lua" },
        { env = "MOONGRAPH_CACHE_DIR=" .. setting .. " LUA_PATH=" .. cli.quote(dir .. "/?.lua;;") })
      assert.equal(0, r.code, r.err)
      assert.equal("hello\n", r.out)
    end
  end)

  it("serves the runtime's own modules precompiled, with their names and lines", function()
    local r = cli.run({ "-e", 'local ok, err = pcall(require("moongraph.filecache").fetch, 42); print(err)' })
    assert.equal(0, r.code, r.err)
    assert.matches("bad argument #1 to 'fetch'", r.out, 1, true)
    r = cli.run({ "-e", 'print(debug.getinfo(require("moongraph.filecache").fetch, "S").short_src)' })
    assert.equal("[moongraph]/moongraph.filecache\n", r.out)
  end)
end)
