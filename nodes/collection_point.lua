-- collection_point: where the special bins are — clothes, used batteries,
-- fluorescent lamps, old medicine, cooking oil, small appliances, cartons.
-- Online (contract in docs/adapters.md):
--   GET {MOONGRAPH_COLLECTION_POINT_BASE_URL}/v1/collection-points?type=&lat=&lon=&radius=&address=
--   Authorization: Bearer <MOONGRAPH_COLLECTION_POINT_API_KEY>
-- Offline: data/samples/collection_points.json, labelled as samples.
local adapter = require "nodes.lib.adapter"
local korean = require "nodes.lib.korean"
local geo = require "nodes.lib.geo"
local data = require "nodes.lib.data"

local concat, floor = table.concat, math.floor

local _M = {
  name = "collection_point",
  policy = "fail_open",
  timeout = 5,
  radius = 2000,
  size = 5,
  -- order in which bin types are tried when detecting them in a question
  type_order = { "battery", "lamp", "medicine", "cooking_oil", "paper_pack", "small_appliance", "clothes" },
}

local function sample()
  return data.require("samples/collection_points.json")
end

-- Bin types the question mentions (keys of the sample's types table).
function _M.detect(message)
  local asked = korean.matcher(message)
  local types = sample().types
  local out = {}
  for _, t in ipairs(_M.type_order) do
    if asked:mentions_any(types[t].keywords) then out[#out + 1] = t end
  end
  return out
end

-- Pure: the collection-point request.
function _M.build_request(cfg, params)
  local q = { type = params.type, address = params.address, radius = params.radius or _M.radius }
  if params.lat and params.lon then
    q.lat = ("%.6f"):format(params.lat)
    q.lon = ("%.6f"):format(params.lon)
  end
  return adapter.json_get(cfg, "/v1/collection-points", q, _M.timeout)
end

-- Pure: decoded response -> list of {name, type, address, lat, lon, distance, note}.
function _M.parse_response(body)
  local pts = type(body) == "table" and body.points
  if type(pts) ~= "table" then
    error("collection_point: response has no points[] array", 0)
  end
  local out = {}
  for _, p in ipairs(pts) do
    if type(p) == "table" and adapter.str(p.name) then
      out[#out + 1] = {
        name = p.name, type = adapter.str(p.type), address = adapter.str(p.address),
        lat = adapter.num(p.lat), lon = adapter.num(p.lon), distance = adapter.num(p.distance),
        note = adapter.str(p.note),
      }
    end
  end
  return out
end

local function dist(m)
  if not m then return "" end
  if m < 1000 then return (" (약 %dm)"):format(floor(m + 0.5)) end
  return (" (약 %.1fkm)"):format(m / 1000)
end

function _M.summarize(points, heading, types)
  local lines = { heading }
  for i, p in ipairs(points) do
    local tname = types and types[p.type] and types[p.type].name or p.type or ""
    lines[#lines + 1] = ("%d. [%s] %s — %s%s%s"):format(i, tname, p.name, p.address or "주소 정보 없음",
      dist(p.distance), p.note and (" · " .. p.note) or "")
  end
  return concat(lines, "\n")
end

local function rules_text(types, wanted)
  local lines = {}
  for _, t in ipairs(wanted) do
    local info = types[t]
    lines[#lines + 1] = ("%s: %s (넣지 않는 것: %s)"):format(info.name, info.accepts, info.rejects)
  end
  return concat(lines, "\n")
end

function _M.offline(message, point, loc_err)
  local doc = sample()
  local wanted = _M.detect(message)
  local want = {}
  for _, t in ipairs(wanted) do want[t] = true end
  local found = {}
  for _, p in ipairs(doc.points) do
    if #wanted == 0 or want[p.type] then
      local d = point and geo.distance(point.lat, point.lon, p.lat, p.lon) or nil
      local same = point and point.sigungu and p.sigungu == point.sigungu
      if not point or same or (d and d <= _M.radius) then
        found[#found + 1] = { name = p.name, type = p.type, address = p.address, lat = p.lat,
                              lon = p.lon, distance = d, note = adapter.str(p.note), sample = true }
      end
    end
  end
  table.sort(found, function(a, b)
    if a.distance and b.distance and a.distance ~= b.distance then return a.distance < b.distance end
    return a.name < b.name
  end)
  while #found > _M.size do table.remove(found) end
  local kinds = {}
  for _, t in ipairs(wanted) do kinds[#kinds + 1] = doc.types[t].name end
  local what = #kinds > 0 and concat(kinds, "·") or "수거함"
  local where = point and (point.label .. " 근처 ") or ""
  local text
  if #found == 0 then
    text = ("샘플 데이터에는 %s%s 위치가 없습니다. (오프라인이라 실제 위치 검색은 할 수 없습니다)"):format(where, what)
  else
    text = _M.summarize(found, ("%s%s (샘플 데이터 — 실제 설치 위치가 아닙니다):"):format(where, what), doc.types)
  end
  if #wanted > 0 then text = text .. "\n" .. rules_text(doc.types, wanted) end
  if not point then
    text = text .. "\n위치를 알려주시면 가까운 수거함부터 찾아 드릴게요."
    if loc_err and loc_err ~= "no location" then text = text .. " (" .. loc_err .. ")" end
  end
  return {
    ok = true, source = "sample", sample = true, text = text,
    data = { types = wanted, points = found, location = point and point.label or nil, notice = doc.notice },
  }
end

function _M.run(state, ctx)
  local message = state and state.message or ""
  local point, loc_err = geo.resolve(state and state.user_location)
  local cfg = adapter.config("collection_point", ctx, nil)
  if not cfg.online then
    return { contexts = { collection_point = _M.offline(message, point, loc_err) } }
  end
  local wanted = _M.detect(message)
  local params = { type = wanted[1] }
  if point then params.lat, params.lon = point.lat, point.lon end
  if type(state.user_location) == "string" then params.address = state.user_location end
  local points = _M.parse_response(adapter.fetch("collection_point", _M.build_request(cfg, params)))
  local types = sample().types
  local where = point and (point.label .. " 근처 ") or ""
  local what = wanted[1] and types[wanted[1]].name or "수거함"
  local text = #points > 0 and _M.summarize(points, ("%s%s:"):format(where, what), types)
    or ("%s%s 위치를 찾지 못했습니다."):format(where, what)
  return {
    contexts = {
      collection_point = {
        ok = true, source = "collection_point", sample = false, text = text,
        data = { types = wanted, points = points, location = point and point.label or nil },
      },
    },
  }
end

return _M
