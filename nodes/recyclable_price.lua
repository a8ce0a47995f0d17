-- recyclable_price: what scrap paper, metal, cans and PET fetch per kg.
-- Online (contract in docs/adapters.md):
--   GET {MOONGRAPH_RECYCLABLE_PRICE_BASE_URL}/v1/recyclable-prices?item=&region=
--   Authorization: Bearer <MOONGRAPH_RECYCLABLE_PRICE_API_KEY>
-- Offline: data/samples/recyclable_prices.json (sample values with a date).
local adapter = require "nodes.lib.adapter"
local korean = require "nodes.lib.korean"
local geo = require "nodes.lib.geo"
local data = require "nodes.lib.data"

local concat = table.concat

local _M = {
  name = "recyclable_price",
  policy = "fail_open",
  timeout = 5,
}

local function sample()
  return data.require("samples/recyclable_prices.json")
end

-- Price rows of the sample vocabulary the question mentions.
function _M.detect(message)
  local asked = korean.matcher(message)
  local out = {}
  for _, p in ipairs(sample().prices) do
    if asked:mentions_any(p.aliases) then out[#out + 1] = p end
  end
  return out
end

-- Pure: the price request.
function _M.build_request(cfg, item, region)
  return adapter.json_get(cfg, "/v1/recyclable-prices", { item = item, region = region }, _M.timeout)
end

-- Pure: decoded response -> { as_of, region, prices = {{item, grade, price, unit}} }.
function _M.parse_response(body)
  local prices = type(body) == "table" and body.prices
  if type(prices) ~= "table" then
    error("recyclable_price: response has no prices[] array", 0)
  end
  local out = {}
  for _, p in ipairs(prices) do
    if type(p) == "table" and adapter.str(p.item) and adapter.num(p.price) then
      out[#out + 1] = {
        item = p.item, grade = adapter.str(p.grade), price = adapter.num(p.price),
        unit = adapter.str(p.unit) or adapter.str(body.unit) or "원/kg",
      }
    end
  end
  return { as_of = adapter.str(body.as_of), region = adapter.str(body.region), prices = out }
end

-- 1200 -> "1,200"
function _M.commas(n)
  local s = tostring(math.floor(n))
  local k
  repeat s, k = s:gsub("^(%d+)(%d%d%d)", "%1,%2") until k == 0
  return s
end

function _M.summarize(prices, heading, tips)
  local lines = { heading }
  for _, p in ipairs(prices) do
    lines[#lines + 1] = ("- %s%s: %s%s"):format(p.item, p.grade and (" (" .. p.grade .. ")") or "",
      _M.commas(p.price), p.unit)
  end
  if tips and #tips > 0 then lines[#lines + 1] = "참고: " .. concat(tips, " ") end
  return concat(lines, "\n")
end

function _M.offline(message)
  local doc = sample()
  local rows = _M.detect(message)
  local matched = #rows > 0
  if not matched then rows = doc.prices end
  local prices = {}
  for i, p in ipairs(rows) do
    prices[i] = { item = p.item, grade = p.grade, price = p.price, unit = p.unit, note = p.note }
  end
  local heading = ("재활용 자원 시세 (샘플 값 — 실제 시세가 아닙니다, 기준일 %s, %s):"):format(doc.as_of, doc.basis)
  return {
    ok = true, source = "sample", sample = true,
    text = _M.summarize(prices, heading, doc.tips),
    data = { as_of = doc.as_of, prices = prices, matched = matched, notice = doc.notice, tips = doc.tips },
  }
end

function _M.run(state, ctx)
  local message = state and state.message or ""
  local cfg = adapter.config("recyclable_price", ctx, nil)
  if not cfg.online then
    return { contexts = { recyclable_price = _M.offline(message) } }
  end
  local point = geo.resolve(state and state.user_location)
  local rows = _M.detect(message)
  local req = _M.build_request(cfg, rows[1] and rows[1].item or nil, point and point.sido or nil)
  local res = _M.parse_response(adapter.fetch("recyclable_price", req))
  local heading = ("재활용 자원 시세 (%s%s):"):format(res.region or "전국",
    res.as_of and (", " .. res.as_of .. " 기준") or "")
  local text = #res.prices > 0 and _M.summarize(res.prices, heading)
    or "재활용 시세 서비스에 해당 품목의 가격이 없습니다."
  return {
    contexts = {
      recyclable_price = {
        ok = true, source = "recyclable_price", sample = false, text = text,
        data = { as_of = res.as_of, region = res.region, prices = res.prices },
      },
    },
  }
end

return _M
