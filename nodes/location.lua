-- location: places for the user's question near the user's location —
-- recycling centres, zero-waste shops, refill stations, scrap dealers.
-- Online: Kakao Local keyword search
--   GET {MOONGRAPH_KAKAO_BASE_URL}/v2/local/search/keyword.json?query=&x=&y=&radius=
--   Authorization: KakaoAK <MOONGRAPH_KAKAO_API_KEY>
-- Offline: the sample places in data/samples/places.json, labelled as samples.
local adapter = require "nodes.lib.adapter"
local korean = require "nodes.lib.korean"
local geo = require "nodes.lib.geo"
local data = require "nodes.lib.data"
local rules = require "nodes.rules.location"

local concat, floor = table.concat, math.floor

local _M = {
  name = "location",
  policy = "fail_open",
  timeout = 5,
  default_base_url = "https://dapi.kakao.com",
}

-- The search keyword and sample category for a question.
function _M.search_target(message)
  local asked = korean.matcher(message)
  for _, r in ipairs(rules.rules) do
    if asked:mentions_any(r.words) then return r.query, r.category end
  end
  return rules.default.query, rules.default.category
end

-- Pure: the request for Kakao keyword search. params: query (required),
-- lat/lon (optional centre), radius (m), size.
function _M.build_request(cfg, params)
  if type(params) ~= "table" or type(params.query) ~= "string" or params.query == "" then
    error("bad argument #2 to 'build_request': table with a non-empty query expected", 2)
  end
  local query = { query = params.query, size = params.size or rules.size }
  if params.lat and params.lon then
    query.x = ("%.6f"):format(params.lon)
    query.y = ("%.6f"):format(params.lat)
    query.radius = math.min(20000, params.radius or rules.radius)
    query.sort = "distance"
  end
  local headers = {}
  if cfg.api_key then headers.Authorization = "KakaoAK " .. cfg.api_key end
  return {
    method = "GET",
    url = cfg.base_url .. "/v2/local/search/keyword.json",
    headers = headers,
    query = query,
    timeout = cfg.timeout or _M.timeout,
  }
end

-- Pure: decoded Kakao response -> list of places.
function _M.parse_response(body)
  local docs = type(body) == "table" and body.documents
  if type(docs) ~= "table" then
    error("location: Kakao response has no documents[] array", 0)
  end
  local out = {}
  for _, d in ipairs(docs) do
    if type(d) == "table" and adapter.str(d.place_name) then
      local road = adapter.str(d.road_address_name)
      out[#out + 1] = {
        name = d.place_name,
        address = adapter.str(d.address_name),
        road_address = road ~= "" and road or nil,
        lon = adapter.num(d.x),
        lat = adapter.num(d.y),
        distance = adapter.num(d.distance),
        phone = (adapter.str(d.phone) or "") ~= "" and d.phone or nil,
        url = adapter.str(d.place_url),
        category = adapter.str(d.category_name),
      }
    end
  end
  return out
end

local function km(m)
  if not m then return nil end
  if m < 1000 then return ("%dm"):format(floor(m + 0.5)) end
  return ("%.1fkm"):format(m / 1000)
end

-- Short Korean list of places.
function _M.summarize(places, heading)
  local lines = { heading }
  for i, p in ipairs(places) do
    local parts = { ("%d. %s"):format(i, p.name) }
    parts[#parts + 1] = " — " .. (p.road_address or p.address or "주소 정보 없음")
    if p.distance then parts[#parts + 1] = (" (약 %s)"):format(km(p.distance)) end
    if p.phone then parts[#parts + 1] = ", ☎ " .. p.phone end
    if p.note then parts[#parts + 1] = " · " .. p.note end
    lines[#lines + 1] = concat(parts)
  end
  return concat(lines, "\n")
end

local function where(point)
  return point and (point.label .. " 근처 ") or ""
end

function _M.offline(message, point, loc_err)
  local doc = data.require("samples/places.json")
  local _, category = _M.search_target(message)
  local found = {}
  for _, p in ipairs(doc.places) do
    if p.category == category then
      local d = point and geo.distance(point.lat, point.lon, p.lat, p.lon) or nil
      local same_area = point and point.sigungu and p.sigungu == point.sigungu
      if not point or same_area or (d and d <= rules.radius * 2) then
        found[#found + 1] = {
          name = p.place_name, address = adapter.str(p.address_name),
          road_address = adapter.str(p.road_address_name), lat = p.lat, lon = p.lon,
          distance = d, phone = adapter.str(p.phone), note = adapter.str(p.note),
          hours = adapter.str(p.hours), sample = true,
        }
      end
    end
  end
  table.sort(found, function(a, b)
    if a.distance and b.distance then return a.distance < b.distance end
    return a.name < b.name
  end)
  while #found > rules.size do table.remove(found) end
  local text
  if #found == 0 then
    text = ("샘플 데이터에는 %s%s 정보가 없습니다. (오프라인이라 실제 장소 검색은 할 수 없습니다)")
      :format(where(point), category)
  else
    text = _M.summarize(found, ("%s%s (샘플 데이터 — 실제 장소가 아닙니다):"):format(where(point), category))
  end
  if not point then
    text = text .. "\n위치를 알려주시면 가까운 곳부터 찾아 드릴게요."
    if loc_err and loc_err ~= "no location" then text = text .. " (" .. loc_err .. ")" end
  end
  return {
    ok = true, source = "sample", sample = true, text = text,
    data = { category = category, places = found, location = point and point.label or nil,
             notice = doc.notice },
  }
end

function _M.run(state, ctx)
  local message = state and state.message or ""
  local point, loc_err = geo.resolve(state and state.user_location)
  local cfg = adapter.config("kakao", ctx, _M.default_base_url)
  if not cfg.online then
    return { contexts = { location = _M.offline(message, point, loc_err) } }
  end
  local keyword = _M.search_target(message)
  local params = { query = keyword }
  if point then
    params.lat, params.lon = point.lat, point.lon
  elseif type(state.user_location) == "string" and state.user_location ~= "" then
    params.query = state.user_location .. " " .. keyword
  end
  local places = _M.parse_response(adapter.fetch("location", _M.build_request(cfg, params)))
  local text
  if #places == 0 then
    text = ("%s'%s' 검색 결과가 없습니다."):format(where(point), keyword)
  else
    text = _M.summarize(places, ("%s%s 검색 결과 (카카오 지도):"):format(where(point), keyword))
  end
  return {
    contexts = {
      location = {
        ok = true, source = "kakao", sample = false, text = text,
        data = { query = params.query, places = places, location = point and point.label or nil },
      },
    },
  }
end

return _M
