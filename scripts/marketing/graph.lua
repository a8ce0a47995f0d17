--[[
The store-marketing graph.

  router -> store_resolver -> data_collector -> feature_builder
         -> sns | revisit | issue | general -> relevance_checker
         -> (retry: the same intent node) | memory -> END

  store_resolver: several candidates with confirm_on_multi -> ctx.interrupt
  (the caller resumes with the chosen store); none -> error -> memory.
  A node that sets `error` sends the run to memory, which records the turn.

build(opts) -> compiled graph. opts: settings (scripts/marketing/config.lua
from_env() shape), llm (client or nil), tools (scripts/marketing/tools.lua
new()), drafter (function(intent, state, prompt) -> text | nil, err, used
instead of the LLM and the offline template), checkpointer.
]]

local mg = require "moongraph"
local router_mod = require "scripts.marketing.router"
local resolver = require "scripts.marketing.resolver"
local features = require "scripts.marketing.features"
local strategy = require "scripts.marketing.strategy"
local relevance = require "scripts.marketing.relevance"

local START, END = mg.START, mg.END

local _M = {}

_M.INTENT_NODES = { SNS = "sns", REVISIT = "revisit", ISSUE = "issue", GENERAL = "general" }
local INTENT_ORDER = { "SNS", "REVISIT", "ISSUE", "GENERAL" }

--[[ The state: what one turn reads and writes (reset by the adapter at the
start of each turn) and the conversation `messages`, kept per thread. ]]
function _M.schema()
  return {
    messages = mg.reducers.messages,
    "user_query", "store_name_input", "intent", "store_candidates", "store_id", "store", "need_clarify",
    "card_data", "admin_dong_code", "area_data", "region_data", "signals", "persona", "channel_hints",
    "raw_response", "final_response", "actions", "drafts", "mode", "relevance_passed", "relevance_report",
    "retry_count", "error", "notes",
  }
end

