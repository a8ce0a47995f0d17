-- The per-intent strategy nodes (SNS / REVISIT / ISSUE / GENERAL): prompt
-- assembly from the node's own prompt (prompts/marketing/<intent>.txt), the
-- base and signals contexts and the question; the draft from the LLM, or
-- offline a template written from the data (labelled as such); then
-- post-processing: badges, action seeds and the disclaimer.

local features = require "scripts.marketing.features"
local prompts = require "moongraph.prompt"

local _M = {}

local pct = features.pct

_M.DISCLAIMER = "※ 본 제안은 제공된 데이터에 근거한 참고용 분석이며, 실제 성과를 보장하지 않습니다."

local function won(n)
  if type(n) ~= "number" then return "-" end
  local man = n / 10000
  local s = string.format("%.0f", man)
  s = s:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", "")
  return s .. "만 원"
end
_M.won = won

-- 182000 -> "182,000" (numbers decoded from JSON may be floats)
local function count(n)
  if type(n) ~= "number" then return "-" end
  local s = string.format("%d", math.floor(n + 0.5))
  return (s:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^(-?),", "%1"))
end
_M.count = count

local function sales_trend(card)
  local s = card.monthly_sales_krw
  if type(s) ~= "table" or #s < 2 then return nil end
  local first, last = s[1], s[#s]
  return { first = first, last = last, change = (last - first) / first, months = #s }
end
_M.sales_trend = sales_trend

--[[ base_context(state) -> text: the store's figures, one per line ]]
function _M.base_context(s)
  local c, st, area, reg = s.card_data, s.store or {}, s.area_data, s.region_data
  local lines = {
    string.format("- 가맹점: %s (%s), %s", tostring(st.name), tostring(st.category), tostring(st.district)),
    "- 기간: " .. tostring(c.period),
  }
  local t = sales_trend(c)
  if t then
    lines[#lines + 1] = string.format("- 월 매출: %s → %s (%d개월 %+.1f%%)", won(t.first), won(t.last), t.months,
      t.change * 100)
  end
  lines[#lines + 1] = string.format("- 객단가 %s, 재방문율 %s, 신규 고객 비중 %s, 배달 비중 %s%s",
    count(c.avg_ticket_krw) .. "원", pct(c.revisit_rate), pct(c.new_customer_share),
    pct(c.delivery_share), (c.proxy_fields and #c.proxy_fields > 0) and " (배달 비중은 추정 지표)" or "")
  if area then
    lines[#lines + 1] = string.format("- 상권: 유동인구 일 %s명, 음식점 %s곳, 음식점 평균 월매출 %s, 음식점 폐업률 %s (%s)",
      count(area.floating_population_daily), count(area.food_stores), won(area.avg_monthly_sales_food_krw),
      pct(area.closure_rate_food or 0), tostring(area.note))
  end
  if reg then
    lines[#lines + 1] = string.format("- 배후 인구: 거주 %s명, 1인 가구 비중 %s, 직장인 %s명",
      count(reg.resident_population), pct(reg.single_household_share or 0), count(reg.office_workers))
  end
  return table.concat(lines, "\n")
end

function _M.signals_context(s)
  if not s.signals or #s.signals == 0 then return "- 특이 신호 없음" end
  local out = {}
  for i, sig in ipairs(s.signals) do out[i] = "- [" .. sig.code .. "] " .. sig.label end
  return table.concat(out, "\n")
end

---------------------------------------------------------------------------
-- offline templates: only the store's own figures, labelled as a template

local function has(s, code)
  for _, sig in ipairs(s.signals or {}) do if sig.code == code then return true end end
  return false
end

local function header(s, title)
  return string.format("%s %s (오프라인 템플릿: LLM 없이 데이터 규칙으로 작성)", s.store.name, title)
end

local templates = {}

function templates.ISSUE(s)
  local c, area = s.card_data, s.area_data
  local out = { header(s, "문제 진단"), "", "1. 핵심 지표", _M.base_context(s), "", "2. 문제와 원인" }
  local t = sales_trend(c)
  if t and t.change < 0 then
    out[#out + 1] = string.format("- 매출 하락: 최근 %d개월 매출이 %.1f%% 감소했습니다.", t.months, -t.change * 100)
  elseif t then
    out[#out + 1] = string.format("- 매출 추세: 최근 %d개월 매출은 %.1f%% 늘었으나 아래 위험 신호를 점검해야 합니다.",
      t.months, t.change * 100)
  end
  if has(s, "RETENTION_ALERT") then
    out[#out + 1] = "- 재방문율 " .. pct(c.revisit_rate) .. ": 단골 전환이 약한 것이 매출 정체의 주요 원인 후보입니다."
  end
  if has(s, "CHANNEL_MIX_ALERT") then
    out[#out + 1] = "- 배달 비중 " .. pct(c.delivery_share) .. ": 수수료 부담이 크고 매장 방문 고객과의 접점이 줄어드는 위험이 있습니다."
  end
  if has(s, "NEW_CUSTOMER_FOCUS") then
    out[#out + 1] = "- 신규 고객 비중 " .. pct(c.new_customer_share) .. ": 첫 방문 고객이 다시 오지 않으면 매출이 흔들릴 수 있습니다."
  end
  if #s.signals == 0 then
    out[#out + 1] = "- 규칙상 위험 신호(재방문율 20% 미만, 배달 비중 50% 이상, 신규 비중 40% 초과)는 없습니다."
  end
  if area and area.avg_monthly_sales_food_krw and t then
    out[#out + 1] = string.format("- 상권 비교: 최근 월 매출 %s은 상권 음식점 평균 %s의 %.0f%% 수준입니다.",
      won(t.last), won(area.avg_monthly_sales_food_krw), t.last / area.avg_monthly_sales_food_krw * 100)
  end
  out[#out + 1] = ""
  out[#out + 1] = "3. 개선 방향: 아래 실행 액션을 우선순위대로 진행하고 매월 같은 지표로 진단을 반복하세요."
  return table.concat(out, "\n")
end

function templates.REVISIT(s)
  local c = s.card_data
  local target = math.max(0.2, math.floor(c.revisit_rate * 100 + 5) / 100)
  local out = { header(s, "재방문 전략"), "", "현재 재방문율은 " .. pct(c.revisit_rate) .. ", 신규 고객 비중은 " ..
    pct(c.new_customer_share) .. "입니다. 목표 재방문율: " .. pct(target) .. ".", "",
    "- 스탬프 적립: 5회 방문 시 메뉴 1개 제공, 첫 방문 때 스탬프 2개를 미리 찍어 다음 방문을 당깁니다.",
    "- 재방문 쿠폰: 결제 후 7일 안에 쓰는 쿠폰으로 두 번째 방문을 유도합니다.",
    "- 단골 멤버십: 월 " .. math.max(2, math.floor(c.revisit_rate * 10)) .. "회 이상 방문 고객에게 피크(" ..
      table.concat(c.peak_hours or {}, "·") .. "시) 외 시간 혜택을 줍니다.",
  }
  if has(s, "CHANNEL_MIX_ALERT") then
    out[#out + 1] = "- 배달 비중이 " .. pct(c.delivery_share) .. "이므로 배달 포장에 매장 재방문 쿠폰을 동봉합니다."
  end
  out[#out + 1] = "- 주 고객(" .. s.persona.summary .. ")에게 맞춘 메시지로 안내합니다."
  return table.concat(out, "\n")
end

function templates.SNS(s)
  local c, p = s.card_data, s.persona
  local ch = s.channel_hints or {}
  local tag = "#" .. (s.store.brand or s.store.name):gsub("%s+", "")
  local out = { header(s, "SNS 전략"), "",
    "주 고객은 " .. p.summary .. "입니다. 신규 고객 비중 " .. pct(c.new_customer_share) .. ", 재방문율 " ..
      pct(c.revisit_rate) .. "을 기준으로 채널과 콘텐츠를 정했습니다.", "",
    "- 채널: " .. (#ch > 0 and table.concat(ch, ", ") or "인스타그램") .. ".",
    "- 콘텐츠: 대표 메뉴 조리 과정 릴스, 단골 고객 후기 게시물, 피크(" ..
      table.concat(p.peak_hours or {}, "·") .. "시) 직전 오늘의 메뉴 게시.",
    "- 해시태그: " .. tag .. " #" .. (s.store.district or ""):match("(%S+)$") .. "맛집 #" ..
      tostring(s.store.category):gsub("[^%w\128-\255]", "") .. ".",
    "- 이벤트: 리뷰 사진 게시 고객에게 다음 방문 혜택을 주어 신규 고객을 재방문으로 잇습니다.",
  }
  return table.concat(out, "\n")
end

function templates.GENERAL(s)
  local c = s.card_data
  local t = sales_trend(c)
  local out = { header(s, "종합 마케팅 전략"), "", "1. 현황", _M.base_context(s), "", "2. 전략" }
  out[#out + 1] = "- 목표 고객: " .. s.persona.summary .. "."
  out[#out + 1] = "- 채널: " .. table.concat(s.channel_hints or {}, ", ") .. "."
  if has(s, "RETENTION_ALERT") then out[#out + 1] = "- 우선 과제: 재방문율 " .. pct(c.revisit_rate) .. " 개선 (쿠폰·스탬프)." end
  if has(s, "CHANNEL_MIX_ALERT") then out[#out + 1] = "- 우선 과제: 배달 비중 " .. pct(c.delivery_share) .. "을 매장 방문으로 분산." end
  if has(s, "NEW_CUSTOMER_FOCUS") then out[#out + 1] = "- 우선 과제: 신규 고객 " .. pct(c.new_customer_share) .. "의 두 번째 방문 유도." end
  if t then
    out[#out + 1] = string.format("- 매출 목표: 최근 월 매출 %s 기준 다음 분기 %s.", won(t.last),
      t.change < 0 and "하락 멈춤" or "성장 유지")
  end
  out[#out + 1] = ""
  out[#out + 1] = "3. 실행: 이번 달에는 아래 실행 액션의 1번을, 다음 달에는 2번을 시작하고 매월 지표를 비교합니다."
  return table.concat(out, "\n")
end

_M.templates = templates

---------------------------------------------------------------------------
-- post-processing

--[[ action_seeds(state) -> list of {title, detail, kpi} (at most 4) ]]
function _M.action_seeds(s)
  local c = s.card_data
  local out = {}
  local function add(title, detail, kpi) if #out < 4 then out[#out + 1] = { title = title, detail = detail, kpi = kpi } end end
  if has(s, "RETENTION_ALERT") then
    add("재방문 쿠폰·스탬프 도입", "두 번째 방문에 쓰는 7일 쿠폰과 스탬프 적립", "재방문율 " .. pct(c.revisit_rate) .. " → 20% 이상")
  end
  if has(s, "CHANNEL_MIX_ALERT") then
    add("매장 방문 전환", "배달 포장에 매장 방문 할인 쿠폰 동봉", "배달 비중 " .. pct(c.delivery_share) .. " → 50% 미만")
  end
  if has(s, "NEW_CUSTOMER_FOCUS") then
    add("신규 고객 두 번째 방문 유도", "첫 결제 고객에게 다음 방문 혜택 안내", "신규 고객 중 재방문 비율")
  end
  local base = {
    SNS = { "주 3회 SNS 게시", "릴스 1회·게시물 2회, 피크 직전 게시", "게시물 도달·저장 수" },
    REVISIT = { "단골 멤버십 운영", "월 방문 횟수 기준 등급과 혜택", "재방문율" },
    ISSUE = { "월간 지표 점검", "매출·재방문율·배달 비중을 매월 같은 방식으로 비교", "지표 개선 추세" },
    GENERAL = { "월간 실행 캘린더", "이번 달·다음 달 과제와 담당자 정리", "월 매출" },
  }
  local b = base[s.intent] or base.GENERAL
  add(b[1], b[2], b[3])
  return out
end

function _M.clean_response(text)
  local t = tostring(text or ""):gsub("\r\n", "\n"):gsub("^%s+", ""):gsub("%s+$", "")
  t = t:gsub("\n\n\n+", "\n\n")
  return t
end

--[[ badges(state, offline) -> list of badge strings ]]
function _M.badges(s, offline)
  local b = {}
  if s.card_data and s.card_data.sample then b[#b + 1] = "[샘플 데이터]" end
  if s.card_data and s.card_data.proxy_fields and #s.card_data.proxy_fields > 0 then
    b[#b + 1] = "[프록시 지표: 배달 비중 추정]"
  end
  if s.card_data and s.card_data.period then b[#b + 1] = "[기준 데이터: 카드 " .. s.card_data.period .. "]" end
  if offline then b[#b + 1] = "[오프라인 템플릿]" end
  return b
end

--[[ postprocess(raw, state, offline) -> final_response, actions ]]
function _M.postprocess(raw, s, offline)
  local actions = _M.action_seeds(s)
  local parts = { table.concat(_M.badges(s, offline), " "), "", _M.clean_response(raw), "", "실행 액션" }
  for i, a in ipairs(actions) do
    parts[#parts + 1] = string.format("%d. %s — %s (KPI: %s)", i, a.title, a.detail, a.kpi)
  end
  parts[#parts + 1] = ""
  parts[#parts + 1] = _M.DISCLAIMER
  return table.concat(parts, "\n"), actions
end

---------------------------------------------------------------------------
-- prompts

--[[ prompt(intent, state) -> text of prompts/marketing/<intent>.txt filled
in; raises when the template cannot be read or names an unknown value ]]
function _M.prompt(intent, s)
  local fb = ""
  if s.relevance_report and s.relevance_report.feedback and #s.relevance_report.feedback > 0 then
    fb = "\n[이전 초안의 품질 검증 실패 — 반드시 고치세요]\n- " .. table.concat(s.relevance_report.feedback, "\n- ")
  end
  local vars = {
    store_name = s.store.name, base_context = _M.base_context(s), signals_context = _M.signals_context(s),
    persona = s.persona and s.persona.summary or "", user_query = s.user_query,
    channel_hints = table.concat(s.channel_hints or {}, ", "), feedback = fb,
  }
  local text, err = prompts.file("marketing/" .. intent:lower() .. ".txt", vars)
  if not text then error("marketing: " .. err, 0) end
  return text
end

return _M
