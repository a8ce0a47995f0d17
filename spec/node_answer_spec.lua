local mg = require "moongraph"
local llm = require "moongraph.llm"
local cjson = require "cjson"
local testserver = require "testserver"
local answer = require "nodes.answer"
local feedback = require "nodes.feedback"
local data = require "nodes.lib.data"

-- The state after the aggregator for "종이 어떻게 버려? 그리고 수거함도 알려줘"
-- offline: RAG found paper, the bins come from the sample, weather is unavailable.
local function seed_state()
  return {
    message = "종이 어떻게 버려? 그리고 수거함도 알려줘",
    turn = 1,
    nodes_run = { "waste_rag", "collection_point", "weather" },
    contexts = {
      waste_rag = { ok = true, source = "local", sample = false,
        text = "종이류: 물기에 젖지 않게 반듯하게 펴서 차곡차곡 쌓은 뒤 끈으로 묶어 종이류로 배출합니다." },
      collection_point = { ok = true, source = "sample", sample = true,
        text = "서울특별시 강남구 근처 수거함 (샘플 데이터 — 실제 설치 위치가 아닙니다):\n1. [의류수거함] 삼성동 YY공원 입구 의류수거함 (샘플)" },
      weather = { ok = false, unavailable = true, source = "kma",
        text = "날씨 정보: 오프라인이라 날씨를 제공할 수 없습니다 (기상청 API 키 MOONGRAPH_KMA_API_KEY가 설정되지 않았습니다)." },
    },
    aggregate = {
      collected = { "waste_rag", "collection_point" }, samples = { "collection_point" },
      missing = { { node = "weather", status = "unavailable", reason = "x" } },
      next = "answer", primary = "waste_rag",
    },
    messages = { { role = "user", content = "종이 어떻게 버려? 그리고 수거함도 알려줘", turn = 1 } },
  }
end

