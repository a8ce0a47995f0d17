-- User locations: a Korean address string ("서울특별시 강남구", "부산 해운대구")
-- or a coordinate table ({lat=, lon=} or {lat, lon}) resolved to a point with
-- a label, using the district table in data/districts.json.
local data = require "nodes.lib.data"
local math = math

local _M = {}

local function areas()
  return data.require("districts.json").areas
end

local function find_sido(s)
  local best, best_pos, best_len
  for _, a in ipairs(areas()) do
    if not a.sigungu then
      local names = { a.sido }
      for _, al in ipairs(a.aliases or {}) do names[#names + 1] = al end
      for _, n in ipairs(names) do
        local pos = s:find(n, 1, true)
        if pos and (not best or pos < best_pos or (pos == best_pos and #n > best_len)) then
          best, best_pos, best_len = a, pos, #n
        end
      end
    end
  end
  return best
end

-- Address string -> area entry {sido, sigungu?, lat, lon} or nil.
-- A 시·군·구 name inside the named 시·도 wins; a 시·군·구 alone picks the
-- first listed match; a 시·도 alone gives its representative point.
function _M.lookup(s)
  if type(s) ~= "string" then
    error("bad argument #1 to 'lookup': string expected, got " .. type(s), 2)
  end
  local sido = find_sido(s)
  local compact = s:gsub("%s+", "")
  for _, a in ipairs(areas()) do
    if a.sigungu and (not sido or a.sido == sido.sido) then
      if compact:find(a.sigungu, 1, true) then
        return a
      end
    end
  end
  return sido
end

local function num(v) return type(v) == "number" and v == v end

-- Any accepted user_location -> { lat, lon, label, sido?, sigungu? } or nil, err.
function _M.resolve(loc)
  if loc == nil then return nil, "no location" end
  if type(loc) == "string" then
    local a = _M.lookup(loc)
    if not a then return nil, ("unknown location '%s'"):format(loc) end
    local label = a.sigungu and (a.sido .. " " .. a.sigungu) or a.sido
    return { lat = a.lat, lon = a.lon, label = label, sido = a.sido, sigungu = a.sigungu }
  end
  if type(loc) == "table" then
    local lat = loc.lat or loc.latitude or loc[1]
    local lon = loc.lon or loc.lng or loc.longitude or loc[2]
    if num(lat) and num(lon) and lat >= -90 and lat <= 90 and lon >= -180 and lon <= 180 then
      return { lat = lat, lon = lon, label = ("위도 %.4f, 경도 %.4f"):format(lat, lon) }
    end
    return nil, "location table needs numeric lat and lon"
  end
  return nil, "location must be an address string or a {lat, lon} table, got " .. type(loc)
end

-- Great-circle distance in metres.
function _M.distance(lat1, lon1, lat2, lon2)
  local r = 6371000
  local rad = math.pi / 180
  local dlat, dlon = (lat2 - lat1) * rad, (lon2 - lon1) * rad
  local a = math.sin(dlat / 2) ^ 2 + math.cos(lat1 * rad) * math.cos(lat2 * rad) * math.sin(dlon / 2) ^ 2
  return 2 * r * math.asin(math.min(1, math.sqrt(a)))
end

return _M
