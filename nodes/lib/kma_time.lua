-- Release-time rule of the KMA short-term forecast (getVilageFcst): a
-- forecast is issued eight times a day at 02, 05, 08, 11, 14, 17, 20 and 23
-- KST and becomes available ten minutes later. The base_date/base_time to
-- ask for is the latest issue already available at the given moment; before
-- 02:10 that is the previous day's 2300 issue.
local os, floor = os, math.floor

local _M = {}

_M.release_hours = { 2, 5, 8, 11, 14, 17, 20, 23 }
_M.available_after_min = 10
_M.kst_offset = 9 * 3600

-- Wall-clock fields in KST for a Unix timestamp (seconds).
function _M.kst(epoch)
  if type(epoch) ~= "number" then
    error("bad argument #1 to 'kst': number (Unix seconds) expected, got " .. type(epoch), 2)
  end
  return os.date("!*t", floor(epoch) + _M.kst_offset)
end

-- "HH00" of each hour 0..23, and ymd's "YYYYMMDD" of a four-digit year as
-- one integer's digits: no string.format call each.
local HH00 = {}
for h = 0, 23 do HH00[h] = ("%02d00"):format(h) end

local function ymd(t)
  local y = t.year
  if y >= 1000 and y <= 9999 then return (y * 10000 + t.month * 100 + t.day) .. "" end
  return ("%04d%02d%02d"):format(y, t.month, t.day)
end

-- Unix timestamp -> base_date "YYYYMMDD", base_time "HHMM" (both KST).
function _M.base(epoch)
  if type(epoch) ~= "number" then
    error("bad argument #1 to 'base': number (Unix seconds) expected, got " .. type(epoch), 2)
  end
  local t = _M.kst(epoch)
  local minutes = t.hour * 60 + t.min
  local chosen
  local hours, after = _M.release_hours, _M.available_after_min
  for i = 1, #hours do
    local h = hours[i]
    if minutes >= h * 60 + after then chosen = h end
  end
  if not chosen then
    return ymd(_M.kst(epoch - 86400)), "2300"
  end
  return ymd(t), HH00[chosen] or ("%02d00"):format(chosen)
end

-- Unix timestamp -> "YYYYMMDD", "HH00" of the current KST hour, the key used
-- to pick the forecast slot that covers "now".
function _M.slot(epoch)
  local t = _M.kst(epoch)
  return ymd(t), HH00[t.hour]
end

-- KST wall-clock fields -> Unix timestamp (for callers and specs that think
-- in Korean local time). Fields: year, month, day, hour, min (sec optional).
function _M.epoch_from_kst(t)
  if type(t) ~= "table" or not (t.year and t.month and t.day) then
    error("bad argument #1 to 'epoch_from_kst': table with year, month, day expected", 2)
  end
  -- days since 1970-01-01 for a proleptic Gregorian date (civil-from-days inverse)
  local y, m, d = t.year, t.month, t.day
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
  local days = era * 146097 + doe - 719468
  return days * 86400 + (t.hour or 0) * 3600 + (t.min or 0) * 60 + (t.sec or 0) - _M.kst_offset
end

return _M
