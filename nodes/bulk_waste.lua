-- bulk_waste: how to put out large items (furniture, mattresses) and what
-- it costs; large appliances go to the free pickup instead.
-- Online (contract in docs/adapters.md):
--   GET {MOONGRAPH_BULK_WASTE_BASE_URL}/v1/bulk-waste/fees?district=&item=
--   Authorization: Bearer <MOONGRAPH_BULK_WASTE_API_KEY>
-- Offline: data/samples/bulk_waste_fees.json (a sample district's fees).
local adapter = require "nodes.lib.adapter"
local korean = require "nodes.lib.korean"
local geo = require "nodes.lib.geo"
local data = require "nodes.lib.data"

local concat = table.concat

local _M = {
  name = "bulk_waste",
  policy = "fail_open",
  timeout = 5,
}

local function sample()
  return data.require("samples/bulk_waste_fees.json")
end

-- Item names (from the sample vocabulary) the question mentions, in order,
-- and whether it mentions a free-pickup appliance.
function _M.detect(message)
  local asked = korean.matcher(message)
  local doc = sample()
  local items, seen = {}, {}
  for _, f in ipairs(doc.fees) do
    if not seen[f.item] and asked:mentions_any(f.aliases) then
      seen[f.item] = true
      items[#items + 1] = f.item
    end
  end
  local appliances = {}
  for _, a in ipairs(doc.free_pickup.items) do
    if asked:mentions(a) then appliances[#appliances + 1] = a end
  end
  return items, appliances
end

-- Pure: the fee request.
function _M.build_request(cfg, district, item)
  return adapter.json_get(cfg, "/v1/bulk-waste/fees", { district = district, item = item }, _M.timeout)
end

-- Pure: decoded response -> { district, as_of, fees = {{item, spec, fee}}, how_to_apply, apply_url }.
function _M.parse_response(body)
  local fees = type(body) == "table" and body.fees
  if type(fees) ~= "table" then
    error("bulk_waste: response has no fees[] array", 0)
  end
  local out = {}
  for _, f in ipairs(fees) do
    if type(f) == "table" and adapter.str(f.item) and adapter.num(f.fee) then
      out[#out + 1] = { item = f.item, spec = adapter.str(f.spec), fee = adapter.num(f.fee) }
    end
  end
  local how = {}
  if type(body.how_to_apply) == "table" then
    for _, s in ipairs(body.how_to_apply) do if adapter.str(s) then how[#how + 1] = s end end
  end
  return {
    district = adapter.str(body.district), as_of = adapter.str(body.as_of), fees = out,
    how_to_apply = how, apply_url = adapter.str(body.apply_url),
  }
end

local function won(n)
  local s = tostring(math.floor(n))
  repeat
    local k
    s, k = s:gsub("^(%d+)(%d%d%d)", "%1,%2")
  until k == 0
  return s .. "원"
end

function _M.summarize(res, heading, appliances, free)
  local lines = { heading }
  for _, f in ipairs(res.fees) do
    lines[#lines + 1] = ("- %s%s: %s"):format(f.item, f.spec and (" (" .. f.spec .. ")") or "", won(f.fee))
  end
  if #res.how_to_apply > 0 then
    lines[#lines + 1] = "신고 방법: " .. concat(res.how_to_apply, " ")
  end
  if res.apply_url then lines[#lines + 1] = "신고: " .. res.apply_url end
  if #appliances > 0 and free then
    lines[#lines + 1] = ("%s 같은 가전은 %s(☎ %s, %s)로 무료 배출할 수 있습니다: %s")
      :format(concat(appliances, ", "), free.name, free.phone, free.url, free.rule)
  end
  return concat(lines, "\n")
end

local COMMON = { ["소파"] = true, ["침대 프레임"] = true, ["매트리스"] = true, ["장롱"] = true, ["책상"] = true }

function _M.offline(message, point)
  local doc = sample()
  local items, appliances = _M.detect(message)
  local wanted = {}
  for _, i in ipairs(items) do wanted[i] = true end
  local fees = {}
  for _, f in ipairs(doc.fees) do
    if (#items > 0 and wanted[f.item]) or (#items == 0 and #appliances == 0 and COMMON[f.item]) then
      fees[#fees + 1] = { item = f.item, spec = f.spec, fee = f.fee }
    end
  end
  local res = { fees = fees, how_to_apply = doc.how_to_apply }
  local heading = ("대형폐기물 수수료 (샘플 데이터 — %s 기준 예시이며 실제 수수료가 아닙니다%s):")
    :format(doc.district, point and (", " .. point.label .. " 수수료는 구청에서 확인하세요") or "")
  return {
    ok = true, source = "sample", sample = true,
    text = _M.summarize(res, heading, appliances, doc.free_pickup),
    data = { district = doc.district, as_of = doc.as_of, fees = fees, items = items,
             appliances = appliances, free_pickup = doc.free_pickup,
             how_to_apply = doc.how_to_apply, notice = doc.notice },
  }
end

function _M.run(state, ctx)
  local message = state and state.message or ""
  local point = geo.resolve(state and state.user_location)
  local cfg = adapter.config("bulk_waste", ctx, nil)
  if not cfg.online then
    return { contexts = { bulk_waste = _M.offline(message, point) } }
  end
  local items, appliances = _M.detect(message)
  local district = point and point.label
    or (type(state.user_location) == "string" and state.user_location) or nil
  local req = _M.build_request(cfg, district, items[1])
  local res = _M.parse_response(adapter.fetch("bulk_waste", req))
  local heading = ("대형폐기물 수수료 (%s%s):"):format(res.district or district or "지역 미지정",
    res.as_of and (", " .. res.as_of .. " 기준") or "")
  local free = sample().free_pickup
  return {
    contexts = {
      bulk_waste = {
        ok = true, source = "bulk_waste", sample = false,
        text = _M.summarize(res, heading, appliances, free),
        data = { district = res.district or district, as_of = res.as_of, fees = res.fees,
                 items = items, appliances = appliances, how_to_apply = res.how_to_apply,
                 apply_url = res.apply_url, free_pickup = free },
      },
    },
  }
end

_M.won = won
return _M
