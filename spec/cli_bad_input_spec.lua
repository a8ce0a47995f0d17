-- Bad input on the command line: each gets a clear message and the right
-- exit status before anything runs, and output the caller did not receive
-- is a failure, never a silent success.
local cjson = require "cjson"
local cli = require "cli"
local tmp = require "tmp"

-- Runs `moongraph ARGS` through sh with stdout redirected as `redirect`
-- says (e.g. ">/dev/full", ">&-"); stderr is captured. -> code, stderr
local function run_redirected(args, redirect, state_dir)
  local parts = { "env", "MOONGRAPH_STATE_DIR=" .. cli.quote(state_dir),
    "MOONGRAPH_LLM_BASE_URL=", "MOONGRAPH_LLM_API_KEY=", cli.quote(cli.bin) }
  for _, a in ipairs(args) do parts[#parts + 1] = cli.quote(a) end
  local errf = tmp.path("stderr")
  local _, _, code = os.execute(table.concat(parts, " ") .. " " .. redirect .. " 2>" .. errf)
  local f = assert(io.open(errf, "r"))
  local err = f:read("a")
  f:close()
  tmp.remove(errf)
  return code, err
end

local function entries(dir)
  local p = assert(io.popen("ls -A " .. cli.quote(dir)))
  local s = p:read("a")
  p:close()
  return s
end

describe("command-line bad input", function()
  local dir
  before_each(function() dir = tmp.dir("state") end)
  after_each(function() tmp.remove(dir) end)

  local function chat(args)
    local a = { "chat" }
    for _, x in ipairs(args) do a[#a + 1] = x end
    return cli.run(a, { env = "env MOONGRAPH_STATE_DIR=" .. cli.quote(dir) ..
      " MOONGRAPH_LLM_BASE_URL= MOONGRAPH_LLM_API_KEY=" })
  end

  describe("chat", function()
    it("refuses a message that is not UTF-8, before running anything", function()
      local r = chat { "--json", "\xff\xfe종이 버려" }
      assert.are.equal(2, r.code)
      assert.matches("chat: MESSAGE is not valid UTF%-8 %(bad byte at position 1%)", r.err)
      assert.are.equal("", r.out)
      assert.are.equal("", entries(dir))
    end)

    it("refuses a --location that is not UTF-8", function()
      local r = chat { "--location", "서울\xc0", "종이 버려" }
      assert.are.equal(2, r.code)
      assert.matches("chat: %-%-location is not valid UTF%-8", r.err)
    end)

    it("checks the trace path before the run", function()
      local r = chat { "--trace", "/nonexistent/dir/t.json", "종이 버려" }
      assert.are.equal(2, r.code)
      assert.matches("chat: cannot write the trace file: /nonexistent/dir/t.json: No such file or directory", r.err)
      -- nothing ran: no step lines, no checkpoint
      assert.is_nil(r.err:find("step 1", 1, true))
      assert.are.equal("", entries(dir))
    end)

    it("fails when the trace cannot be written at the end, saying the turn itself finished", function()
      local r = chat { "--trace", "/dev/full", "종이 버려" }
      assert.are.equal(1, r.code)
      assert.matches("moongraph chat: trace: cannot write /dev/full: No space left on device", r.err)
      assert.is_nil(r.err:find("Chrome trace written", 1, true))
      assert.is_nil(r.out:find("죄송합니다", 1, true))
    end)

    it("validates --thread with the rule of job ids: 200 characters at most", function()
      local r = chat { "--thread", string.rep("a", 5000), "종이 버려" }
      assert.are.equal(2, r.code)
      assert.matches("chat: %-%-thread must be 1..200 letters, digits or %- _ %. : @", r.err)
      assert.are.equal("", entries(dir))
      local ok = chat { "--thread", string.rep("a", 200), "--json", "종이 버려" }
      assert.are.equal(0, ok.code, ok.err)
    end)

    it("exits 1 when stdout is full: the answer did not reach the caller", function()
      local code, err = run_redirected({ "chat", "종이 버려" }, ">/dev/full", dir)
      assert.are.equal(1, code)
      assert.matches("cannot write the answer to standard output: No space left on device", err)
    end)

    it("exits 1 when stdout is closed", function()
      local code, err = run_redirected({ "chat", "종이 버려" }, ">&-", dir)
      assert.are.equal(1, code)
      assert.matches("cannot write the answer to standard output: Bad file descriptor", err)
    end)
  end)

  describe("route", function()
    it("treats an unknown --prev-intent as a usage error listing the intents", function()
      local r = cli.run { "route", "--prev-intent", "nonexistent_intent", "팔 수 있어?" }
      assert.are.equal(2, r.code)
      assert.matches("route: unknown %-%-prev%-intent 'nonexistent_intent' %(known: waste, character, location, " ..
        "bulk_waste, recyclable_price, collection_point, web_search, image_generation, general%)", r.err)
      assert.is_nil(r.err:find("traceback", 1, true))
    end)

    it("refuses a message that is not UTF-8", function()
      local r = cli.run { "route", "--json", "팔\xff" }
      assert.are.equal(2, r.code)
      assert.matches("route: MESSAGE is not valid UTF%-8", r.err)
    end)
  end)

  describe("serve", function()
    it("refuses a --watchdog or --trusted-proxy it cannot use, before listening", function()
      for _, case in ipairs {
        { { "--watchdog", "nan" }, "serve: %-%-watchdog: number expected, got 'nan'" },
        { { "--watchdog", "-1" }, "serve: %-%-watchdog must be 0 to 1e9 seconds" },
        { { "--watchdog", "1e999" }, "serve: %-%-watchdog must be 0 to 1e9 seconds" },
        { { "--trusted-proxy", "10.0.0.0/99" }, "the prefix is longer than the address" },
        { { "--trusted-proxy", "nonsense" }, "'nonsense' is not an IP address or CIDR block" },
      } do
        local args = { "serve", "--port", "0" }
        for _, a in ipairs(case[1]) do args[#args + 1] = a end
        local r = cli.run(args)
        assert.are.equal(2, r.code, table.concat(case[1], " "))
        assert.matches(case[2], r.err)
        assert.is_nil(r.err:find("listening", 1, true))
      end
    end)
  end)

  describe("any command", function()
    it("exits 1 when what it printed could not be written", function()
      local code, err = run_redirected({ "-e", "print('hello')" }, ">/dev/full", dir)
      assert.are.equal(1, code)
      assert.matches("moongraph: error writing to standard output", err)
    end)

    it("never writes into a file it opened when stdout was closed", function()
      local path = dir .. "/out.txt"
      local code = run_redirected({ "-e", ("local f = assert(io.open(%q, 'w')); print('to stdout'); " ..
        "f:write('to file'); f:close()"):format(path) }, ">&-", dir)
      assert.are.equal(1, code)
      local f = assert(io.open(path, "r"))
      assert.are.equal("to file", f:read("a"))
      f:close()
    end)
  end)
end)

describe("JSON output", function()
  it("is valid UTF-8 even when a value holds invalid bytes", function()
    local json = require "moongraph.json"
    local s = json.encode_output { ["k\xff"] = "a\xffb\xed\xa0\x80c", list = json.array { "\xc3" } }
    assert.is_truthy(utf8.len(s))
    local back = cjson.decode(s)
    assert.are.equal("a\u{FFFD}b\u{FFFD}\u{FFFD}\u{FFFD}c", back["k\u{FFFD}"])
    assert.are.same({ "\u{FFFD}" }, back.list)
  end)
end)