-- a ctx that collects streamed tokens; extra goes into its config (llm)
local function token_ctx(extra)
  local tokens = {}
  local ctx = { stream_token = function(t) tokens[#tokens + 1] = t end, config = {} }
  for k, v in pairs(extra or {}) do ctx.config[k] = v end
  return ctx, tokens
end

describe("answer node", function()
  describe("offline", function()
    it("builds an extractive answer from the contexts, labelled as offline", function()
      local ctx, tokens = token_ctx()
      local up = answer.run(seed_state(), ctx)
      assert.are.equal("offline", up.answer_source)
      assert.matches("^%[오프라인 답변%]", up.answer)
      assert.matches("■ 분리배출 방법\n종이류: 물기에 젖지 않게", up.answer)
      assert.matches("■ 수거함 위치 %(샘플 데이터%)", up.answer)
      -- streamed piece by piece, and the pieces are the answer
      assert.is_true(#tokens > 3)
      assert.are.equal(up.answer, table.concat(tokens))
      -- the assistant message joins the history
      assert.are.same({ role = "assistant", content = up.answer, turn = 1 }, up.messages)
    end)

    it("says what could not be fetched and which contexts are samples", function()
      local up = answer.run(seed_state(), token_ctx())
      assert.matches("※ 날씨 정보: 오프라인이라 날씨를 제공할 수 없습니다", up.answer)
      assert.matches("※ 샘플 데이터: 수거함 위치는 내장된 예시 데이터로, 실제 정보가 아닙니다.", up.answer)
    end)

    it("names a failed node, never its error", function()
      local s = seed_state()
      s.contexts.collection_point = { ok = false, error = "collection_point: HTTP 500: boom" }
      s.aggregate.missing[#s.aggregate.missing + 1] =
        { node = "collection_point", status = "failed", reason = "collection_point: HTTP 500: boom" }
      local up = answer.run(s, token_ctx())
      assert.matches("※ 수거함 위치: 가져오지 못했습니다", up.answer)
      assert.is_nil(up.answer:find("boom", 1, true))
      assert.not_matches("■ 수거함 위치", up.answer)
    end)

    it("answers with clarify's request when the chain ended there", function()
      local s = seed_state()
      s.contexts = { clarify = { ok = true, text = "다시 말씀해 주시겠어요?" } }
      s.nodes_run = { "clarify" }
      s.aggregate.missing = {}
      local up = answer.run(s, token_ctx())
      assert.are.equal("clarify", up.answer_source)
      assert.are.equal("다시 말씀해 주시겠어요?", up.answer)
    end)
  end)

  describe("prompt", function()
    it("parses the in-context examples of prompts/answer_examples.txt", function()
      local ex = answer.parse_examples(assert(require("moongraph.prompt").load("answer_examples.txt")))
      assert.is_true(#ex >= 2)
      for _, e in ipairs(ex) do
        assert.is_string(e.question)
        assert.is_string(e.contexts)
        assert.is_string(e.answer)
      end
      assert.is_string(ex[2].missing)
    end)

    it("sends the system prompt, the examples, earlier turns and the question with its contexts", function()
      local s = seed_state()
      table.insert(s.messages, 1, { role = "user", content = "안녕" })
      table.insert(s.messages, 2, { role = "assistant", content = "안녕하세요" })
      local ex = { { question = "Q", contexts = "C", answer = "A" } }
      local msgs = answer.messages(s, "SYSTEM {{summary}}", ex)
      assert.are.equal("system", msgs[1].role)
      assert.are.equal("SYSTEM ", msgs[1].content)
      assert.are.equal("### 질문\nQ\n\n### 컨텍스트\nC", msgs[2].content)
      assert.are.same({ role = "assistant", content = "A" }, msgs[3])
      assert.are.same({ role = "user", content = "안녕" }, msgs[4])
      assert.are.same({ role = "assistant", content = "안녕하세요" }, msgs[5])
      local last = msgs[#msgs].content
      assert.are.equal(6, #msgs)
      assert.matches("^### 질문\n종이 어떻게 버려%?", last)
      assert.matches("%[분리배출 방법%]\n종이류", last)
      assert.matches("%[수거함 위치 %(샘플 데이터%)%]", last)
      assert.matches("### 가져오지 못한 정보\n%- 날씨 정보: 오프라인이라", last)
    end)
  end)

  describe("with an LLM", function()
    local srv
    setup(function() srv = testserver.start() end)
    teardown(function() srv:stop() end)
    before_each(function() mg.run(function() srv:reset() end) end)

    local function client()
      return assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m",
                              max_retries = 0, timeout = 5 })
    end

    it("streams the LLM's tokens through ctx.stream_token, then the notices", function()
      local chunks = { "종이류는 ", "물기를 빼고 ", "펴서 묶어 배출하세요." }
      mg.run(function() srv:script { chunks = chunks } end)
      local ctx, tokens = token_ctx { llm = client() }
      local up = mg.run(function() return answer.run(seed_state(), ctx) end)
      assert.are.equal("llm", up.answer_source)
      assert.are.same(chunks, { tokens[1], tokens[2], tokens[3] })
      assert.matches("^종이류는 물기를 빼고 펴서 묶어 배출하세요.\n\n※ 날씨 정보", up.answer)
      assert.are.equal(up.answer, table.concat(tokens))
      local req = mg.run(function() return srv:requests("/v1/chat/completions") end)[1]
      local body = cjson.decode(req.body)
      assert.is_true(body.stream)
      assert.matches("이코", body.messages[1].content)
      assert.matches("%[분리배출 방법%]", body.messages[#body.messages].content)
    end)

    it("falls back to the extractive answer, saying so, when the LLM fails first", function()
      mg.run(function() srv:script { status = 500, body = "{\"error\":\"down\"}" } end)
      local ctx, tokens = token_ctx { llm = client() }
      local up = mg.run(function() return answer.run(seed_state(), ctx) end)
      assert.are.equal("offline", up.answer_source)
      assert.matches("^%[오프라인 답변%] LLM 호출에 실패해", up.answer)
      assert.matches("■ 분리배출 방법", up.answer)
      assert.are.equal(up.answer, table.concat(tokens))
    end)

    it("keeps what streamed and says it was cut off when the stream breaks", function()
      mg.run(function() srv:script { chunks = { "종이류는 ", "물기를" }, fault = "truncate" } end)
      local ctx = token_ctx { llm = client() }
      local up = mg.run(function() return answer.run(seed_state(), ctx) end)
      assert.are.equal("llm", up.answer_source)
      assert.matches("^종이류는 ", up.answer)
      assert.matches("%(응답 생성이 중단되었습니다%)", up.answer)
      -- why is the operator's: in the state, not in the answer
      assert.is_string(up.answer_error)
      assert.is_nil(up.answer:find(up.answer_error, 1, true))
    end)
  end)
end)

describe("feedback node", function()
  local s = seed_state()
  local grounded = answer.run(seed_state(), token_ctx()).answer

  it("scores an answer grounded in the contexts higher than one that is not", function()
    local g = feedback.heuristic(s.message, feedback.grounding(s), grounded)
    local invented = "플라스틱은 매주 화요일에 녹색 봉투에 담아 아파트 관리실에 맡기면 됩니다. "
      .. "가까운 수거함은 한강공원 입구에 있고 오늘은 맑습니다."
    local u = feedback.heuristic(s.message, feedback.grounding(s), invented)
    assert.is_true(#feedback.dimensions >= 4)
    for _, d in ipairs(feedback.dimensions) do
      if d ~= "context_relevance" then
        assert.is_true(g[d] > u[d], d .. ": " .. tostring(g[d]) .. " vs " .. tostring(u[d]))
      end
    end
    assert.is_number(g.context_relevance)
    assert.are.equal(g.context_relevance, u.context_relevance)  -- same contexts
    assert.is_true(g.overall > u.overall)
    assert.is_true(g.faithfulness >= 0.9)
    assert.is_true(u.faithfulness <= 0.2)
    assert.are.equal("heuristic", g.method)
  end)

  it("gives partial credit to a half-grounded answer", function()
    local half = "종이류는 물기에 젖지 않게 반듯하게 펴서 묶어 배출합니다. "
      .. "그리고 폐지는 킬로그램당 오백 원에 팔 수 있습니다."
    local h = feedback.heuristic(s.message, feedback.grounding(s), half)
    assert.are.equal(0.5, h.faithfulness)
    assert.is_true(h.groundedness > 0.3 and h.groundedness < 0.9)
  end)

  it("ignores headings, labels and notices as claims", function()
    assert.are.same({ "종이류는 펴서 묶습니다." },
      feedback.claims("[오프라인 답변] 라벨\n\n■ 분리배출 방법\n종이류는 펴서 묶습니다.\n\n※ 날씨: 없음"))
  end)

  it("scores no relevance for a question without content words", function()
    local q = feedback.heuristic("안녕?", "일반 대화 안내", "안녕하세요, 무엇을 도와드릴까요?")
    assert.is_number(q.overall)
  end)

  it("writes quality from the state", function()
    local st = seed_state()
    st.answer = grounded
    local q = feedback.run(st, {}).quality
    assert.are.equal("heuristic", q.method)
    assert.is_true(q.overall > 0.8)
  end)

  describe("with an LLM judge", function()
    local srv
    setup(function() srv = testserver.start() end)
    teardown(function() srv:stop() end)
    before_each(function() mg.run(function() srv:reset() end) end)

    local function client()
      return assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m", max_retries = 0 })
    end

    it("asks for the four scores with a JSON schema", function()
      mg.run(function() srv:script { content = cjson.encode {
        faithfulness = 0.9, groundedness = 0.8, context_relevance = 1, answer_relevance = 0.7,
        comment = "근거에 충실함" } } end)
      local st = seed_state()
      st.answer = grounded
      local q = mg.run(function() return feedback.run(st, { config = { llm = client() } }).quality end)
      assert.are.equal("llm", q.method)
      assert.are.equal(0.9, q.faithfulness)
      assert.are.equal(0.85, q.overall)
      local body = cjson.decode(mg.run(function() return srv:requests("/v1/chat/completions") end)[1].body)
      assert.is_table(body.response_format)
      assert.matches("faithfulness", body.messages[1].content)
      assert.matches("종이류", body.messages[1].content)
    end)

    it("falls back to the heuristic when the judge fails", function()
      mg.run(function() srv:script { status = 500, body = "{}" } end)
      local st = seed_state()
      st.answer = grounded
      local q = mg.run(function() return feedback.run(st, { config = { llm = client() } }).quality end)
      assert.are.equal("heuristic", q.method)
      assert.is_string(q.judge_error)
    end)
  end)
end)
