-- KMA forecast grid: Lambert conformal conic projection used by the Korea
-- Meteorological Administration's short-term forecast (5 km grid, standard
-- parallels 30N and 60N, origin 38N 126E at grid point (43, 136)).
local math = math
local floor, pi, tan, cos, sin, log, atan, sqrt, abs =
  math.floor, math.pi, math.tan, math.cos, math.sin, math.log, math.atan, math.sqrt, math.abs

local _M = {}

_M.params = {
  earth_radius = 6371.00877, -- km
  grid = 5.0,                -- km
  slat1 = 30.0, slat2 = 60.0,
  olon = 126.0, olat = 38.0,
  xo = 43, yo = 136,
}

local DEG = pi / 180

local function constants(p)
  local re = p.earth_radius / p.grid
  local slat1, slat2 = p.slat1 * DEG, p.slat2 * DEG
  local olon, olat = p.olon * DEG, p.olat * DEG
  local sn = log(cos(slat1) / cos(slat2)) /
             log(tan(pi * 0.25 + slat2 * 0.5) / tan(pi * 0.25 + slat1 * 0.5))
  local sf = tan(pi * 0.25 + slat1 * 0.5) ^ sn * cos(slat1) / sn
  local ro = re * sf / tan(pi * 0.25 + olat * 0.5) ^ sn
  return re, sn, sf, ro, olon
end

local function check(v, name, lo, hi, fname)
  if type(v) ~= "number" or v ~= v or v < lo or v > hi then
    error(("bad argument %s to '%s': number in [%g, %g] expected, got %s"):format(
      name, fname, lo, hi, tostring(v)), 3)
  end
end

-- Latitude/longitude (degrees) -> grid nx, ny (integers).
function _M.to_grid(lat, lon)
  check(lat, "#1 (lat)", -89.9, 89.9, "to_grid")
  check(lon, "#2 (lon)", -180, 180, "to_grid")
  local p = _M.params
  local re, sn, sf, ro, olon = constants(p)
  local ra = re * sf / tan(pi * 0.25 + lat * DEG * 0.5) ^ sn
  local theta = lon * DEG - olon
  if theta > pi then theta = theta - 2 * pi end
  if theta < -pi then theta = theta + 2 * pi end
  theta = theta * sn
  local x = floor(ra * sin(theta) + p.xo + 0.5)
  local y = floor(ro - ra * cos(theta) + p.yo + 0.5)
  return x, y
end

-- Grid nx, ny -> latitude/longitude (degrees) of the grid point.
function _M.to_latlon(nx, ny)
  check(nx, "#1 (nx)", -1000, 1000, "to_latlon")
  check(ny, "#2 (ny)", -1000, 1000, "to_latlon")
  local p = _M.params
  local re, sn, sf, ro, olon = constants(p)
  local xn = nx - p.xo
  local yn = ro - ny + p.yo
  local ra = sqrt(xn * xn + yn * yn)
  if sn < 0 then ra = -ra end
  local alat = 2 * atan((re * sf / ra) ^ (1 / sn)) - pi * 0.5
  local theta
  if abs(xn) <= 0 then
    theta = 0
  elseif abs(yn) <= 0 then
    theta = pi * 0.5
    if xn < 0 then theta = -theta end
  else
    theta = atan(xn, yn)
  end
  local alon = theta / sn + olon
  return alat / DEG, alon / DEG
end

return _M
