-- The feature builder: signals, persona and channel hints from the store's
-- card data (and its area data when there is some).

local rules = require "scripts.marketing.rules"

local _M = {}

local OPS = {
  ["<"] = function(a, b) return a < b end,
  ["<="] = function(a, b) return a <= b end,
  [">"] = function(a, b) return a > b end,
  [">="] = function(a, b) return a >= b end,
}

local function pct(x) return string.format("%.1f%%", x * 100) end
_M.pct = pct

local function top(map)
  local best, bv = nil, -1
  local keys = {}
  for k in pairs(map or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if map[k] > bv then best, bv = k, map[k] end
  end
  return best, bv
end

--[[ build(card [, area] [, r]) -> {signals, persona, channel_hints} | nil, err
signals: list of {code, label, value} in the order RETENTION_ALERT,
CHANNEL_MIX_ALERT, NEW_CUSTOMER_FOCUS for those whose rule holds. ]]
function _M.build(card, area, r)
  r = r or rules
  if type(card) ~= "table" then return nil, "no card data" end
  for _, f in ipairs { "revisit_rate", "delivery_share", "new_customer_share" } do
    if type(card[f]) ~= "number" then return nil, "card data lacks " .. f end
  end
  local signals = {}
  for _, code in ipairs { "RETENTION_ALERT", "CHANNEL_MIX_ALERT", "NEW_CUSTOMER_FOCUS" } do
    local rule = r.signals[code]
    local v = card[rule.field]
    if OPS[rule.op](v, rule.value) then
      signals[#signals + 1] = { code = code, label = rule.label .. " (" .. pct(v) .. ")", value = v }
    end
  end
  local age, age_share = top(card.customer_age)
  local gender, gender_share = top(card.gender)
  local persona = {
    main_age = age, main_age_share = age_share, main_gender = gender, main_gender_share = gender_share,
    peak_hours = card.peak_hours or {},
    summary = string.format("%s %s 중심 (%s 고객이 %s, %s 고객이 %s)%s", tostring(age), tostring(gender),
      tostring(age), pct(age_share), tostring(gender), pct(gender_share),
      card.peak_hours and #card.peak_hours > 0 and (", 피크 " .. table.concat(card.peak_hours, "·") .. "시") or ""),
  }
  local hints = {}
  for _, h in ipairs(r.channels_by_age[age] or {}) do hints[#hints + 1] = h end
  if card.delivery_share >= r.signals.CHANNEL_MIX_ALERT.value then
    hints[#hints + 1] = "배달앱 리뷰·사진 관리"
  end
  if area and area.busiest_time then
    hints[#hints + 1] = "상권 혼잡 시간(" .. area.busiest_time .. "시) 전 노출"
  end
  return { signals = signals, persona = persona, channel_hints = hints }
end

return _M