local function clarify_question(name, candidates)
  local lines = { string.format("'%s'에 해당하는 가맹점이 %d곳 있습니다. 어느 가맹점인가요? (이름이나 번호로 답해 주세요)",
    name, #candidates) }
  for i, c in ipairs(candidates) do
    lines[#lines + 1] = string.format("%d. %s (%s)", i, c.name, c.district)
  end
  return table.concat(lines, "\n")
end

local function strategy_node(intent, env)
  return function(s)
    local prompt = strategy.prompt(intent, s)
    local draft, err, offline, note
    if env.drafter then
      draft, err = env.drafter(intent, s, prompt)
      if not draft then error("marketing " .. intent .. ": the drafter failed: " .. tostring(err), 0) end
    elseif env.llm then
      local req = { messages = { { role = "user", content = prompt } }, temperature = env.settings.llm_temperature }
      if env.settings.llm_model then req.model = env.settings.llm_model end
      local res, cerr = env.llm:chat(req)
      draft = res and (res.content or (type(res) == "string" and res))
      if not draft or not draft:find("%S") then
        -- the seed's behaviour: a failed call falls back to the template
        note = "LLM 호출 실패(" .. tostring(cerr or "빈 응답") .. "), 오프라인 템플릿 사용"
        draft, offline = strategy.templates[intent](s), true
      end
    else
      draft, offline = strategy.templates[intent](s), true
    end
    local final, actions = strategy.postprocess(draft, s, offline)
    local drafts = {}
    for i, d in ipairs(s.drafts or {}) do drafts[i] = d end
    drafts[#drafts + 1] = draft
    return {
      raw_response = draft, final_response = final, actions = actions, drafts = drafts,
      mode = offline and "offline" or (env.drafter and "drafter" or "llm"),
      notes = note,
    }
  end
end

function _M.build(opts)
  local env = { settings = opts.settings, llm = opts.llm, tools = opts.tools, drafter = opts.drafter }
  local T = env.tools
  local g = mg.graph(_M.schema())

  g:add_node("router", function(s)
    local intent = router_mod.classify(s.user_query)
    local name = s.store_name_input
    if not name then
      local serr
      name, serr = router_mod.store_name_in(s.user_query, T.search_merchant)
      if serr then return { intent = intent, error = "가맹점 검색 실패: " .. serr } end
    end
    if not name then
      return { intent = intent, error = "질문에서 가맹점명을 찾지 못했습니다. 가맹점명을 함께 알려 주세요." }
    end
    return { intent = intent, store_name_input = name }
  end)

  g:add_node("store_resolver", function(s, ctx)
    local found = T.search_merchant(s.store_name_input)
    if found.error then return { error = "가맹점 검색 실패: " .. found.error } end
    if not found.found then
      return { error = "'" .. s.store_name_input .. "'에 해당하는 가맹점을 찾을 수 없습니다.", store_candidates = {} }
    end
    local ranked = resolver.rank(s.store_name_input, found.merchants)
    local chosen = ranked[1]
    if #ranked > 1 and env.settings.confirm_on_multi then
      local question = clarify_question(s.store_name_input, ranked)
      chosen = nil
      while not chosen do
        local answer = ctx.interrupt { type = "clarify", question = question, candidates = ranked }
        chosen = resolver.pick(answer, ranked)
        if not chosen then
          question = "'" .. tostring(answer) .. "'은(는) 후보 중 하나가 아닙니다.\n" .. clarify_question(s.store_name_input, ranked)
        end
      end
    end
    return { store_candidates = ranked, store_id = chosen.store_id, store = chosen, need_clarify = false }
  end)

  g:add_node("data_collector", function(s)
    local card = T.load_store_data(s.store_id)
    if not card.success then return { error = "카드 데이터 수집 실패: " .. tostring(card.error) } end
    local up = { card_data = card.data }
    local region = T.resolve_region(s.store.district)
    if region.success then
      up.admin_dong_code = region.admin_dong_code
      local area = T.load_area_data(region.admin_dong_code)
      if area.success then up.area_data = area.data end
      local reg = T.load_region_data(region.admin_dong_code)
      if reg.success then up.region_data = reg.data end
    end
    return up
  end)

  g:add_node("feature_builder", function(s)
    local f, err = features.build(s.card_data, s.area_data or nil)
    if not f then return { error = "지표 생성 실패: " .. err } end
    return { signals = f.signals, persona = f.persona, channel_hints = f.channel_hints }
  end)

  for _, intent in ipairs(INTENT_ORDER) do
    g:add_node(_M.INTENT_NODES[intent], strategy_node(intent, env))
  end

  g:add_node("relevance_checker", function(s)
    if not env.settings.enable_relevance_check then
      return { relevance_passed = true, relevance_report = { skipped = true } }
    end
    local report = relevance.run_all_checks(s.raw_response, {
      store_name = s.store.name, brand = s.store.brand, intent = s.intent })
    if report.passed then return { relevance_passed = true, relevance_report = report } end
    return { relevance_passed = false, relevance_report = report, retry_count = (s.retry_count or 0) + 1 }
  end)

  g:add_node("memory", function(s)
    local up = { messages = { { role = "user", content = s.user_query } } }
    if s.error then
      up.messages[2] = { role = "assistant", content = s.error }
      return up
    end
    if s.relevance_passed == false then
      up.error = "관련성 검증 실패(재시도 " .. tostring(env.settings.max_retries) .. "회 후): " ..
        table.concat(s.relevance_report.feedback, "; ")
    end
    up.messages[2] = { role = "assistant", content = s.final_response }
    return up
  end)

  local function ok_or(next_node)
    return function(s) if s.error then return "memory" end return next_node end
  end

  g:add_edge(START, "router")
  g:add_conditional_edges("router", ok_or("store_resolver"), { "store_resolver", "memory" })
  g:add_conditional_edges("store_resolver", ok_or("data_collector"), { "data_collector", "memory" })
  g:add_conditional_edges("data_collector", ok_or("feature_builder"), { "feature_builder", "memory" })
  g:add_conditional_edges("feature_builder", function(s)
    if s.error then return "memory" end
    return _M.INTENT_NODES[s.intent] or "general"
  end, { "sns", "revisit", "issue", "general", "memory" })
  for _, intent in ipairs(INTENT_ORDER) do g:add_edge(_M.INTENT_NODES[intent], "relevance_checker") end
  g:add_conditional_edges("relevance_checker", function(s)
    if s.relevance_passed then return "memory" end
    if (s.retry_count or 0) <= env.settings.max_retries then return _M.INTENT_NODES[s.intent] end
    return "memory"
  end, { "sns", "revisit", "issue", "general", "memory" })
  g:add_edge("memory", END)

  return g:compile {
    name = "marketing", checkpointer = opts.checkpointer,
    recursion_limit = 10 + 2 * (env.settings.max_retries + 1),
  }
end

return _M
