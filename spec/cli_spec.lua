local cli = require "cli"
local tmp = require "tmp"

describe("moongraph CLI", function()
  it("prints its version", function()
    local r = cli.run({ "--version" })
    assert.equal(0, r.code)
    assert.matches("^moongraph %d+%.%d+%.%d+", r.out)
  end)

  it("prints help on `help` and exits 0", function()
    local r = cli.run({ "help" })
    assert.equal(0, r.code)
    assert.matches("usage: moongraph", r.out)
  end)

  it("exits 2 with the usage on an unknown command", function()
    local r = cli.run({ "frobnicate" })
    assert.equal(2, r.code)
    assert.matches("unknown command 'frobnicate'", r.err)
    assert.matches("usage: moongraph", r.err)
  end)

  it("exits 2 with the usage on a bad flag", function()
    local r = cli.run({ "--frob" })
    assert.equal(2, r.code)
    assert.matches("unknown option '%-%-frob'", r.err)
  end)

  it("exits 2 when run has no file", function()
    assert.equal(2, cli.run({ "run" }).code)
  end)

  it("runs a script with `arg` as in lua and the arguments as ...", function()
    local p = cli.write_temp([[
      local mg = require "moongraph"
      local a, b = ...
      mg.sleep(0.001)
      print(arg[0] ~= nil, arg[1], arg[2], a, b, #arg)
    ]])
    local r = cli.run({ "run", p, "x", "y" })
    assert.equal(0, r.code)
    assert.equal("true\tx\ty\tx\ty\t2\n", r.out)
  end)

  it("waits for tasks the script spawned but did not join", function()
    local p = cli.write_temp([[
      local mg = require "moongraph"
      mg.spawn(function() mg.sleep(0.01); print("background done") end)
      print("main done")
    ]])
    local r = cli.run({ "run", p })
    assert.equal(0, r.code)
    assert.equal("main done\nbackground done\n", r.out)
  end)

  it("prints the traceback and exits 1 on a script error", function()
    local p = cli.write_temp([[
      local function inner() error("exploded") end
      inner()
    ]])
    local r = cli.run({ "run", p })
    assert.equal(1, r.code)
    assert.matches("exploded", r.err)
    assert.matches("stack traceback", r.err)
    assert.matches("in.-inner", r.err)
  end)

  it("exits 1 on a syntax error or a missing file", function()
    local p = cli.write_temp("local = 1")
    assert.equal(1, cli.run({ "run", p }).code)
    local r = cli.run({ "run", "/nonexistent/script.lua" })
    assert.equal(1, r.code)
    assert.matches("cannot open", r.err)
  end)

  it("-e runs a chunk inside a task", function()
    local r = cli.run({ "-e", "local mg = require 'moongraph'; mg.sleep(0.001); print(1 + 1)" })
    assert.equal(0, r.code)
    assert.equal("2\n", r.out)
  end)

  it("reports an unjoined failed task on stderr", function()
    local r = cli.run({ "-e", "require('moongraph').spawn(function() error('lost failure') end)" })
    assert.matches("never joined", r.err)
    assert.matches("lost failure", r.err)
  end)

  it("Ctrl-C stops a running script with status 130", function()
    local r = cli.run({ "-e", [[
      local mg = require "moongraph"
      local pid = io.open("/proc/self/stat"):read("l"):match("^%d+")
      mg.spawn(function() io.popen("kill -INT " .. pid):close() end)
      mg.sleep(30)
    ]] })
    assert.equal(130, r.code)
    assert.matches("interrupted", r.err)
  end)

  it("Ctrl-C after the main chunk returned stops the tasks it left running", function()
    local r = cli.run({ "-e", [[
      local mg = require "moongraph"
      local pid = io.open("/proc/self/stat"):read("l"):match("^%d+")
      mg.spawn(function() while true do mg.sleep(0.01) end end)
      -- tasks run once the main chunk has returned
      mg.spawn(function() io.popen("kill -INT " .. pid):close() end)
    ]] })
    assert.equal(130, r.code)
    assert.matches("interrupted", r.err)
  end)

  it("finds its Lua modules from any directory", function()
    local bin = cli.bin:sub(1, 1) == "/" and cli.bin or (os.getenv("PWD") .. "/" .. cli.bin)
    local h = io.popen("cd / && " .. cli.quote(bin) .. " -e 'print(require(\"moongraph\").now() > 0)' 2>&1")
    local out = h:read("a")
    h:close()
    assert.equal("true\n", out)
  end)

  it("MOONGRAPH_PATH wins over the embedded modules", function()
    local dir = tmp.dir("path")
    assert(os.execute("mkdir " .. dir .. "/moongraph"))
    local f = io.open(dir .. "/moongraph/pretty.lua", "w")
    f:write("return { format = function() return 'overridden' end }")
    f:close()
    local r = cli.run({ "-e", "print(require('moongraph.pretty').format(1))" },
      { env = "MOONGRAPH_PATH=" .. dir })
    assert.equal("overridden\n", r.out)
  end)

  it("an older copy of the runtime on package.path never shadows the embedded one", function()
    -- what `luarocks make` leaves in /usr/local/share/lua/5.4 after an upgrade
    local dir = tmp.dir("path")
    assert(os.execute("mkdir " .. dir .. "/moongraph"))
    local f = io.open(dir .. "/moongraph/pretty.lua", "w")
    f:write("return { format = function() return 'stale' end }")
    f:close()
    local r = cli.run({ "-e", "print(require('moongraph.pretty').format(1))" },
      { env = "LUA_PATH_5_4=" .. cli.quote(dir .. "/?.lua;;") })
    assert.equal(0, r.code, r.err)
    assert.equal("1\n", r.out)
  end)

  it("an installed copy (make install-app) runs its applications from any directory", function()
    local prefix = tmp.dir("prefix")
    local bin = cli.bin
    local ok = os.execute(("make -s -o %s install-app BIN=%s PREFIX=%s >/dev/null"):format(
      cli.quote(bin), cli.quote(bin), cli.quote(prefix)))
    local h = io.popen("cd / && env MOONGRAPH_LLM_BASE_URL= MOONGRAPH_LLM_API_KEY= " ..
      cli.quote(prefix .. "/bin/moongraph") .. " route --json '종이 어떻게 버려?' 2>&1")
    local out = h:read("a")
    h:close()
    assert.is_true(ok)
    assert.matches('"intent":"waste"', out, 1, true)
  end)
end)
