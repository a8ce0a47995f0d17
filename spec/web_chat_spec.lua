-- The web chat page (web/) that `moongraph serve` answers at /, driven in a
-- real headless Chromium (spec/support/browser.lua, the DevTools Protocol):
-- the seed's message on the Eco² pipeline with its parallel nodes and
-- streamed answer, the conversation list, a stream cut mid-answer and
-- resumed without a token lost or doubled, errors, and API keys.
--
-- The screenshot in docs/web-chat.png comes from this spec:
--   MOONGRAPH_WEB_SCREENSHOT=docs/web-chat.png tools/run-specs spec/web_chat_spec.lua
local cjson = require "cjson"
local socket = require "socket"
local chatserve = require "chatserve"
local browser = require "browser"
local cli = require "cli"
local tmp = require "tmp"

local MESSAGE = "종이 어떻게 버려? 그리고 수거함도 알려줘"
local LOCATION = "서울특별시 강남구"

local function js(v) return cjson.encode(v) end

-- The page's record of a job's stream (web/app.js: window.moongraphChat.runs)
local function record(b, job)
  return b:eval("moongraphChat.runs[" .. js(job) .. "]")
end

local function only_job(b)
  return b:wait_for("(() => { const k = Object.keys(moongraphChat.runs); return k.length === 1 && k[0]; })()",
    10, "the page's job")
end

-- The cards of the last turn, in the page's order: {node, step, done, failed, duration_ms, text}
local function cards(b)
  return b:eval([[
    [...document.querySelectorAll('.turn:last-of-type .node')].map((c) => ({
      node: c.dataset.node, step: c.closest('.step').dataset.step,
      done: c.classList.contains('done'), failed: c.classList.contains('failed'),
      running: c.classList.contains('running'),
      duration_ms: c.dataset.durationMs ? Number(c.dataset.durationMs) : null,
      text: c.textContent }))]])
end

local function answer_text(b)
  return b:eval("document.querySelector('.turn:last-of-type .bubble.assistant').textContent")
end

-- The answer the server stored for a job, once it is there.
local function stored_answer(s, conversation, job)
  return chatserve.wait_until(function()
    local r = s:curl{ "/chat/conversations/" .. conversation }
    assert.equal(200, r.status)
    for _, m in ipairs(r.json.messages) do
      if m.role == "assistant" and m.job_id == job then return m end
    end
  end, 20, "the stored answer")
end

local function png_size(path)
  local f = assert(io.open(path, "rb"))
  local head = f:read(24)
  f:close()
  assert.equal("\137PNG\r\n\26\n", head:sub(1, 8))
  return string.unpack(">I4", head, 17), string.unpack(">I4", head, 21)
end

-- A relay (spec/support/tcp_relay.lua) in front of a server, to cut the
-- page's connections for real (DevTools' offline emulation fails new
-- requests only: a stream already open goes on).
local function start_relay(target_port)
  local fh = assert(io.popen("sh -c " .. cli.quote("echo $$; exec lua5.4 spec/support/tcp_relay.lua " .. target_port) ..
    " 2>/dev/null", "r"))
  local pid = tonumber(fh:read("l"))
  local port, control_port = (fh:read("l") or ""):match("^relay (%d+) (%d+)$")
  assert(port, "the relay did not start")
  local control = assert(socket.connect("127.0.0.1", tonumber(control_port)))
  control:settimeout(10)
  local relay = { url = "http://127.0.0.1:" .. port, pid = pid }
  function relay.command(line)
    assert(control:send(line .. "\n"))
    return assert(control:receive("*l"))
  end
  function relay.stop()
    control:close()
    os.execute("kill " .. pid .. " 2>/dev/null")
    fh:close()
  end
  return relay
end

