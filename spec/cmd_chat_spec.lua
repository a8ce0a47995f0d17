-- `moongraph chat`, the main job, through the moongraph executable: offline
-- on embedded defaults, across turns of a thread, with failing services on
-- the local test server, and with an LLM streaming through it.
local mg = require "moongraph"
local cjson = require "cjson"
local cli = require "cli"
local tmp = require "tmp"
local testserver = require "testserver"

local SEED = "종이 어떻게 버려? 그리고 수거함도 알려줘"

-- Environment for a run: a private state directory, every service and the
-- LLM unset unless given.
local function env(dir, extra)
  local vars = {
    MOONGRAPH_STATE_DIR = dir,
    MOONGRAPH_LLM_BASE_URL = "", MOONGRAPH_LLM_API_KEY = "", MOONGRAPH_LLM_MODEL = "",
  }
  for _, s in ipairs({ "KAKAO", "KMA", "TAVILY", "IMAGE", "CHARACTER", "BULK_WASTE",
                       "RECYCLABLE_PRICE", "COLLECTION_POINT" }) do
    vars["MOONGRAPH_" .. s .. "_BASE_URL"] = ""
    vars["MOONGRAPH_" .. s .. "_API_KEY"] = ""
  end
  for k, v in pairs(extra or {}) do vars[k] = v end
  local parts = {}
  for k, v in pairs(vars) do parts[#parts + 1] = k .. "=" .. cli.quote(v) end
  table.sort(parts)
  return "env " .. table.concat(parts, " ")
end

local function last_json(out)
  local last
  for line in out:gmatch("[^\n]+") do last = line end
  return cjson.decode(last)
end

local function chat(dir, args, extra)
  local a = { "chat" }
  for _, x in ipairs(args) do a[#a + 1] = x end
  return cli.run(a, { env = env(dir, extra) })
end

describe("moongraph chat", function()
  local dir
  before_each(function() dir = tmp.dir("state") end)
  after_each(function() tmp.remove(dir) end)

  describe("usage", function()
    it("needs a message", function()
      local r = chat(dir, {})
      assert.are.equal(2, r.code)
      assert.matches("chat: missing MESSAGE", r.err)
      assert.matches("usage: chat %[%-%-thread ID%]", r.err)
    end)

    it("rejects unknown options and a second message", function()
      assert.are.equal(2, chat(dir, { "--nope", "x" }).code)
      assert.are.equal(2, chat(dir, { "a", "b" }).code)
      assert.are.equal(2, chat(dir, { "--thread" }).code)
      assert.are.equal(2, chat(dir, { "--thread", "a b", "x" }).code)
    end)

    it("works from any directory: the application is found beside the binary", function()
      local bin = cli.bin:sub(1, 1) == "/" and cli.bin or (os.getenv("PWD") .. "/" .. cli.bin)
      local p = io.popen("cd / && " .. env(dir, { MOONGRAPH_PATH = "" }) .. " " .. cli.quote(bin) ..
        " chat --json '종이 어떻게 버려?' 2>/dev/null; echo \"exit=$?\"")
      local out = p:read("a")
      p:close()
      assert.matches("exit=0", out)
      assert.matches('"intent":"waste"', out, 1, true)
    end)

    it("is an unknown command, with where commands are looked for, when no application has it", function()
      -- a copy of the binary in a directory without scripts/
      local bin = cli.bin:sub(1, 1) == "/" and cli.bin or (os.getenv("PWD") .. "/" .. cli.bin)
      local lone = dir .. "/bin"
      assert(os.execute("mkdir -p " .. cli.quote(lone) .. " && cp " .. cli.quote(bin) .. " " .. cli.quote(lone)))
      local p = io.popen("cd " .. cli.quote(lone) .. " && " .. env(dir, { MOONGRAPH_PATH = "" }) .. " ./" ..
        bin:match("([^/]+)$") .. " chat x 2>&1; echo \"exit=$?\"")
      local out = p:read("a")
      p:close()
      assert.matches("unknown command 'chat' %(application commands are declared in scripts/APP/commands%.lua", out)
      assert.matches("exit=2", out)
    end)

    it("is listed in the help", function()
      local r = cli.run({ "help" })
      assert.matches("chat%s+ask the Eco² chat pipeline", r.out)
    end)
  end)

  describe("offline, on the embedded defaults", function()
    it("answers the seed's multi-intent example and ends stdout with the state as JSON", function()
      local r = chat(dir, { "--location", "서울특별시 강남구", "--json", SEED })
      assert.are.equal(0, r.code, r.err)
      local s = last_json(r.out)
      assert.are.equal("waste", s.intent)
      assert.are.same({ "collection_point" }, s.additional_intents)
      assert.are.same({ "waste_rag", "collection_point", "weather" }, s.nodes_run)
      assert.is_true(s.contexts.waste_rag.ok)
      assert.is_true(s.contexts.collection_point.sample)
      assert.is_true(s.contexts.weather.unavailable)
      assert.are.equal("offline", s.answer_source)
      assert.matches("^%[오프라인 답변%]", s.answer)
      -- the answer streamed to stdout before the JSON line
      local streamed = r.out:sub(1, #r.out - #cjson.encode(s))
      assert.matches("종이류: 물기에 젖지 않게", streamed)
      assert.matches("※ 날씨 정보: 오프라인이라", streamed)
      -- the steps, with the parallel one, on stderr
      assert.matches("step 1%s+intent", r.err)
      assert.matches("step 2%s+3 nodes in parallel: waste_rag ∥ collection_point ∥ weather", r.err)
      assert.matches("∥ collection_point%s+[%d.]+ ms%s+ok, sample data", r.err)
      assert.matches("step 3%s+aggregator", r.err)
      assert.matches("offline: no LLM configured", r.err)
      -- timings per node in the JSON
      local seen = {}
      for _, t in ipairs(s.timings) do seen[t.node] = t.step end
      assert.are.equal(2, seen.waste_rag)
      assert.are.equal(2, seen.weather)
      assert.are.equal(1, seen.intent)
    end)

    it("continues a thread: the seed's three-turn transition example", function()
      local turns = {
        { "냉장고 버리려면 어떻게 해?", "bulk_waste", nil, 0 },
        { "팔 수 있어?", "recyclable_price", "bulk_waste", 0.08 },
        { "근처에 어디서 팔아?", "location", "recyclable_price", 0.1 },
      }
      for i, t in ipairs(turns) do
        local r = chat(dir, { "--thread", "seed-demo", "--json", t[1] })
        assert.are.equal(0, r.code, r.err)
        local s = last_json(r.out)
        assert.are.equal(i, s.turn)
        assert.are.equal(t[2], s.intent)
        assert.are.equal(t[3], s.prev_intent)
        assert.are.equal(t[4], s.transition_boost)
        assert.are.equal(2 * i, s.history_messages)
        assert.are.equal("seed-demo", s.thread_id)
        if i > 1 then assert.matches("previous intent " .. t[3], r.err) end
      end
      -- the thread lives in the file saver's log under the state directory:
      -- a checkpoint record per step of each turn
      local f = assert(io.open(dir .. "/seed-demo/root/checkpoints.log"))
      local n = 0
      for line in f:lines() do
        if line:match('^%d+ {"type":"checkpoint"') then n = n + 1 end
      end
      f:close()
      assert.is_true(n >= 3 * 6, n .. " checkpoints")
    end)

    it("starts a new thread without --thread and says how to continue it", function()
      local r = chat(dir, { "페트병 어떻게 버려?" })
      assert.are.equal(0, r.code, r.err)
      local id = r.err:match("continue with: moongraph chat %-%-thread (%S+)")
      assert.is_string(id)
      local r2 = chat(dir, { "--thread", id, "--json", "근처 수거함은?" })
      assert.are.equal(0, r2.code, r2.err)
      local s = last_json(r2.out)
      assert.are.equal(2, s.turn)
      assert.are.equal("waste", s.prev_intent)
    end)

    it("writes the Chrome trace of the run", function()
      local trace = dir .. "/trace.json"
      local r = chat(dir, { "--location", "서울특별시 강남구", "--trace", trace, SEED })
      assert.are.equal(0, r.code, r.err)
      assert.matches("Chrome trace written to", r.err)
      local f = assert(io.open(trace))
      local doc = cjson.decode(f:read("a"))
      f:close()
      local lanes = {}
      for _, e in ipairs(doc.traceEvents) do
        if e.ph == "X" and e.cat == "task" then lanes[e.name] = e.tid end
      end
      -- the parallel nodes of one step are drawn on lanes of their own
      assert.is_number(lanes.waste_rag)
      assert.is_number(lanes.collection_point)
      assert.is_number(lanes.weather)
      assert.are_not.equal(lanes.waste_rag, lanes.collection_point)
      assert.are_not.equal(lanes.collection_point, lanes.weather)
    end)
  end)

  describe("with services on the test server", function()
    local srv
    setup(function() srv = testserver.start() end)
    teardown(function() srv:stop() end)
    before_each(function() mg.run(function() srv:reset() end) end)

    it("a failing fail_open service leaves the answer whole and named", function()
      mg.run(function() srv:record { path = "/getVilageFcst", status = 500, body = "{}" } end)
      local r = chat(dir, { "--location", "서울특별시 강남구", "--json", SEED },
        { MOONGRAPH_KMA_BASE_URL = srv.url, MOONGRAPH_KMA_API_KEY = "k" })
      assert.are.equal(0, r.code, r.err)
      local s = last_json(r.out)
      assert.matches("^weather: HTTP 500", s.contexts.weather.error)
      assert.are.equal("weather", s.errors[1].node)
      assert.matches("종이류", s.answer)
      -- the answer names the failure; the error is the operator's (the trace)
      assert.matches("※ 날씨 정보: 가져오지 못했습니다", s.answer)
      assert.is_nil(s.answer:find("HTTP 500", 1, true))
      assert.matches("∥ weather%s+[%d.]+ ms%s+failed: weather: HTTP 500", r.err)
    end)

    it("a failing character service ends the run with a clear message", function()
      mg.run(function() srv:record { path = "/v1/characters", status = 503, body = "{}" } end)
      local r = chat(dir, { "--json", "캐릭터 어떻게 얻어?" },
        { MOONGRAPH_CHARACTER_BASE_URL = srv.url })
      assert.are.equal(1, r.code)
      assert.matches("죄송합니다%. 캐릭터 정보 서비스에 문제가 있어 답변을 완성하지 못했어요", r.out)
      assert.matches("the run ended: node 'character' failed: character: HTTP 503", r.err)
      local s = last_json(r.out)
      assert.are.equal("character", s.failed_node)
      assert.matches("HTTP 503", s.error)
      assert.are.equal("character", s.intent)
    end)

    it("streams the LLM's tokens to stdout as they arrive", function()
      local chunks = { "페트병은 ", "라벨을 떼고 ", "찌그러뜨려 ", "배출하세요." }
      mg.run(function() srv:script {
        { content = cjson.encode { intent = "waste", additional_intents = {}, confidence = 0.9 } },
        { chunks = chunks, hold = "answer" },     -- pauses after the first chunk
        { content = cjson.encode { faithfulness = 1, groundedness = 1, context_relevance = 1,
                                   answer_relevance = 1 } },
      } end)
      local cmd = env(dir, { MOONGRAPH_LLM_BASE_URL = srv.url .. "/v1", MOONGRAPH_LLM_API_KEY = "k",
                             MOONGRAPH_LLM_MODEL = "m" })
        .. " timeout 60 " .. cli.bin .. " chat --json " .. cli.quote("페트병 어떻게 버려?")
        .. " 2>" .. cli.quote(dir .. "/err")
      local p = assert(io.popen(cmd, "r"))
      -- the first token is on stdout while the server still holds the rest
      local first = "\n" .. chunks[1]
      assert.are.equal(first, p:read(#first))
      local held = mg.run(function() return srv:requests("/v1/chat/completions") end)
      assert.are.equal(2, #held)       -- intent, then the answer's stream (still open)
      mg.run(function() srv:release("answer") end)
      local rest = p:read("a")
      local ok, _, code = p:close()
      assert.is_true(ok, "exit " .. tostring(code))
      assert.matches("^라벨을 떼고 찌그러뜨려 배출하세요%.", rest)
      local s = last_json(rest)
      assert.are.equal("llm", s.answer_source)
      assert.are.equal("llm", s.intent_source)
      assert.are.equal("llm", s.quality.method)
      local f = assert(io.open(dir .. "/err"))
      assert.matches("LLM configured", f:read("a"))
      f:close()
    end)
  end)

  it("with node_timeouts, a request over its node's deadline fails in time for the node's policy", function()
    local r = cli.run({ "run", "spec/support/chat_node_timeout.lua" }, { env = env(dir) })
    assert.are.equal(0, r.code, r.err)
    local s = last_json(r.out)
    assert.matches("^weather: request failed: timeout %(127%.0%.0%.1:%d+, at the caller's deadline%)$", s.weather_error)
    assert.is_true(s.answered)
    assert.matches("※ 날씨 정보: 가져오지 못했습니다", s.answer)
  end)

  describe("one turn of a thread at a time", function()
    local function read(path)
      local f = io.open(path)
      if not f then return "" end
      local t = f:read("a")
      f:close()
      return t
    end

    it("20 turns of one thread from 2 processes at once: none is lost", function()
      local envs = env(dir)
      local loops = {}
      for _, who in ipairs { "a", "b" } do
        loops[#loops + 1] = string.format(
          "( for i in 1 2 3 4 5 6 7 8 9 10; do %s %s chat --thread shared --json \"%s $i 페트병은?\" >/dev/null 2>>%s || echo $i >>%s; done )",
          envs, cli.quote(cli.bin), who, cli.quote(dir .. "/" .. who .. ".err"), cli.quote(dir .. "/" .. who .. ".failed"))
      end
      assert(os.execute(loops[1] .. " & " .. loops[2] .. " & wait"))
      assert.equal("", read(dir .. "/a.failed") .. read(dir .. "/b.failed"))
      local r = chat(dir, { "--thread", "shared", "--json", "마지막 질문" })
      assert.are.equal(0, r.code, r.err)
      local s = last_json(r.out)
      assert.are.equal(21, s.turn)
      assert.are.equal(42, s.history_messages)
    end)

    it("a turn on a busy thread waits for it, saying so, or is refused with --multitask-strategy reject", function()
      local multitask = require "moongraph.multitask"
      local store = require("moongraph.core").store
      mg.run(function()
        assert(store.mkdir(dir .. "/.locks"))
        -- another process's turn: the lock held here
        local lease = assert(multitask.file(dir .. "/.locks"):acquire("busy"))
        local r = chat(dir, { "--thread", "busy", "--multitask-strategy", "reject", "안녕" })
        assert.are.equal(1, r.code)
        assert.matches("thread busy is busy: another chat turn is running on it %(%-%-multitask%-strategy reject%)", r.err)
        local cmd = string.format("%s %s chat --thread busy --json '안녕' >%s 2>%s; echo $? >%s",
          env(dir), cli.quote(cli.bin), cli.quote(dir .. "/w.out"), cli.quote(dir .. "/w.err"),
          cli.quote(dir .. "/w.code"))
        assert(os.execute("( " .. cmd .. " ) >/dev/null 2>&1 &"))
        for _ = 1, 400 do
          if read(dir .. "/w.err"):find("waiting for it to end", 1, true) then break end
          mg.sleep(0.025)
        end
        assert.matches("thread busy is busy: another chat turn is running on it; waiting for it to end", read(dir .. "/w.err"))
        assert.are.equal("", read(dir .. "/w.code"))
        lease:release()
        for _ = 1, 400 do
          if read(dir .. "/w.code") ~= "" then break end
          mg.sleep(0.025)
        end
        assert.are.equal("0", (read(dir .. "/w.code"):gsub("%s", "")))
        assert.are.equal(1, last_json(read(dir .. "/w.out")).turn)
      end)
    end)

    it("refuses interrupt and rollback, which need the worker", function()
      local r = chat(dir, { "--thread", "t", "--multitask-strategy", "interrupt", "안녕" })
      assert.are.equal(2, r.code)
      assert.matches("interrupt and rollback need `moongraph worker`", r.err)
    end)
  end)
end)
