local cli = require "cli"
local repl = require "moongraph.repl"

describe("REPL", function()
  it("evaluates a multi-line function definition and calls it", function()
    local r = cli.run({ "repl" }, { stdin = table.concat({
      "function add(a, b)",
      "  return a + b",
      "end",
      "add(2, 3)",
      "",
    }, "\n") })
    assert.equal(0, r.code)
    assert.equal("5\n", r.out)
  end)

  it("prints =expr and bare expressions with the table pretty-printer", function()
    local r = cli.run({ "repl" }, { stdin = "={b = 2, a = {1, 2}}\n'x', 3\n" })
    assert.equal(0, r.code, r.err)
    assert.equal('{ a = { 1, 2 }, b = 2 }\n"x"\t3\n', r.out)
  end)

  it("runs each entry in a task so waiting calls work at the prompt", function()
    local r = cli.run({ "repl" }, { stdin = "t0 = mg.now(); mg.sleep(0.01); return mg.now() - t0 >= 0.009\n" })
    assert.equal(0, r.code, r.err)
    assert.equal("true\n", r.out)
  end)

  it("runs an HTTP request at the prompt", function()
    local testserver = require "testserver"
    local srv = testserver.start()
    local r = cli.run({ "repl" }, { stdin = table.concat({
      "http = require 'moongraph.http'",
      "res = http.get('" .. srv.url .. "/delay?ms=20')",
      "res.status",
      "",
    }, "\n") })
    srv:stop()
    assert.equal(0, r.code)
    assert.equal("200\n", r.out)
  end)

  it("keeps tasks spawned at the prompt alive across entries", function()
    local r = cli.run({ "repl" }, { stdin = table.concat({
      "q = mg.queue()",
      "mg.spawn(function() q:put(q:get() * 2) end)",
      "q:put(21); mg.sleep(0)",
      "q:get()",
      "",
    }, "\n") })
    assert.equal(0, r.code, r.err)
    assert.matches("42\n$", r.out)
  end)

  it("reports an error and keeps going", function()
    local r = cli.run({ "repl" }, { stdin = "error('oops')\n1 + 1\n" })
    assert.equal(0, r.code)
    assert.matches("oops", r.err)
    assert.matches("2\n$", r.out)
  end)

  it("runs FILE first when given", function()
    local p = cli.write_temp("greeting = 'hi from file'")
    local r = cli.run({ "repl", p }, { stdin = "greeting\n" })
    assert.equal(0, r.code, r.err)
    assert.equal('"hi from file"\n', r.out)
  end)

  it("Ctrl-C cancels the running entry and keeps the prompt", function()
    local r = cli.run({ "repl" }, { stdin = table.concat({
      "pid = io.open('/proc/self/stat'):read('l'):match('^%d+')",
      "mg.spawn(function() io.popen('kill -INT ' .. pid):close() end); mg.sleep(30)",
      "'still here'",
      "",
    }, "\n") })
    assert.equal(0, r.code)
    assert.matches("cancelled", r.err)
    assert.equal('"still here"\n', r.out)
  end)

  it("Ctrl-C interrupts an entry stuck in a loop that never yields", function()
    local r = cli.run({ "repl" }, { stdin = table.concat({
      "pid = io.open('/proc/self/stat'):read('l'):match('^%d+')",
      "os.execute('(sleep 0.2; kill -INT ' .. pid .. ') &'); while true do end",
      "'still here'",
      "",
    }, "\n") })
    assert.equal(0, r.code)
    assert.matches("interrupted", r.err)
    assert.equal('"still here"\n', r.out)
  end)

  it("tells an incomplete statement from a syntax error", function()
    assert.same({ nil, "incomplete" }, { repl.compile("for i = 1, 2 do") })
    local fn, err = repl.compile("x = = 1")
    assert.is_nil(fn)
    assert.matches("unexpected symbol", err)
    assert.is_function((repl.compile("=1 + 1")))
  end)
end)
