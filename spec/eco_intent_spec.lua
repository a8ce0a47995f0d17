-- Intent classification: offline decision, Chain-of-Intent boosts, keyword
-- calibration, multi-intent clauses, complexity, the LLM path with its
-- fallback, and the intent cache.

local intent = require "scripts.eco.routing"
local classifier = require "nodes.lib.intent_model"

-- An LLM client with the moongraph.llm chat contract, answering from a
-- script: each entry is a function(req) returning what chat returns.
local function scripted_llm(...)
  local answers = { ... }
  local client = { calls = {} }
  function client:chat(req)
    self.calls[#self.calls + 1] = req
    local f = answers[math.min(#self.calls, #answers)]
    return f(req)
  end
  return client
end

local function replies(json)
  return function() return { json = json, model = "test-model" } end
end

describe("eco intent", function()
  describe("offline", function()
    it("classifies without an LLM and says so", function()
      local r = intent.classify("냉장고 버리려면 어떻게 해?")
      assert.equal("bulk_waste", r.intent)
      assert.same({}, r.additional_intents)
      assert.is_false(r.is_multi)
      assert.equal("simple", r.complexity)
      assert.equal("offline", r.source)
      assert.equal("no LLM configured", r.explain.fallback_reason)
      assert.is_true(r.confidence > 0.5 and r.confidence <= 1)
    end)

    it("classifies an infographic request as image generation", function()
      assert.equal("image_generation", intent.classify("분리배출 방법을 인포그래픽으로 만들어줘").intent)
    end)

    it("explains scores, boosts and keyword adjustments", function()
      local r = intent.classify("팔 수 있어?", { prev_intent = "bulk_waste" })
      local ex = r.explain
      local sum = 0
      for _, c in ipairs(intent.INTENTS) do sum = sum + ex.scores[c] end
      assert.near(1, sum, 1e-3)
      assert.equal("bulk_waste", ex.transition_boost.prev_intent)
      assert.same({ location = 0.12, recyclable_price = 0.08 }, ex.transition_boost.boosts)
      assert.equal(0.08, ex.transition_boost.applied)
      assert.equal("recyclable_price", ex.keyword_adjustments.intent)
    end)

    it("follows the seed's three-turn conversation", function()
      local t1 = intent.classify("냉장고 버리려면 어떻게 해?")
      assert.equal("bulk_waste", t1.intent)
      local t2 = intent.classify("팔 수 있어?", { prev_intent = t1.intent })
      assert.equal("recyclable_price", t2.intent)
      assert.equal(0.08, t2.explain.transition_boost.applied)
      local t3 = intent.classify("근처에 어디서 팔아?", { prev_intent = t2.intent })
      assert.equal("location", t3.intent)
      assert.equal(0.10, t3.explain.transition_boost.applied)
    end)

    it("computes confidence as base + boost + keyword delta, clamped", function()
      local r = intent.classify("팔 수 있어?", { prev_intent = "bulk_waste" })
      local ex = r.explain
      assert.equal("recyclable_price", r.intent)
      -- base: the classifier's score of the intent; no keyword of it: -0.1
      assert.near(ex.scores.recyclable_price, ex.base_confidence, 1e-3)
      assert.equal(-0.1, ex.keyword_adjustments.delta)
      local want = ex.scores.recyclable_price + 0.08 - 0.1
      assert.is_true(want > 0 and want < 1)
      assert.near(want, r.confidence, 1e-3)
    end)

    describe("transition boosts", function()
      -- A model that cannot tell "버려 어디" apart: waste and location score
      -- the same, so the previous intent decides.
      local tiny
      setup(function()
        local ex = {
          { text = "버려", label = "waste" }, { text = "어디", label = "location" },
        }
        local others = { character = "캐릭터", bulk_waste = "소파", recyclable_price = "시세",
          collection_point = "수거함", web_search = "뉴스", image_generation = "그림",
          general = "안녕" }
        for label, text in pairs(others) do ex[#ex + 1] = { text = text, label = label } end
        tiny = classifier.train(ex, { calibrate = false })
      end)

      it("are added to the candidates' scores before the choice", function()
        local p = tiny:predict("버려 어디")
        assert.near(p.waste, p.location, 1e-12)
        -- general boosts waste by 0.10 and location by 0.08
        assert.equal("waste", intent.classify("버려 어디", { model = tiny, prev_intent = "general" }).intent)
        -- bulk_waste boosts location by 0.12
        local r = intent.classify("버려 어디", { model = tiny, prev_intent = "bulk_waste" })
        assert.equal("location", r.intent)
        assert.near(p.location + 0.12, r.explain.transition_boost.boosted_scores.location, 1e-3)
      end)

      it("record when the boost changed the choice", function()
        -- a tie is broken by name: location before waste
        assert.equal("location", intent.classify("버려 어디", { model = tiny }).intent)
        local r = intent.classify("버려 어디", { model = tiny, prev_intent = "general" })
        assert.equal("waste", r.intent)
        assert.is_true(r.explain.transition_boost.changed_choice)
        assert.equal("location", r.explain.transition_boost.unboosted_choice)
        r = intent.classify("버려 어디", { model = tiny, prev_intent = "waste" })
        assert.equal("location", r.intent) -- waste -> location +0.15
        assert.is_falsy(r.explain.transition_boost.changed_choice)
      end)

      it("read the transitions table on every call", function()
        local transitions = require "scripts.eco.transitions"
        local saved = transitions.character
        transitions.character = { location = 0.3 }
        local r = intent.classify("버려 어디", { model = tiny, prev_intent = "character" })
        transitions.character = saved
        assert.equal("location", r.intent)
        assert.equal(0.3, r.explain.transition_boost.applied)
      end)
    end)

    it("calls a message without a known n-gram small talk", function()
      for _, m in ipairs{ "👍", "???", "@@ !!" } do
        local r = intent.classify(m, { prev_intent = "waste" })
        assert.equal("general", r.intent, m)
        assert.is_true(r.explain.no_evidence, m)
      end
    end)

    it("returns nil, err when the classifier's data cannot be read", function()
      local saved = classifier.default_data_path
      classifier.default_data_path = function() return "/nonexistent/intents.jsonl" end
      classifier.reset()
      local r, err = intent.classify("안녕")
      classifier.default_data_path = saved
      classifier.reset()
      assert.is_nil(r)
      assert.matches("^intent data: ", err)
    end)

    it("rejects an unknown previous intent", function()
      assert.has_error(function() intent.classify("안녕", { prev_intent = "weather" }) end,
        "bad argument #2 to 'classify': unknown prev_intent 'weather'")
    end)

    it("rejects a message that is not a string or is empty", function()
      assert.has_error(function() intent.classify(nil) end,
        "bad argument #1 to 'classify': expected a string, got nil")
      assert.has_error(function() intent.classify("   ") end,
        "bad argument #1 to 'classify': message is empty")
    end)
  end)

  describe("keyword calibration", function()
    it("adds 0.1 per keyword found", function()
      local kw = intent.keyword_adjustment("수거함 위치", "collection_point")
      assert.same({ "수거함" }, kw.matched)
      assert.equal(0.1, kw.delta)
    end)

    it("adds at most 0.2", function()
      local kw = intent.keyword_adjustment("대형폐기물 소파 냉장고 수수료 신청", "bulk_waste")
      assert.is_true(#kw.matched >= 4)
      assert.equal(0.2, kw.delta)
    end)

    it("takes 0.1 away when no keyword matches", function()
      local kw = intent.keyword_adjustment("팔 수 있어?", "recyclable_price")
      assert.same({}, kw.matched)
      assert.equal(-0.1, kw.delta)
    end)

    it("matches ASCII keywords case-insensitively", function()
      assert.same({ "kg" }, intent.keyword_adjustment("고물 1KG", "recyclable_price").matched)
    end)

    it("uses the keyword map of the seed", function()
      local map = require "scripts.eco.keyword_map"
      assert.same({ "버려", "버리", "분리", "재활용", "쓰레기", "폐기" }, map.waste)
      assert.equal(11, #map.bulk_waste)
      assert.equal(7, #map.location)
    end)
  end)

  describe("multi-intent", function()
    it("finds the seed's two requests", function()
      local r = intent.classify("종이 어떻게 버려? 그리고 수거함도 알려줘")
      assert.equal("waste", r.intent)
      assert.same({ "collection_point" }, r.additional_intents)
      assert.is_true(r.is_multi)
      assert.equal("complex", r.complexity)
    end)

    it("does not split a list of nouns joined by 이랑", function()
      local r = intent.classify("책상이랑 의자 버리는 비용")
      assert.equal("bulk_waste", r.intent)
      assert.same({}, r.additional_intents)
      assert.is_false(r.is_multi)
    end)

    it("does not split a list of nouns joined by commas", function()
      local r = intent.classify("소파, 침대, 장롱 버리는 방법 알려줘")
      assert.equal("bulk_waste", r.intent)
      assert.same({}, r.additional_intents)
    end)

    it("splits at 이랑 after a whole request", function()
      local r = intent.classify("캐릭터 얻는 법이랑 근처 제로웨이스트샵 알려줘")
      assert.equal("character", r.intent)
      assert.same({ "location" }, r.additional_intents)
    end)

    it("splits at a request verb joined by -고", function()
      local r = intent.classify("고철 시세 알려주고 가까운 고물상도 알려줘")
      assert.equal("recyclable_price", r.intent)
      assert.same({ "location" }, r.additional_intents)
    end)

    it("finds an '...도 알려줘' request without a conjunction", function()
      local r = intent.classify("페트병 어떻게 버려 근처 수거함도 알려줘")
      assert.equal("waste", r.intent)
      assert.same({ "collection_point" }, r.additional_intents)
    end)

    it("lists each additional intent once", function()
      local r = intent.classify("폐건전지 수거함 어디야? 그리고 형광등 수거함도 알려줘. 헌옷 수거함도")
      assert.equal("collection_point", r.intent)
      assert.same({}, r.additional_intents)
      assert.equal("complex", r.complexity) -- several clauses
    end)

    it("drops a greeting before a request", function()
      local r = intent.classify("안녕! 스티로폼 어떻게 버려?")
      assert.equal("waste", r.intent)
      assert.same({}, r.additional_intents)
      assert.equal("pleasantry", r.explain.clauses[1].dropped)
    end)

    it("keeps general for a greeting alone", function()
      assert.equal("general", intent.classify("안녕하세요 반가워요").intent)
    end)

    it("exposes the clause splitter", function()
      local clauses = intent.split("종이 어떻게 버려? 그리고 수거함도 알려줘")
      assert.equal(2, #clauses)
      assert.equal("종이 어떻게 버려", clauses[1].text)
      assert.equal("수거함도 알려줘", clauses[2].text)
      local list = intent.split("책상이랑 의자 버리는 비용")
      assert.equal(1, #list)
      assert.equal("책상이랑 의자 버리는 비용", list[1].text)
    end)
  end)

  describe("complexity", function()
    it("is simple for one short request", function()
      assert.equal("simple", intent.classify("페트병 라벨 떼야 돼?").complexity)
    end)

    it("is complex for a long message", function()
      local r = intent.classify("이사 가면서 오래된 냉장고랑 세탁기, 침대 프레임, 매트리스까지 한꺼번에 정리하려고 하는데 어떤 순서로 신청하면 되는지 궁금해요")
      assert.equal("complex", r.complexity)
    end)

    it("is complex when asked to compare", function()
      local r = intent.classify("종이팩이랑 멸균팩 차이가 뭐야")
      assert.equal("complex", r.complexity)
      assert.matches("차이", r.explain.complexity_reason, 1, true)
    end)
  end)

  describe("with an LLM", function()
    local cache
    before_each(function() cache = intent.new_cache(8) end)

    it("uses the LLM's structured answer", function()
      local llm = scripted_llm(replies{ intent = "location", additional_intents = {}, confidence = 0.75 })
      local r = intent.classify("근처 재활용센터는?", { llm = llm, prev_intent = "waste", cache = cache })
      assert.equal("llm", r.source)
      assert.equal("location", r.intent)
      assert.is_nil(r.explain.fallback_reason)
      -- 0.75 + 0.15 (waste -> location) + keywords (근처, 재활용센터: +0.2), clamped
      assert.equal(1, r.confidence)
      assert.equal(0.15, r.explain.transition_boost.applied)
      assert.equal(1, #llm.calls)
    end)

    it("sends the rendered prompt and the schema", function()
      local llm = scripted_llm(replies{ intent = "waste", confidence = 0.9 })
      intent.classify("페트병 어떻게 버려?", { llm = llm, prev_intent = "general",
                                               user_location = "서울", cache = cache })
      local req = llm.calls[1]
      assert.equal("system", req.messages[1].role)
      assert.matches("Previous intent: general", req.messages[1].content, 1, true)
      assert.matches("User location: 서울", req.messages[1].content, 1, true)
      assert.is_nil(req.messages[1].content:find("{{", 1, true))
      assert.same({ role = "user", content = "페트병 어떻게 버려?" }, req.messages[2])
      local schema = req.json_schema
      assert.same(intent.INTENTS, schema.properties.intent.enum)
      assert.same(intent.INTENTS, schema.properties.additional_intents.items.enum)
      assert.same({ "intent", "confidence" }, schema.required)
    end)

    it("takes additional intents from the LLM, without duplicates", function()
      local llm = scripted_llm(replies{ intent = "waste",
        additional_intents = { "collection_point", "waste", "collection_point" }, confidence = 0.8 })
      local r = intent.classify("종이 어떻게 버려? 그리고 수거함도 알려줘", { llm = llm, cache = cache })
      assert.same({ "collection_point" }, r.additional_intents)
      assert.is_true(r.is_multi)
      assert.equal("complex", r.complexity)
    end)

    it("falls back to the classifier when the call fails", function()
      local llm = scripted_llm(function() return nil, "HTTP 500: internal error" end)
      local r = intent.classify("냉장고 버리려면 어떻게 해?", { llm = llm, cache = cache })
      assert.equal("offline", r.source)
      assert.equal("bulk_waste", r.intent)
      assert.equal("llm failed: HTTP 500: internal error", r.explain.fallback_reason)
    end)

    it("falls back when the call times out", function()
      local llm = scripted_llm(function() return nil, "timeout" end)
      local r = intent.classify("냉장고 버리려면 어떻게 해?", { llm = llm, cache = cache })
      assert.equal("offline", r.source)
      assert.equal("llm failed: timeout", r.explain.fallback_reason)
    end)

    it("falls back when the client raises", function()
      local llm = scripted_llm(function() error("connection refused") end)
      local r = intent.classify("고철 시세 얼마야?", { llm = llm, cache = cache })
      assert.equal("offline", r.source)
      assert.equal("recyclable_price", r.intent)
      assert.matches("^llm error: .*connection refused", r.explain.fallback_reason)
    end)

    it("falls back when the reply does not match the schema", function()
      for _, bad in ipairs{
        { intent = "weather", confidence = 0.9 },
        { intent = "waste", confidence = "high" },
        { intent = "waste", confidence = 0.9, additional_intents = { "sports" } },
      } do
        local llm = scripted_llm(replies(bad))
        local r = intent.classify("페트병 어떻게 버려?", { llm = llm, cache = cache })
        assert.equal("offline", r.source)
        assert.matches("^llm reply does not match the schema", r.explain.fallback_reason)
      end
      local llm = scripted_llm(function() return { text = "waste" } end)
      local r = intent.classify("페트병 어떻게 버려?", { llm = llm, cache = cache })
      assert.equal("llm reply has no JSON object", r.explain.fallback_reason)
    end)

    it("clamps the LLM's confidence into 0..1", function()
      local llm = scripted_llm(replies{ intent = "general", confidence = 7 })
      local r = intent.classify("안녕", { llm = llm, cache = cache })
      assert.equal(1, r.explain.base_confidence)
      assert.is_true(r.confidence <= 1)
    end)

    describe("cache", function()
      it("answers an identical message in the same context without the LLM", function()
        local llm = scripted_llm(replies{ intent = "waste", confidence = 0.8 })
        local a = intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache })
        local b = intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache })
        assert.equal(1, #llm.calls)
        assert.equal("miss", a.explain.cache)
        assert.equal("hit", b.explain.cache)
        assert.equal("llm", b.source)
        assert.equal(a.intent, b.intent)
        assert.equal(a.confidence, b.confidence)
      end)

      it("asks again when the previous intent or location presence differs", function()
        local llm = scripted_llm(replies{ intent = "waste", confidence = 0.8 })
        intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache })
        intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache, prev_intent = "general" })
        intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache, user_location = "서울" })
        intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache, user_location = "부산" })
        assert.equal(3, #llm.calls)
      end)

      it("does not keep failures", function()
        local llm = scripted_llm(function() return nil, "HTTP 503" end,
                                 replies{ intent = "waste", confidence = 0.8 })
        assert.equal("offline", intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache }).source)
        assert.equal("llm", intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache }).source)
        assert.equal(2, #llm.calls)
      end)

      it("hands out copies, so a caller cannot change a cached answer", function()
        local llm = scripted_llm(replies{ intent = "waste", confidence = 0.8 })
        local a = intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache })
        a.additional_intents[1] = "character"
        local b = intent.classify("캔 어떻게 버려?", { llm = llm, cache = cache })
        assert.same({}, b.additional_intents)
      end)

      it("can be a plain table", function()
        local llm = scripted_llm(replies{ intent = "waste", confidence = 0.8 })
        local t = {}
        intent.classify("캔 어떻게 버려?", { llm = llm, cache = t })
        local r = intent.classify("캔 어떻게 버려?", { llm = llm, cache = t })
        assert.equal(1, #llm.calls)
        assert.equal("hit", r.explain.cache)
        assert.is_not_nil(next(t))
      end)

      it("can be turned off", function()
        local llm = scripted_llm(replies{ intent = "waste", confidence = 0.8 })
        intent.classify("캔 어떻게 버려?", { llm = llm, cache = false })
        intent.classify("캔 어떻게 버려?", { llm = llm, cache = false })
        assert.equal(2, #llm.calls)
      end)

      it("is bounded and evicts the least recently used entry", function()
        local c = intent.new_cache(2)
        c:set("a", 1)
        c:set("b", 2)
        assert.equal(1, c:get("a"))
        c:set("c", 3)
        assert.equal(2, c.size)
        assert.is_nil(c:get("b"))
        assert.equal(1, c:get("a"))
        assert.equal(3, c:get("c"))
      end)
    end)
  end)

  describe("the LLM prompt", function()
    it("has every placeholder of prompts/intent.txt filled by what the classifier gives", function()
      local prompt = require "moongraph.prompt"
      assert(prompt.file("intent.txt", { intents = "x", prev_intent = "none", user_location = "unknown" }))
    end)
  end)
end)
