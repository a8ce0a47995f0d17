local mg = require "moongraph"
local process = require "moongraph.process"
local cli = require "cli"
local tmp = require "tmp"

-- Is pid still a process of this machine (running or a zombie)? Raises
-- when it cannot tell: no pid, or no /proc to look in.
local function exists(pid)
  assert(math.type(pid) == "integer" and pid > 0, "no pid to look for: " .. tostring(pid))
  local self = assert(io.open("/proc/self/stat"), "/proc is not mounted: cannot tell whether a process exists")
  self:close()
  local f = io.open("/proc/" .. pid .. "/stat")
  if f then f:close() return true end
  return false
end

-- Wait (bounded) until the runtime has reaped every child it started.
local function settle()
  for _ = 1, 500 do
    if process.live() == 0 then return true end
    mg.sleep(0.01)
  end
  return false
end

describe("moongraph.process", function()
  it("reports exit codes", function()
    local r = mg.run(function()
      local out = {}
      for _, code in ipairs { 0, 1, 3, 255 } do
        local p = assert(process.spawn { "sh", "-c", "exit " .. code })
        out[#out + 1] = { p:wait() }
      end
      return out
    end)
    assert.same({ { 0 }, { 1 }, { 3 }, { 255 } }, r)
  end)

  it("reports the signal that ended a child", function()
    local r = mg.run(function()
      local p = assert(process.spawn { "sleep", "30" })
      assert(p:kill("KILL"))
      local code, sig = p:wait()
      local q = assert(process.spawn { "sh", "-c", "kill -USR1 $$" })
      local code2, sig2 = q:wait()
      return { code, sig, code2, sig2 }
    end)
    assert.same({ 137, "KILL", 128 + 10, "USR1" }, r)
  end)

  it("passes arguments as they are, without a shell", function()
    local r = mg.run(function()
      return process.run { "printf", "%s|", "a b", "$HOME", "'q'", "*" }
    end)
    assert.equal("a b|$HOME|'q'|*|", r.stdout)
    assert.equal(0, r.code)
  end)

  it("uses the given environment and working directory", function()
    local dir = tmp.dir("cwd")
    local r = mg.run(function()
      return process.run({ "sh", "-c", 'echo "$FOO $BAR"; pwd' },
        { env = { FOO = "foo", BAR = "bar baz", PATH = os.getenv("PATH") }, cwd = dir })
    end)
    assert.equal("foo bar baz\n" .. dir .. "\n", r.stdout)
  end)

  it("reads lines, bytes and the rest of a stream", function()
    local r = mg.run(function()
      local p = assert(process.spawn { "printf", "one\ntwo\r\nthree" })
      local a = p.stdout:read_line()
      local b = p.stdout:read_line()
      local c = p.stdout:read(2)
      local d = p.stdout:read_all()
      local e = table.pack(p.stdout:read_line())
      p:wait()
      return { a, b, c, d, e.n, e[1] }
    end)
    assert.same({ "one", "two\r", "th", "ree", 1 }, r)
  end)

  it("iterates over lines and reads stderr apart from stdout", function()
    local r = mg.run(function()
      local p = assert(process.spawn { "sh", "-c", "echo a; echo E >&2; echo b; printf c" })
      local lines = {}
      for l in p.stdout:lines() do lines[#lines + 1] = l end
      return { lines, p.stderr:read_all(), p:wait() }
    end)
    assert.same({ { "a", "b", "c" }, "E\n", 0 }, r)
  end)

  it("writes to stdin and ends it", function()
    local r = mg.run(function()
      local p = assert(process.spawn { "sort" })
      assert(p:write("b\n", "c\n"))
      assert(p.stdin:write("a\n"))
      p.stdin:close()
      return p.stdout:read_all()
    end)
    assert.equal("a\nb\nc\n", r)
  end)

  it("moves several MiB both ways through one child without deadlock", function()
    local size = 6 * 1024 * 1024
    local r = mg.run(function()
      local p = assert(process.spawn { "cat" })
      -- cat writes while it reads: this only finishes if our writes yield
      -- under backpressure while another task drains stdout
      local chunk = string.rep("0123456789abcdef", 4096)
      local writer = mg.spawn(function()
        for _ = 1, size // #chunk do assert(p:write(chunk)) end
        p.stdin:close()
      end)
      local got = p.stdout:read_all()
      assert(writer:join())
      return { #got, got:sub(1, 16), got:sub(-16), p:wait() }
    end)
    assert.same({ size, "0123456789abcdef", "0123456789abcdef", 0 }, r)
  end)

  it("collects large stdout and stderr at once", function()
    local r = mg.run(function()
      return process.run { "sh", "-c", "head -c 4194304 /dev/zero; head -c 3145728 /dev/zero >&2; echo end" }
    end)
    assert.equal(4194304 + 4, #r.stdout)
    assert.equal(3145728, #r.stderr)
    assert.equal(0, r.code)
  end)

  it("escalates to SIGKILL when a child ignores SIGTERM", function()
    local r = mg.run(function()
      local p = assert(process.spawn({ "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done" },
        { kill_grace = 0.2 }))
      assert.equal("ready", p:read_line())
      assert(p:terminate())
      return { p:wait() }
    end)
    assert.same({ 137, "KILL" }, r)
  end)

  it("a child that honours SIGTERM ends with it", function()
    local r = mg.run(function()
      local p = assert(process.spawn({ "sleep", "30" }, { kill_grace = 5 }))
      assert(p:terminate())
      return { p:wait() }
    end)
    assert.same({ 143, "TERM" }, r)
  end)

  it("stops a child at its time limit", function()
    local r = mg.run(function()
      local p = assert(process.spawn({ "sh", "-c", "trap '' TERM; sleep 30" }, { timeout = 0.1, kill_grace = 0.1 }))
      local code, sig = p:wait()
      return { code, sig, p:timed_out() }
    end)
    assert.same({ 137, "KILL", true }, r)
  end)

  it("shutdown closes stdin and waits for the child to leave", function()
    local r = mg.run(function()
      local p = assert(process.spawn { "cat" })
      return { p:shutdown(5) }
    end)
    assert.same({ 0 }, r)
  end)

  it("runs many children at once", function()
    local n = 64
    local r = mg.run(function()
      local fns = {}
      for i = 1, n do
        fns[i] = function()
          local p = assert(process.spawn { "sh", "-c", "read x; echo $x-$0", tostring(i) })
          assert(p:write("v\n"))
          local line = p:read_line()
          assert.equal(0, (p:wait()))
          return line
        end
      end
      local out = {}
      for i, res in ipairs(mg.gather(fns)) do
        assert(res.ok, res.err)
        out[i] = res.value
      end
      return out
    end)
    for i = 1, n do assert.equal("v-" .. i, r[i]) end
  end)

  it("times out a read and can read again", function()
    local r = mg.run(function()
      local p = assert(process.spawn { "sh", "-c", "read x; echo got-$x" })
      local a, aerr = p:read_line(0.05)
      assert(p:write("x\n"))
      local b = p:read_line()
      p:wait()
      return { a, aerr, b }
    end)
    assert.same({ nil, "timeout", "got-x" }, r)
  end)

  it("a wait can time out", function()
    local r = mg.run(function()
      local p <close> = assert(process.spawn { "sleep", "30" })
      return { p:wait(0.05) }
    end)
    assert.same({ nil, "timeout" }, r)
  end)

  it("keeps the child when a reading task is cancelled", function()
    local r = mg.run(function()
      local p = assert(process.spawn { "sh", "-c", "read x; echo got-$x" })
      local reader = mg.spawn(function() return p:read_line() end)
      mg.sleep(0)
      assert.is_true(reader:cancel())
      assert(p:write("y\n"))
      local line = p:read_line()
      return { line, p:wait() }
    end)
    assert.same({ "got-y", 0 }, r)
  end)

  it("kills and reaps the child of a cancelled task that holds it in a <close> variable", function()
    local pid
    local ok = mg.run(function()
      local started = mg.queue()
      local t = mg.spawn(function()
        local p <close> = assert(process.spawn({ "sleep", "30" }, { kill_grace = 0.2 }))
        started:put(p:pid())
        p:wait()
      end)
      pid = started:get()
      assert.is_true(exists(pid))
      assert.is_true(t:cancel())
      return settle()
    end)
    assert.is_true(ok)
    assert.is_false(exists(pid))
  end)

  it("kills and reaps a child whose process object was collected", function()
    local pid
    local ok = mg.run(function()
      do
        local p = assert(process.spawn({ "sh", "-c", "trap '' TERM; sleep 30" }, { kill_grace = 0.1 }))
        pid = p:pid()
        assert.is_true(exists(pid))
      end
      collectgarbage()
      collectgarbage()
      return settle()
    end)
    assert.is_true(ok)
    assert.is_false(exists(pid))
  end)

  it("leaves no zombie behind once children exit", function()
    local pids = mg.run(function()
      local out = {}
      for i = 1, 10 do
        local p = assert(process.spawn { "true" })
        out[i] = p:pid()
        p:wait()
      end
      return out
    end)
    assert.equal(10, #pids)
    for _, pid in ipairs(pids) do assert.is_false(exists(pid)) end
  end)

  it("kills the children still running when the runtime exits", function()
    local script = cli.write_temp([[
      local process = require "moongraph.process"
      local p = assert(process.spawn({ "sh", "-c", "trap '' TERM; sleep 30" }, { kill_grace = 0.2 }))
      _G.keep = p
      print(p:pid())
    ]])
    local res = cli.run { "run", script }
    assert.equal(0, res.code, res.err)
    local pid = assert(tonumber(res.out:match("%d+")), res.out)
    assert.is_false(exists(pid))
  end)

  it("reports a program that cannot be run", function()
    local r = mg.run(function()
      local a = { process.spawn { "no-such-program-here" } }
      local b = { process.spawn({ "true" }, { cwd = "/no/such/dir" }) }
      local c = { process.spawn { "/tmp" } }
      return { a, b, c }
    end)
    assert.is_nil(r[1][1])
    assert.matches("cannot run 'no%-such%-program%-here': no such program in PATH", r[1][2])
    assert.is_nil(r[2][1])
    assert.matches("/no/such/dir", r[2][2])
    assert.is_nil(r[3][1])
    assert.matches("permission denied", r[3][2])
  end)

  it("returns a write to a child that closed its stdin as an error", function()
    local r = mg.run(function()
      local p = assert(process.spawn({ "true" }, { stdout = "null" }))
      p:wait()
      return { p:write(string.rep("x", 1 << 20)) }
    end)
    assert.is_nil(r[1])
    assert.matches("broken pipe", r[2])
  end)

  it("refuses a second reader of the same stream", function()
    local ok, err = pcall(mg.run, function()
      local p <close> = assert(process.spawn { "sleep", "30" })
      mg.spawn(function() p:read_line() end)
      mg.sleep(0)
      p:read_line()
    end)
    assert.is_false(ok)
    assert.matches("another task is already reading", err)
  end)

  it("raises on misuse", function()
    assert.has_error(function() process.spawn {} end, "bad argument #1 to 'spawn': empty list (name the program)")
    assert.has_error(function() process.spawn("ls") end,
      "bad argument #1 to 'spawn': list {program, arg, ...} expected, got string")
    assert.has_error(function() process.spawn({ "ls" }, { nope = 1 }) end,
      "bad argument #2 to 'spawn': unknown option 'nope'")
    assert.has_error(function() process.spawn({ "ls" }, { stdout = "file" }) end,
      "bad argument #1 to 'spawn' (stdout must be \"pipe\", \"inherit\" or \"null\")")
    local ok, err = pcall(mg.run, function()
      local p <close> = assert(process.spawn({ "true" }, { stdout = "null" }))
      p.stdout:read_line()
    end)
    assert.is_false(ok)
    assert.matches("stdout was not opened as a pipe", err)
  end)

  it("is mg.process", function()
    assert.equal(process, mg.process)
  end)
end)
