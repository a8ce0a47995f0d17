local mg = require "moongraph"
local cli = require "cli"
local tmp = require "tmp"
local json = require "cjson"
local router = require "scripts.marketing.router"
local resolver = require "scripts.marketing.resolver"
local features = require "scripts.marketing.features"
local relevance = require "scripts.marketing.relevance"
local strategy = require "scripts.marketing.strategy"
local tools_mod = require "scripts.marketing.tools"
local adapter = require "scripts.marketing.adapter"

local OFFLINE = "env -u MOONGRAPH_LLM_BASE_URL -u MOONGRAPH_LLM_API_KEY -u GOOGLE_API_KEY " ..
  "-u CONFIRM_ON_MULTI -u ENABLE_RELEVANCE_CHECK -u MAX_RETRIES -u MARKETING_DATA_DIR"

local function settings(over)
  local s = { confirm_on_multi = true, enable_relevance_check = true, max_retries = 2,
    llm_temperature = 0.4, checkpoint_dir = "unused" }
  for k, v in pairs(over or {}) do s[k] = v end
  return s
end

local function pipeline(over, extra)
  local o = { settings = settings(over), llm = false, checkpointer = mg.checkpoint.memory() }
  for k, v in pairs(extra or {}) do o[k] = v end
  return adapter.new(o)
end

-- a draft that passes every relevance check for 본죽 강남역점 / ISSUE
local GOOD = "본죽 강남역점의 문제를 진단합니다. 최근 6개월 매출이 14.1% 감소했고 재방문율은 15.0%로 낮습니다. " ..
  "원인은 단골 전환이 약하고 배달 비중이 55.0%로 높아 매장 방문 고객과의 접점이 줄어든 데 있습니다. " ..
  "개선 방향으로 재방문 쿠폰과 매장 방문 전환 프로모션을 제안합니다. 월별 지표로 개선 여부를 점검하세요."
-- the same without the store name: fails the store_name check
local NO_NAME = GOOD:gsub("본죽 강남역점의 ", "")

describe("marketing: intent router", function()
  it("classifies by keyword hits, ties to the earlier intent, default GENERAL", function()
    assert.equal("ISSUE", router.classify("본죽 문제점이 뭐야?"))
    assert.equal("SNS", router.classify("인스타 홍보 어떻게 해?"))
    assert.equal("REVISIT", router.classify("단골 늘리는 쿠폰 아이디어"))
    assert.equal("GENERAL", router.classify("마케팅 전략 알려줘"))
    assert.equal("REVISIT", router.classify("재방문율이 낮은 원인"))      -- 1 hit each: REVISIT comes first
    assert.equal("ISSUE", router.classify("매출 하락 원인 진단해줘"))
  end)

  it("takes the store name from the question when none is given", function()
    local T = tools_mod.new()
    mg.run(function()
      assert.equal("본죽", router.store_name_in("본죽 문제점이 뭐야?", T.search_merchant))
      assert.equal("본죽 강남역점", router.store_name_in("본죽 강남역점 매출 어때?", T.search_merchant))
      assert.equal("망원 떡볶이집", router.store_name_in("망원 떡볶이집의 문제가 뭐야", T.search_merchant))
      assert.is_nil(router.store_name_in("어떻게 홍보해?", T.search_merchant))
    end)
  end)
end)