describe("the web chat page", function()
  local b

  setup(function()
    b = browser.start { width = 1280, height = 800 }
  end)

  teardown(function()
    if b then b:stop() end
  end)

  describe("on the Eco² pipeline", function()
    local s

    setup(function()
      s = chatserve.start { args = { "--rate-limit", "0" } }
    end)

    teardown(function()
      if s then s:stop() end
    end)

    it("is served at / by default, with its script and style", function()
      local home = s:curl { "/" }
      assert.equal(200, home.status)
      assert.equal("text/html; charset=utf-8", home.headers["content-type"])
      assert.truthy(home.body:find('<script src="app.js">', 1, true))
      assert.equal(200, s:curl { "/app.js" }.status)
      assert.equal(200, s:curl { "/style.css" }.status)
    end)

    it("is served at / by an installed copy (make install-app) from any directory", function()
      local prefix = tmp.dir("webprefix", "file")
      assert.is_true(os.execute(("make -s -o %s install-app BIN=%s PREFIX=%s >/dev/null"):format(
        cli.quote(cli.bin), cli.quote(cli.bin), cli.quote(prefix))))
      local fh = assert(io.popen("sh -c " .. cli.quote("echo $$; cd / && exec env -u MOONGRAPH_API_KEYS " ..
        cli.quote(prefix .. "/bin/moongraph") .. " serve --port 0 --data " .. cli.quote(prefix .. "/state") ..
        "") .. " 2>/dev/null", "r"))
      local pid = fh:read("l")
      local url = (fh:read("l") or ""):match("^listening on (%S+)$")
      local ok, err = pcall(function()
        assert.truthy(url, "the installed serve did not start")
        local p = io.popen("env -u LD_PRELOAD curl -s --max-time 10 " .. cli.quote(url .. "/"))
        local body = p:read("a")
        p:close()
        local f = assert(io.open("web/index.html", "rb"))
        assert.equal(f:read("a"), body)
        f:close()
      end)
      os.execute("kill " .. pid)
      fh:close()
      assert(ok, err)
    end)

    it("answers the seed's message: the three parallel nodes side by side with their durations, the answer streamed in",
      function()
        b:open(s.url .. "/")
        assert.equal("Eco² 채팅 · moongraph", b:eval("document.title"))
        b:wait_for("!document.getElementById('conversations-empty').hidden", 10, "the empty conversation list")

        b:type("#location", LOCATION)
        b:type("#message", MESSAGE)
        b:press_enter()
        local job = only_job(b)
        b:wait_for("document.querySelector('.turn').dataset.status === 'done'", 30, "the run to end")

        local rec = record(b, job)
        local stored = stored_answer(s, rec.conversation_id, job)
        assert.equal("done", stored.status)
        assert.truthy(stored.content:find("종이류", 1, true))
        assert.truthy(stored.content:find(LOCATION, 1, true))
        -- what the tokens built, and what the page shows, is the stored answer
        assert.equal(stored.content, rec.tokens)
        assert.equal(stored.content, answer_text(b))
        assert.equal(MESSAGE .. "위치: " .. LOCATION,
          b:eval("document.querySelector('.turn .bubble.user').textContent"))

        -- one card per node the server ran, each done with the server's duration
        local log = s:stream(job)
        assert.is_true(log.ended)
        local ends = {}
        for _, e in ipairs(log.events) do
          if e.event == "node_end" then ends[#ends + 1] = e.json end
        end
        local shown = cards(b)
        assert.equal(#ends, #shown)
        local by_node = {}
        for _, c in ipairs(shown) do
          assert.is_true(c.done, c.node)
          assert.is_false(c.running, c.node)
          by_node[c.node] = c
        end
        for _, e in ipairs(ends) do
          local c = by_node[e.node]
          assert.truthy(c, e.node)
          assert.near(e.duration_ms, c.duration_ms, 1e-9)
          assert.matches("ms", c.text)
        end
        -- the routed nodes ran in one step: one row, side by side
        local parallel = {}
        for _, c in ipairs(shown) do
          if c.step == by_node.waste_rag.step then parallel[#parallel + 1] = c.node end
        end
        table.sort(parallel)
        assert.same({ "collection_point", "waste_rag", "weather" }, parallel)
        local widths = b:eval([[(() => {
          const row = document.querySelector('.node[data-node="waste_rag"]').parentElement;
          const tops = [...row.children].map((c) => Math.round(c.getBoundingClientRect().top));
          return { same_line: tops.every((t) => t === tops[0]), n: tops.length };
        })()]])
        assert.same({ same_line = true, n = 3 }, widths)
        -- the ids the page applied: every event of the stream, once, in order
        local want = {}
        for i, e in ipairs(log.events) do want[i] = e.id end
        assert.same(want, rec.ids)
        assert.equal(0, rec.duplicates)

        -- the Korean text is drawn with a CJK font (not as boxes)
        local families = {}
        for _, f in ipairs(b:fonts(".turn:last-of-type .bubble.assistant")) do
          families[f.familyName] = (families[f.familyName] or 0) + f.glyphCount
        end
        assert.truthy(families["Noto Sans CJK KR"], cjson.encode(families))
        assert.is_true(families["Noto Sans CJK KR"] > 100)

        local shot = tmp.path("web-chat.png", "webchat")
        b:screenshot(shot)
        local w, h = png_size(shot)
        assert.same({ 1280, 800 }, { w, h })
        local keep = os.getenv("MOONGRAPH_WEB_SCREENSHOT")
        if keep and keep ~= "" then
          assert(os.execute("cp " .. cli.quote(shot) .. " " .. cli.quote(keep)))
        end
      end)

    it("lists the conversation, opens a new one, and loads the first back from the server", function()
      local conversation = b:wait_for(
        "document.querySelectorAll('#conversations li').length === 1 && document.querySelector('#conversations li').dataset.id",
        10, "the conversation in the list")
      assert.equal(MESSAGE, b:eval("document.querySelector('#conversations li .title').textContent"))
      local c = s:curl { "/chat/conversations/" .. conversation }
      local stored = c.json.messages[2].content

      b:click("#new-conversation")
      assert.equal(0, b:eval("document.querySelectorAll('#messages .turn').length"))
      assert.is_false(b:eval("document.getElementById('welcome').hidden"))

      b:click("#conversations li button.open")
      b:wait_for("document.querySelectorAll('#messages .turn').length === 1", 10, "the conversation's messages")
      assert.equal(MESSAGE .. "위치: " .. LOCATION, b:eval("document.querySelector('.turn .bubble.user').textContent"))
      assert.equal(stored, answer_text(b))
      assert.is_true(b:eval("document.querySelector('#conversations li').classList.contains('active')"))

      -- a follow-up goes into the same conversation
      b:type("#message", "페트병은?")
      b:press_enter()
      b:wait_for("document.querySelectorAll('#messages .turn').length === 2 && " ..
        "document.querySelector('.turn:last-of-type').dataset.status === 'done'", 30, "the follow-up's answer")
      c = s:curl { "/chat/conversations/" .. conversation }
      assert.equal(4, #c.json.messages)
      assert.equal("페트병은?", c.json.messages[3].content)
      assert.equal(c.json.messages[4].content, answer_text(b))
    end)
  end)

  describe("with a stream cut mid-answer", function()
    local s, relay

    setup(function()
      s = chatserve.start { args = { "--rate-limit", "0", "--script", "gate=spec/fixtures/chat_gate.lua" } }
      relay = start_relay(s.port)
    end)

    teardown(function()
      if relay then relay.stop() end
      if s then s:stop() end
    end)

    it("reconnects with Last-Event-ID and shows the stored answer exactly: no token lost or doubled", function()
      b:open(relay.url .. "/")
      b:type("#message", "끊겨도 이어서 받아줘")
      b:press_enter()
      local job = only_job(b)
      -- the fixture's answer node stops after its 5th token until the gate opens
      b:wait_for("moongraphChat.runs[" .. js(job) .. "].tokens === 't1 t2 t3 t4 t5 '", 10, "five tokens")
      assert.equal("t1 t2 t3 t4 t5 ", answer_text(b))

      local cut = relay.command("cut")
      assert.is_true(tonumber(cut:match("^cut (%d+)$")) >= 1, cut)
      b:wait_for("moongraphChat.runs[" .. js(job) .. "].drops >= 1", 10, "the page to see the drop")
      assert.equal("reconnecting", b:eval("document.querySelector('.turn').dataset.connection"))
      assert.matches("다시 연결하는 중", b:eval("document.querySelector('.turn .run-status').textContent"))

      -- the rest of the answer is made while the page is away
      s:open_gate()
      local rec = record(b, job)
      local stored = stored_answer(s, rec.conversation_id, job)
      assert.equal("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 ", stored.content)
      assert.equal("t1 t2 t3 t4 t5 ", record(b, job).tokens)

      assert.equal("up", relay.command("up"))
      b:wait_for("document.querySelector('.turn').dataset.status === 'done'", 30, "the run to end after the reconnect")
      rec = record(b, job)
      assert.equal(stored.content, rec.tokens)
      assert.equal(stored.content, answer_text(b))
      assert.equal("resumed", b:eval("document.querySelector('.turn').dataset.connection"))

      -- every event of the job, once and in order, across both connections
      local log = s:stream(job)
      local want = {}
      for i, e in ipairs(log.events) do want[i] = e.id end
      assert.same(want, rec.ids)
      assert.equal(0, rec.duplicates)
      local tokens = 0
      for _, e in ipairs(log.events) do if e.event == "token" then tokens = tokens + 1 end end
      assert.equal(12, tokens)
      assert.is_true(rec.drops >= 1)
      assert.matches("재연결", b:eval("document.querySelector('.turn .run-status').textContent"))
    end)

    it("shows a failed node and the job the run's error is logged under", function()
      b:open(s.url .. "/")
      s:open_gate()
      b:type("#message", "fail")
      b:press_enter()
      b:wait_for("document.querySelector('.turn') && document.querySelector('.turn').dataset.status", 20,
        "the run to end")
      local bubble = b:eval([[(() => { const a = document.querySelector('.turn .bubble.assistant');
        return { failed: a.classList.contains('failed'), text: a.textContent }; })()]])
      assert.is_true(bubble.failed)
      -- the failed node and the job, never the server's error itself
      assert.matches("node 'b' failed %(job j%-", bubble.text)
      assert.is_nil(bubble.text:find("could not answer", 1, true))
      local failed = {}
      for _, c in ipairs(cards(b)) do if c.failed then failed[#failed + 1] = c.node end end
      assert.same({ "b" }, failed)
    end)
  end)

  describe("across a server restart mid-answer", function()
    local GATE = { "--rate-limit", "0", "--script", "gate=spec/fixtures/chat_gate.lua" }
    local s1, s2, relay

    teardown(function()
      if relay then relay.stop() end
      if s2 then s2:stop() end
    end)

    it("follows the job into the new process and shows the answer it finished, once", function()
      local dir = tmp.dir("webrestart", "file")
      s1 = chatserve.start { args = GATE, dir = dir }
      relay = start_relay(s1.port)
      b:open(relay.url .. "/")
      b:type("#message", "재시작해도 이어서")
      b:press_enter()
      local job = only_job(b)
      b:wait_for("moongraphChat.runs[" .. js(job) .. "].tokens === 't1 t2 t3 t4 t5 '", 10, "five tokens")

      s1:stop("KILL")
      b:wait_for("moongraphChat.runs[" .. js(job) .. "].drops >= 1", 10, "the page to see the drop")
      s2 = chatserve.start { args = GATE, dir = dir }
      assert.equal("target " .. s2.port, relay.command("target " .. s2.port))
      s2:open_gate()
      b:wait_for("document.querySelector('.turn').dataset.status === 'done'", 30, "the run to end in the new process")

      local rec = record(b, job)
      local stored = stored_answer(s2, rec.conversation_id, job)
      assert.equal("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 ", stored.content)
      assert.equal(stored.content, rec.tokens)
      assert.equal(stored.content, answer_text(b))
      assert.equal(2, rec.attempt)
      assert.equal(0, rec.duplicates)
      local log = s2:stream(job)
      local want = {}
      for i, e in ipairs(log.events) do want[i] = e.id end
      assert.same(want, rec.ids)
      -- the answer node of the first process shows it was stopped; the second one's is done
      local answer_cards = {}
      for _, c in ipairs(cards(b)) do
        if c.node == "answer" then answer_cards[#answer_cards + 1] = { c.done, c.running, c.text:match("중단됨") ~= nil } end
      end
      assert.same({ { false, false, true }, { true, false, false } }, answer_cards)
    end)
  end)

  describe("with API keys", function()
    local s
    local KEY = "k-web-alice-123"

    setup(function()
      s = chatserve.start { args = { "--rate-limit", "0", "--script", "gate=spec/fixtures/chat_gate.lua" },
                            env = { MOONGRAPH_API_KEYS = KEY .. "=alice" } }
      s:open_gate()
    end)

    teardown(function()
      if s then s:stop() end
    end)

    it("asks for a key, keeps it in localStorage and streams with it", function()
      b:open(s.url .. "/")
      b:eval("localStorage.clear()")
      b:open(s.url .. "/")
      local banner = b:wait_for("!document.getElementById('banner').hidden && document.getElementById('banner').textContent",
        10, "the missing key's banner")
      assert.matches("API 키", banner)

      b:eval("document.getElementById('settings').open = true")
      b:type("#api-key", KEY)
      b:eval("document.getElementById('api-key').dispatchEvent(new Event('change'))")
      b:wait_for("document.getElementById('banner').hidden", 10, "the list with the key")
      assert.equal(KEY, b:eval("localStorage.getItem('moongraph.apiKey')"))

      b:type("#message", "키로 보내기")
      b:press_enter()
      local job = only_job(b)
      b:wait_for("document.querySelector('.turn').dataset.status === 'done'", 20, "the answer")
      local rec = record(b, job)
      assert.equal("t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 ", rec.tokens)
      local c = s:curl { "/chat/conversations/" .. rec.conversation_id, "-H", "Authorization: Bearer " .. KEY }
      assert.equal(200, c.status)
      assert.equal(rec.tokens, c.json.messages[2].content)
      b:eval("localStorage.clear()")
    end)
  end)
end)
