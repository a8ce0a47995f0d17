-- tools/check-deps: the layer and cycle check `make test` runs first.
local cli = require "cli"
local tmp = require "tmp"

local function tree(files)
  local root = tmp.dir("tree")
  for path, text in pairs(files) do
    local dir = (root .. "/" .. path):match("^(.*)/[^/]+$")
    assert(os.execute("mkdir -p " .. cli.quote(dir)))
    local f = assert(io.open(root .. "/" .. path, "w"))
    f:write(text)
    f:close()
  end
  return root
end

local function check(root)
  local p = io.popen("lua5.4 tools/check-deps " .. cli.quote(root) .. " 2>&1; echo \"exit=$?\"")
  local out = p:read("a")
  p:close()
  tmp.remove(root)
  return out
end

describe("tools/check-deps", function()
  it("passes the project itself", function()
    local p = io.popen("lua5.4 tools/check-deps . 2>&1; echo \"exit=$?\"")
    local out = p:read("a")
    p:close()
    assert.matches("exit=0", out)
    assert.matches("layers respected, no require cycle", out)
  end)

  it("passes a tree whose calls only go downward", function()
    local out = check(tree {
      ["runtime/lua/moongraph/a.lua"] = 'local b = require "moongraph.b"',
      ["runtime/lua/moongraph/b.lua"] = '-- require "scripts.x" in a comment does not count\nreturn {}',
      ["nodes/n.lua"] = 'local lib = require "nodes.lib.l"\nlocal mg = require "moongraph"',
      ["nodes/lib/l.lua"] = 'local r = require("nodes.rules.r")',
      ["scripts/app/p.lua"] = 'local n = require "nodes.n"',
    })
    assert.matches("exit=0", out)
  end)

  it("fails on the runtime requiring an application, naming the file", function()
    local out = check(tree { ["runtime/lua/moongraph/a.lua"] = 'local x = require("scripts.eco.chat")' })
    assert.matches("runtime/lua/moongraph/a.lua: the runtime requires application code 'scripts.eco.chat'", out, 1, true)
    assert.matches("exit=1", out)
  end)

  it("fails on a node requiring scripts/ and a node library requiring a node", function()
    local out = check(tree {
      ["nodes/n.lua"] = "local r = require 'scripts.eco.rules'",
      ["nodes/lib/l.lua"] = 'local n = require "nodes.n"',
    })
    assert.matches("nodes/n.lua: a node requires 'scripts.eco.rules'", out, 1, true)
    assert.matches("nodes/lib/l.lua: a node library requires the node 'nodes.n'", out, 1, true)
    assert.matches("exit=1", out)
  end)

  it("fails on a require cycle, even through a require inside a function", function()
    local out = check(tree {
      ["runtime/lua/moongraph/a.lua"] = 'local b = require "moongraph.b"',
      ["runtime/lua/moongraph/b.lua"] = 'local function lazy() return require("moongraph.c") end',
      ["runtime/lua/moongraph/c/init.lua"] = 'local a = require "moongraph.a"',
    })
    assert.matches("require cycle: moongraph.a -> moongraph.b -> moongraph.c -> moongraph.a", out, 1, true)
    assert.matches("exit=1", out)
  end)

  it("fails on a runtime module that requires lua-cjson itself, not through moongraph.json", function()
    local out = check(tree {
      ["runtime/lua/moongraph/json.lua"] = 'local cjson = require "cjson.safe"',
      ["runtime/lua/moongraph/a.lua"] = 'local cjson = require("cjson").new()',
    })
    assert.matches("runtime/lua/moongraph/a.lua: requires 'cjson'; the runtime's JSON goes through moongraph.json",
      out, 1, true)
    assert.is_nil(out:find("json.lua: requires", 1, true))
    assert.matches("exit=1", out)
  end)
end)