describe("marketing: data tools over the sample dataset", function()
  it("answer the seed's five tools and say the data is a sample", function()
    local T = tools_mod.new()
    mg.run(function()
      local s = T.search_merchant("본죽")
      assert.is_true(s.found)
      assert.equal(3, #s.merchants)
      assert.is_true(s.merchants[1].sample)
      assert.is_false(T.search_merchant("없는가게").found)
      local card = T.load_store_data("S001")
      assert.is_true(card.success)
      assert.equal(0.15, card.data.revisit_rate)
      assert.is_true(card.data.sample)
      assert.same({ success = false, error = "card data of store 'S999' not found" }, T.load_store_data("S999"))
      local r = T.resolve_region("서울특별시 강남구 역삼1동")
      assert.equal("SAMPLE-1168064", r.admin_dong_code)
      assert.is_true(T.load_area_data(r.admin_dong_code).success)
      assert.is_true(T.load_region_data(r.admin_dong_code).success)
      assert.is_false(T.resolve_region("어딘가").success)
    end)
  end)

  it("every sample file declares itself a sample", function()
    for _, f in ipairs { "merchants", "card_data", "regions", "area_data", "region_data" } do
      local h = assert(io.open("data/marketing/" .. f .. ".json"))
      local d = json.decode(h:read("a"))
      h:close()
      assert.is_true(d.sample, f)
      assert.matches("샘플", d.notice)
    end
  end)
end)

describe("marketing: store resolver", function()
  local function m(name) return { name = name, store_id = name } end

  it("ranks exact > prefix > shorter name", function()
    local ranked = resolver.rank("본죽", { m("맛있는 본죽"), m("본죽&비빔밥 선릉점"), m("본죽 역삼점"), m("본죽") })
    local names = {}
    for i, c in ipairs(ranked) do names[i] = c.name end
    assert.same({ "본죽", "본죽 역삼점", "본죽&비빔밥 선릉점", "맛있는 본죽" }, names)
  end)

  it("picks a candidate by number, id, exact name or a unique part of the name", function()
    local c = { { name = "본죽 역삼점", store_id = "S002" }, { name = "본죽 강남역점", store_id = "S001" } }
    assert.equal("S001", resolver.pick("2번", c).store_id)
    assert.equal("S001", resolver.pick("2", c).store_id)
    assert.equal("S001", resolver.pick(" 2 번 ", c).store_id)
    assert.equal("S002", resolver.pick("S002", c).store_id)
    assert.equal("S001", resolver.pick("본죽 강남역점", c).store_id)
    assert.equal("S001", resolver.pick("강남", c).store_id)
    assert.is_nil(resolver.pick("본죽", c))          -- matches both
    assert.is_nil(resolver.pick("9", c))
  end)
end)

describe("marketing: feature builder", function()
  local base = { revisit_rate = 0.3, delivery_share = 0.3, new_customer_share = 0.3,
    customer_age = { ["20대"] = 0.5, ["30대"] = 0.5 }, gender = { ["여성"] = 0.6, ["남성"] = 0.4 } }
  local function codes(card)
    local f = assert(features.build(card))
    local out = {}
    for i, s in ipairs(f.signals) do out[i] = s.code end
    return out
  end
  local function with(k, v)
    local c = {}
    for kk, vv in pairs(base) do c[kk] = vv end
    c[k] = v
    return c
  end

  it("RETENTION_ALERT when the revisit rate is below 0.2", function()
    assert.same({ "RETENTION_ALERT" }, codes(with("revisit_rate", 0.19)))
    assert.same({}, codes(with("revisit_rate", 0.2)))
  end)

  it("CHANNEL_MIX_ALERT when the delivery share is 0.5 or more", function()
    assert.same({ "CHANNEL_MIX_ALERT" }, codes(with("delivery_share", 0.5)))
    assert.same({}, codes(with("delivery_share", 0.49)))
  end)

  it("NEW_CUSTOMER_FOCUS when the new-customer share is above 0.4", function()
    assert.same({ "NEW_CUSTOMER_FOCUS" }, codes(with("new_customer_share", 0.41)))
    assert.same({}, codes(with("new_customer_share", 0.4)))
  end)

  it("builds a persona and channel hints from the largest age group", function()
    local f = features.build(with("delivery_share", 0.6))
    assert.equal("20대", f.persona.main_age)                 -- ties go to the first in order
    assert.equal("여성", f.persona.main_gender)
    assert.same({ "인스타그램 릴스", "틱톡 숏폼", "배달앱 리뷰·사진 관리" }, f.channel_hints)
    assert.same({ nil, "card data lacks revisit_rate" }, { features.build { delivery_share = 1 } })
  end)
end)

describe("marketing: relevance check", function()
  local ctx = { store_name = "본죽 강남역점", brand = "본죽", intent = "ISSUE" }
  local function failed(draft) return relevance.run_all_checks(draft, ctx).failed end

  it("passes a draft that meets every rule", function()
    local r = relevance.run_all_checks(GOOD, ctx)
    assert.is_true(r.passed)
    assert.equal(1, r.score)
  end)

  it("checks length, store name, data evidence, numbers, intent keywords and forbidden words", function()
    assert.same({ "length" }, failed("본죽 강남역점 문제 원인: 재방문율 15%."))
    assert.same({ "store_name" }, failed(NO_NAME:gsub("^", "이 가게의 ")))
    assert.same({ "data_evidence" }, failed((GOOD:gsub("매출", "실적"):gsub("재방문율", "재구매"):gsub("배달 비중", "배달앱")
      :gsub("배달", "딜리버리"):gsub("재방문", "다시 방문"):gsub("고객", "손님"))))
    assert.same({ "numbers" }, failed((GOOD:gsub("%d+%.?%d*%%?", "많이"))))
    assert.same({ "intent_keywords" }, relevance.run_all_checks(GOOD, { store_name = "본죽 강남역점", intent = "SNS" }).failed)
    assert.same({ "forbidden_words" }, failed(GOOD .. " 이 방법이면 매출 상승을 100% 보장합니다."))
  end)
end)

describe("marketing: post-processing", function()
  it("adds badges, action seeds and the disclaimer", function()
    local s = { intent = "ISSUE", card_data = { sample = true, proxy_fields = { "delivery_share" }, period = "2024 (샘플)",
      revisit_rate = 0.15, delivery_share = 0.55 }, signals = { { code = "RETENTION_ALERT" }, { code = "CHANNEL_MIX_ALERT" } } }
    local final, actions = strategy.postprocess("  초안\n\n\n\n본문  ", s, true)
    assert.matches("^%[샘플 데이터%] %[프록시 지표: 배달 비중 추정%] %[기준 데이터: 카드 2024 %(샘플%)%] %[오프라인 템플릿%]", final)
    assert.matches("초안\n\n본문", final)
    assert.equal(strategy.DISCLAIMER, final:match("[^\n]+$"))
    assert.equal(3, #actions)
    assert.equal("재방문 쿠폰·스탬프 도입", actions[1].title)
    assert.equal("재방문율 15.0% → 20% 이상", actions[1].kpi)
    assert.equal("월간 지표 점검", actions[3].title)
  end)
end)

describe("marketing: run_one_turn", function()
  it("answers offline with a labelled template; status ok with actions", function()
    local r = pipeline():run_one_turn("망원 떡볶이집 인스타 홍보 어떻게 해?", nil, "t-ok")
    assert.equal("ok", r.status)
    assert.is_nil(r.error)
    assert.matches("오프라인 템플릿", r.final_response)
    assert.matches("망원 떡볶이집", r.final_response)
    assert.equal("SNS", r.state.intent)
    assert.is_true(#r.actions >= 1)
    assert.equal("t-ok", r.thread_id)
  end)

  it("several candidates with CONFIRM_ON_MULTI: need_clarify, then the chosen store resumes the run", function()
    local p = pipeline()
    local r1 = p:run_one_turn("본죽 문제점이 뭐야?", nil, "t-clarify")
    assert.equal("need_clarify", r1.status)
    assert.equal(3, #r1.store_candidates)
    assert.equal("본죽 역삼점", r1.store_candidates[1].name)
    assert.matches("어느 가맹점인가요", r1.final_response)
    local r2 = p:run_one_turn("본죽 강남역점", "본죽 강남역점", "t-clarify")
    assert.equal("ok", r2.status)
    assert.equal("S001", r2.state.store_id)
    assert.equal("ISSUE", r2.state.intent)         -- the first turn's question is answered
    assert.matches("본죽 강남역점 문제 진단", r2.final_response)
  end)

  it("an answer that names no candidate asks again", function()
    local p = pipeline()
    p:run_one_turn("본죽 재방문 늘리려면?", nil, "t-again")
    local r = p:run_one_turn("본죽", nil, "t-again")           -- ambiguous
    assert.equal("need_clarify", r.status)
    assert.matches("후보 중 하나가 아닙니다", r.final_response)
    r = p:run_one_turn("3", nil, "t-again")
    assert.equal("ok", r.status)
    assert.equal("S003", r.state.store_id)
    assert.equal("REVISIT", r.state.intent)
  end)

  it("without CONFIRM_ON_MULTI the best-ranked candidate is taken", function()
    local r = pipeline { confirm_on_multi = false }:run_one_turn("본죽 문제점이 뭐야?", nil, "t-auto")
    assert.equal("ok", r.status)
    assert.equal("S002", r.state.store_id)          -- 본죽 역삼점: prefix match, shortest name
  end)

  it("keeps the conversation messages per thread", function()
    local p = pipeline()
    p:run_one_turn("성수 커피로스터스 마케팅 전략", nil, "t-a")
    p:run_one_turn("성수 커피로스터스 인스타 홍보", nil, "t-a")
    p:run_one_turn("연남 베이글하우스 단골 늘리기", nil, "t-b")
    local a, b = p:messages("t-a"), p:messages("t-b")
    assert.equal(4, #a)
    assert.same({ "user", "assistant", "user", "assistant" }, { a[1].role, a[2].role, a[3].role, a[4].role })
    assert.equal("성수 커피로스터스 인스타 홍보", a[3].content)
    assert.equal(2, #b)
  end)

  it("reports errors: unknown store, no store in the question, empty query", function()
    local p = pipeline()
    local r = p:run_one_turn("없는가게 문제 알려줘", "없는가게", "t-e1")
    assert.equal("error", r.status)
    assert.matches("찾을 수 없습니다", r.error)
    r = p:run_one_turn("어떻게 홍보해?", nil, "t-e2")
    assert.equal("error", r.status)
    assert.matches("가맹점명을 찾지 못했습니다", r.error)
    assert.equal("error", p:run_one_turn("  ", nil, "t-e3").status)
  end)
end)

describe("marketing: relevance retry loop", function()
  -- a drafter that returns the given drafts in turn (the last one repeats)
  local function drafts(list, seen)
    local n = 0
    return function(intent, _, prompt)
      n = n + 1
      seen[#seen + 1] = { intent = intent, prompt = prompt }
      return list[math.min(n, #list)]
    end
  end

  it("a first draft that fails the check is redrafted with the feedback; the retry passes", function()
    local seen = {}
    local p = pipeline({}, { drafter = drafts({ NO_NAME, GOOD }, seen) })
    local r = p:run_one_turn("본죽 강남역점 문제점이 뭐야?", nil, "t-retry")
    assert.equal("ok", r.status)
    assert.equal(2, #seen)
    assert.equal(1, r.state.retry_count)
    assert.same({ NO_NAME, GOOD }, r.state.drafts)
    assert.is_true(r.state.relevance_passed)
    assert.not_matches("품질 검증 실패", seen[1].prompt)
    assert.matches("품질 검증 실패", seen[2].prompt)
    assert.matches("store_name: does not mention 본죽 강남역점", seen[2].prompt)
  end)

  it("is bounded by MAX_RETRIES: after MAX_RETRIES + 1 failing drafts the turn ends with an error", function()
    for _, max in ipairs { 0, 2 } do
      local seen = {}
      local r = pipeline({ max_retries = max }, { drafter = drafts({ NO_NAME }, seen) })
        :run_one_turn("본죽 강남역점 문제점이 뭐야?", nil, "t-bound-" .. max)
      assert.equal(max + 1, #seen)
      assert.equal("error", r.status)
      assert.matches("관련성 검증 실패", r.error)
      assert.matches("store_name", r.error)
      assert.equal(max + 1, r.state.retry_count)
    end
  end)

  it("with ENABLE_RELEVANCE_CHECK off the first draft is taken as is", function()
    local seen = {}
    local r = pipeline({ enable_relevance_check = false }, { drafter = drafts({ NO_NAME }, seen) })
      :run_one_turn("본죽 강남역점 문제점이 뭐야?", nil, "t-off")
    assert.equal("ok", r.status)
    assert.equal(1, #seen)
    assert.is_true(r.state.relevance_report.skipped)
  end)
end)

describe("marketing: with an LLM (OpenAI-compatible test server)", function()
  local testserver = require "testserver"
  local llm = require "moongraph.llm"
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)

  it("the LLM's first draft fails the check, the retry prompt carries the feedback, the second passes", function()
    mg.run(function()
      srv:reset()
      srv:script { { content = NO_NAME }, { content = GOOD } }
    end)
    local client = assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m", max_retries = 0 })
    local p = pipeline({ llm_model = "strategy-model" }, { llm = client })
    local r = p:run_one_turn("본죽 강남역점 문제점이 뭐야?", nil, "t-llm")
    assert.equal("ok", r.status)
    assert.equal("llm", r.state.mode)
    assert.equal(1, r.state.retry_count)
    assert.not_matches("오프라인 템플릿", r.final_response)
    local reqs = mg.run(function() return srv:requests("/v1/chat/completions") end)
    assert.equal(2, #reqs)
    local second = json.decode(reqs[2].body)
    assert.equal("strategy-model", second.model)
    assert.matches("품질 검증 실패", second.messages[1].content)
    assert.matches("본죽 강남역점", second.messages[1].content)
  end)

  it("a failed LLM call falls back to the offline template, saying so", function()
    mg.run(function()
      srv:reset()
      srv:script { { status = 400, json = { error = { message = "bad model" } } } }
    end)
    local client = assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m", max_retries = 0 })
    local r = pipeline({}, { llm = client }):run_one_turn("연남 베이글하우스 단골 늘리기", nil, "t-llm-fail")
    assert.equal("ok", r.status)
    assert.equal("offline", r.state.mode)
    assert.matches("LLM 호출 실패", r.state.notes)
    assert.matches("오프라인 템플릿", r.final_response)
  end)
end)

describe("moongraph marketing", function()
  it("clarify in one process, resume with the chosen store in another (file checkpoints)", function()
    local dir = tmp.dir("checkpoints")
    local env = OFFLINE .. " MARKETING_CHECKPOINT_DIR=" .. cli.quote(dir)
    local r1 = cli.run({ "marketing", "--thread", "cli-1", "--json", "본죽 문제점이 뭐야?" }, { env = env })
    assert.equal(0, r1.code)
    local a = json.decode(r1.out)
    assert.equal("need_clarify", a.status)
    assert.equal(3, #a.store_candidates)
    local r2 = cli.run({ "marketing", "--thread", "cli-1", "--json", "--store", "본죽 강남역점" }, { env = env })
    assert.equal(0, r2.code)
    local b = json.decode(r2.out)
    assert.equal("ok", b.status)
    assert.matches("본죽 강남역점 문제 진단", b.final_response)
  end)

  it("reads the seed's toggles from the environment", function()
    local dir = tmp.dir("checkpoints")
    local env = OFFLINE .. " MARKETING_CHECKPOINT_DIR=" .. cli.quote(dir)
    local r = cli.run({ "marketing", "--json", "본죽 문제점이 뭐야?" }, { env = env .. " CONFIRM_ON_MULTI=0" })
    assert.equal(0, r.code, r.err)
    assert.equal("ok", json.decode(r.out).status)
    r = cli.run({ "marketing", "본죽 문제점이 뭐야?" }, { env = env .. " ENABLE_RELEVANCE_CHECK=maybe" })
    assert.equal(1, r.code)
    assert.matches("ENABLE_RELEVANCE_CHECK must be 1 or 0", r.err)
    r = cli.run({ "marketing", "본죽 문제점이 뭐야?" }, { env = env .. " MAX_RETRIES=-1" })
    assert.equal(1, r.code)
    assert.matches("MAX_RETRIES must be an integer from 0 to 10", r.err)
  end)

  it("prints the thread to answer on; bad usage exits 2; scripts/marketing/run.lua is the same command", function()
    local dir = tmp.dir("checkpoints")
    local env = OFFLINE .. " MARKETING_CHECKPOINT_DIR=" .. cli.quote(dir)
    local r = cli.run({ "marketing", "--thread", "cli-2", "본죽 문제점이 뭐야?" }, { env = env })
    assert.equal(0, r.code, r.err)
    assert.matches("^%[need_clarify%] thread cli%-2", r.out)
    assert.matches("answer with: moongraph marketing %-%-thread cli%-2 %-%-store", r.out)
    assert.equal(2, cli.run({ "marketing" }, { env = env }).code)
    assert.equal(2, cli.run({ "marketing", "--bogus" }, { env = env }).code)
    r = cli.run({ "run", "scripts/marketing/run.lua", "--thread", "cli-2", "2" }, { env = env })
    assert.equal(0, r.code)
    assert.matches("^%[ok%] thread cli%-2", r.out)
    assert.matches("본죽 강남역점", r.out)
  end)
end)

describe("marketing: data from PostgreSQL (a throwaway server)", function()
  local servers = require "servers"
  local pg = require "moongraph.pg"
  local srv
  setup(function() srv = servers.postgres() end)
  teardown(function() if srv then srv:destroy() end end)

  it("load_sample_into_pg fills the tables; the five tools read them, sample marks kept", function()
    mg.run(function()
      local db = assert(pg.connect(srv.url))
      assert(tools_mod.load_sample_into_pg(db))
      assert(tools_mod.load_sample_into_pg(db))          -- again: upserts, no duplicates
      local T = tools_mod.new(tools_mod.pg_backend(db))
      local s = T.search_merchant("본죽")
      assert.equal(3, #s.merchants)
      assert.is_true(s.merchants[1].sample)
      local card = T.load_store_data("S001")
      assert.is_true(card.success)
      assert.equal(0.15, card.data.revisit_rate)
      assert.is_true(card.data.sample)
      assert.is_false(T.load_store_data("S999").success)
      local code = T.resolve_region("서울특별시 강남구 역삼1동").admin_dong_code
      assert.equal("SAMPLE-1168064", code)
      assert.equal(182000, T.load_area_data(code).data.floating_population_daily)
      assert.equal(21500, T.load_region_data(code).data.resident_population)
      db:close()
    end)
  end)

  it("a turn over the database gives the same answer as over the files", function()
    local files = pipeline():run_one_turn("본죽 강남역점 문제점이 뭐야?", nil, "t-files")
    local viadb = pipeline({}, { tools = tools_mod.new(tools_mod.pg_backend(srv.url)) })
      :run_one_turn("본죽 강남역점 문제점이 뭐야?", nil, "t-db")
    assert.equal("ok", files.status)
    assert.equal("ok", viadb.status)
    assert.is_string(files.final_response)
    assert.equal(files.final_response, viadb.final_response)
  end)

  it("MARKETING_PG_URL points the command at the database; load_pg.lua loads it", function()
    local dir = tmp.dir("checkpoints")
    local db = srv:create_database("mk_cli")
    local r = cli.run({ "run", "scripts/marketing/load_pg.lua", db })
    assert.equal(0, r.code)
    local env = OFFLINE .. " MARKETING_CHECKPOINT_DIR=" .. cli.quote(dir) .. " MARKETING_PG_URL=" .. cli.quote(db)
    r = cli.run({ "marketing", "--json", "연남 베이글하우스 단골 늘리기" }, { env = env })
    assert.equal(0, r.code)
    assert.matches("연남 베이글하우스 재방문 전략", json.decode(r.out).final_response)
    r = cli.run({ "marketing", "--json", "연남 베이글하우스 단골 늘리기" },
      { env = OFFLINE .. " MARKETING_CHECKPOINT_DIR=" .. cli.quote(dir) ..
        " MARKETING_PG_URL=postgresql://postgres@127.0.0.1:1/none" })
    assert.equal(1, r.code)
    assert.matches("cannot connect to the marketing database", json.decode(r.out).error)
  end)
end)

insulate("marketing: settings from the environment", function()
  local config = require "scripts.marketing.config"
  local function with_env(env, fn)
    local real = os.getenv
    os.getenv = function(k) if env[k] ~= nil then return env[k] or nil end return nil end
    local ok, a, b = pcall(fn)
    os.getenv = real
    assert(ok, a)
    return a, b
  end

  it("has the seed's defaults", function()
    local s = with_env({}, config.from_env)
    assert.is_true(s.confirm_on_multi)
    assert.is_true(s.enable_relevance_check)
    assert.equal(2, s.max_retries)
    assert.equal(0.4, s.llm_temperature)
    assert.is_nil(with_env({}, function() return config.llm(s) end))
  end)

  it("GOOGLE_API_KEY selects Gemini's OpenAI-compatible endpoint, LLM_MODEL its model", function()
    local c = with_env({ GOOGLE_API_KEY = "g-key", LLM_MODEL = "gemini-x", LLM_TEMPERATURE = "0.2" }, function()
      return config.llm(config.from_env())
    end)
    assert.equal(config.GEMINI_BASE_URL, c.base_url)
    assert.equal("gemini-x", c.model)
    local d = with_env({ GOOGLE_API_KEY = "g-key" }, function() return config.llm(config.from_env()) end)
    assert.equal(config.GEMINI_DEFAULT_MODEL, d.model)
  end)
end)
