-- moongraph.filecache: derived data kept in a file, valid only while its
-- inputs are byte for byte the same.
local filecache = require "moongraph.filecache"

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'"))
  return d
end

local function files_in(dir)
  local out = {}
  local p = io.popen("ls -A '" .. dir .. "' 2>/dev/null")
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

describe("moongraph.filecache", function()
  local dir, builds
  local function fetch(inputs, extra)
    local o = { name = "thing", key = "k", dir = dir, inputs = inputs, build = function()
      builds = builds + 1
      return "derived from " .. table.concat(inputs, "+")
    end }
    for k, v in pairs(extra or {}) do o[k] = v end
    return filecache.fetch(o)
  end

  before_each(function()
    dir = tmpdir() .. "/cache"   -- not there yet: the first save makes it
    builds = 0
  end)
  after_each(function() os.execute("rm -rf '" .. dir:gsub("/cache$", "") .. "'") end)

  it("builds on the first fetch and saves the entry", function()
    local bytes, how = fetch { "a", "b" }
    assert.equal("derived from a+b", bytes)
    assert.equal("built", how)
    assert.equal(1, builds)
    assert.equal(1, #files_in(dir))
  end)

  it("answers from the entry while the inputs are the same", function()
    fetch { "a", "b" }
    local bytes, how = fetch { "a", "b" }
    assert.equal("derived from a+b", bytes)
    assert.equal("hit", how)
    assert.equal(1, builds)
  end)

  it("builds afresh and replaces the entry when an input's content changes", function()
    fetch { "a", "b" }
    local bytes, how = fetch { "a", "B" }
    assert.equal("derived from a+B", bytes)
    assert.equal("built", how)
    assert.equal(2, builds)
    assert.same({ "derived from a+B", "hit" }, { fetch { "a", "B" } })
    assert.equal(1, #files_in(dir))
  end)

  it("builds afresh when an input is added or one moves", function()
    fetch { "ab", "" }
    assert.equal("built", select(2, fetch { "a", "b" }))
    assert.equal("built", select(2, fetch { "a", "b", "" }))
    assert.equal(3, builds)
  end)

  it("keeps entries of different keys apart", function()
    fetch { "a" }
    fetch({ "b" }, { key = "other" })
    assert.equal("hit", select(2, fetch { "a" }))
    assert.equal("hit", select(2, fetch({ "b" }, { key = "other" })))
    assert.equal(2, #files_in(dir))
  end)

  it("rebuilds an entry that was cut short or damaged", function()
    fetch { "a" }
    local path = assert(filecache.path("thing", "k", dir))
    local f = assert(io.open(path, "rb"))
    local whole = f:read("a")
    f:close()
    for _, damaged in ipairs { whole:sub(1, #whole - 3), "junk", "" } do
      f = assert(io.open(path, "wb"))
      f:write(damaged)
      f:close()
      local bytes, how = fetch { "a" }
      assert.equal("derived from a", bytes)
      assert.equal("built", how)
    end
    assert.equal("hit", select(2, fetch { "a" }))
  end)

  it("keeps nothing with dir = false", function()
    assert.same({ "derived from a", "built, cache off" }, { fetch({ "a" }, { dir = false }) })
    assert.same({ "derived from a", "built, cache off" }, { fetch({ "a" }, { dir = false }) })
    assert.equal(2, builds)
  end)

  it("still answers when the directory cannot be written", function()
    dir = "/proc/no-such-cache-dir"
    local bytes, how = fetch { "a" }
    assert.equal("derived from a", bytes)
    assert.matches("^built, not saved: ", how)
  end)

  it("returns the build's error", function()
    local bytes, err = filecache.fetch { name = "thing", dir = dir, inputs = {},
                                         build = function() return nil, "no data" end }
    assert.is_nil(bytes)
    assert.equal("no data", err)
    assert.equal(0, #files_in(dir))
  end)

  it("rejects bad arguments", function()
    local ok_build = function() return "x" end
    assert.error_matches(function() filecache.fetch() end, "bad argument #1 to 'fetch'")
    assert.error_matches(function() filecache.fetch { name = "a/b", inputs = {}, build = ok_build } end,
      "name must be")
    assert.error_matches(function() filecache.fetch { name = "a", inputs = { 1 }, build = ok_build } end,
      "input 1 is a number")
    assert.error_matches(function() filecache.fetch { name = "a", inputs = {} } end, "build must be a function")
    assert.error_matches(function() filecache.fetch { name = "a", inputs = {}, build = ok_build, dir = 1 } end,
      "dir must be")
  end)

  it("finds the directory in MOONGRAPH_CACHE_DIR, XDG_CACHE_HOME, then HOME", function()
    local function dir_with(env)
      local p = io.popen(env .. " lua5.4 -e 'package.path = \"runtime/lua/?.lua;\" .. package.path;" ..
        " print(require(\"moongraph.filecache\").dir())'")
      local out = p:read("a")
      p:close()
      return (out:gsub("\n$", ""))
    end
    assert.equal("/x/c", dir_with("env MOONGRAPH_CACHE_DIR=/x/c/ XDG_CACHE_HOME=/y HOME=/z"))
    assert.equal("/y/moongraph", dir_with("env -u MOONGRAPH_CACHE_DIR XDG_CACHE_HOME=/y HOME=/z"))
    assert.equal("/z/.cache/moongraph", dir_with("env -u MOONGRAPH_CACHE_DIR -u XDG_CACHE_HOME HOME=/z"))
    assert.equal("nil\tcache off", dir_with("env MOONGRAPH_CACHE_DIR=off HOME=/z"))
  end)

  it("gives the source of a function loaded from a file, and of one loaded from a string", function()
    local src = assert(filecache.source_of(filecache.fetch))
    assert.truthy(src:find("moongraph.filecache", 1, true))
    local code = "return function() return 1 end"
    assert.equal(code, filecache.source_of(load(code)()))
  end)
end)
