-- weather: today's short-term forecast at the user's location and a
-- disposal tip for it (rain: keep paper dry; heat: empty food waste often).
-- Online: KMA getVilageFcst
--   GET {MOONGRAPH_KMA_BASE_URL}/getVilageFcst?serviceKey=&pageNo=&numOfRows=
--       &dataType=JSON&base_date=&base_time=&nx=&ny=
-- Offline the forecast cannot be known: the node says it is unavailable.
local adapter = require "nodes.lib.adapter"
local geo = require "nodes.lib.geo"
local grid = require "nodes.lib.grid"
local kma_time = require "nodes.lib.kma_time"
local tips = require "nodes.rules.weather_tips"

local concat, os = table.concat, os
local str = adapter.str

local _M = {
  name = "weather",
  policy = "fail_open",
  timeout = 5,
  default_base_url = "https://apis.data.go.kr/1360000/VilageFcstInfoService_2.0",
  default_location = "서울특별시",
  rows = 300, -- 12 categories x 24 hours covers the rest of today from any issue
  hourly_categories = 12, -- rows per forecast hour (TMN and TMX come once a day)
}

_M.sky_names = { ["1"] = "맑음", ["3"] = "구름많음", ["4"] = "흐림" }
_M.pty_names = { ["0"] = "강수 없음", ["1"] = "비", ["2"] = "비 또는 눈", ["3"] = "눈", ["4"] = "소나기" }

-- Pure: the getVilageFcst request. params: nx, ny, base_date, base_time, rows.
function _M.build_request(cfg, params)
  for _, k in ipairs({ "nx", "ny", "base_date", "base_time" }) do
    if params[k] == nil then
      error("bad argument #2 to 'build_request': missing " .. k, 2)
    end
  end
  return {
    method = "GET",
    url = cfg.base_url .. "/getVilageFcst",
    headers = {},
    query = {
      serviceKey = cfg.api_key,
      pageNo = 1,
      numOfRows = params.rows or _M.rows,
      dataType = "JSON",
      base_date = params.base_date,
      base_time = params.base_time,
      nx = params.nx,
      ny = params.ny,
    },
    timeout = cfg.timeout or _M.timeout,
  }
end

-- Pure: the rows to ask for so that the forecast of issue base_date/base_time
-- reaches the end of the KST day of now_epoch: 12 per forecast hour from the
-- hour after the issue (0000 for the previous day's 2300 issue) through
-- 2300, plus TMN and TMX; one hour's rows when the day has no hour left (the
-- 2300 issue: the summary then shows the first hour of tomorrow).
-- KMA lists the items hour by hour, so these rows are the rest of today.
function _M.rows_for(base_date, base_time, now_epoch)
  local today = kma_time.slot(now_epoch)
  local first = 0
  if base_date >= today then first = tonumber(base_time:sub(1, 2)) + 1 end
  local hours = 24 - first
  if hours < 1 then hours = 1 end
  return hours * _M.hourly_categories + 2
end

-- The items list of a decoded KMA response (checked: header, resultCode,
-- response.body.items.item[]), as KMA sent them.
local function items_of(body)
  local resp = type(body) == "table" and body.response
  local header = type(resp) == "table" and resp.header
  if type(header) ~= "table" then
    error("weather: KMA response has no response.header", 0)
  end
  local code = adapter.str(header.resultCode)
  if code ~= "00" then
    error(("weather: KMA error %s: %s"):format(tostring(code), adapter.str(header.resultMsg) or "?"), 0)
  end
  local items = type(resp.body) == "table" and type(resp.body.items) == "table" and resp.body.items.item
  if type(items) ~= "table" then
    error("weather: KMA response has no response.body.items.item[]", 0)
  end
  return items
end

-- Pure: decoded KMA response -> list of {category, fcstDate, fcstTime, fcstValue}.
-- A non-"00" resultCode raises with the code and message KMA sent.
function _M.parse_response(body)
  local items = items_of(body)
  local out = {}
  for _, it in ipairs(items) do
    if type(it) == "table" and adapter.str(it.category) then
      out[#out + 1] = {
        category = it.category,
        fcstDate = adapter.str(it.fcstDate),
        fcstTime = adapter.str(it.fcstTime),
        fcstValue = adapter.str(it.fcstValue),
      }
    end
  end
  return out
end

local function hour_label(t) return tonumber(t:sub(1, 2)) .. "시" end

-- A slot for the categories of one forecast hour. The constructor names
-- KMA's categories (nil until read) so that the table is made with room
-- for them: filling it does not grow it again and again.
local function new_slot(date, time)
  return { date = date, time = time,
           TMP = nil, UUU = nil, VVV = nil, VEC = nil, WSD = nil, SKY = nil, PTY = nil,
           POP = nil, WAV = nil, PCP = nil, REH = nil, SNO = nil, TMN = nil, TMX = nil }
end

-- A forecast value as text: strings as sent, numbers as strings, anything
-- else (JSON null) absent.
local function value(v)
  if type(v) == "string" then return v end
  return str(v)
end

-- The slots of the items from now_key on (today's, and the first one
-- from now), by key, and their keys. checked: each item's type is looked
-- at; unchecked, an item that is not a table raises when indexed (a string
-- reads as one without a category, as checked), for the caller to read them
-- all again checked. KMA's items are all tables, and a type() call per item
-- was most of this loop.
local function read_slots(items, today, now_key, checked)
  local by_slot, keys = {}, {}
  -- only today's slots and the first one from now are read below: a slot
  -- of a later day is kept only while it is the earliest seen
  local first_key = nil
  -- KMA lists the categories of one hour together: consecutive items of the
  -- same date and time share the previous item's key and slot
  local none = {}
  local last_date, last_time, slot = none, none, nil
  -- whether a category value names a field (a string or a number), for the
  -- dozen categories that repeat through the items
  local is_field = {}
  for i = 1, #items do
    local it = items[i]
    if not checked or type(it) == "table" then
      local cat = it.category
      local ok = is_field[cat]
      if ok == nil then
        local tc = type(cat)
        ok = tc == "string" or tc == "number"
        if cat ~= nil and cat == cat then is_field[cat] = ok end
      end
      if ok then
        local rdate, rtime = it.fcstDate, it.fcstTime
        if rdate ~= last_date or rtime ~= last_time then
          -- (only strings are remembered: 1500 == 1500.0, yet they differ as text)
          last_date, last_time = rdate, rtime
          local date, time = rdate, rtime
          if type(date) ~= "string" then date = str(date); last_date = none end
          if type(time) ~= "string" then time = str(time); last_time = none end
          local key = (date or "") .. (time or "")
          if key >= now_key then
            slot = by_slot[key]
            if not slot and (date == today or first_key == nil or key < first_key) then
              slot = new_slot(date, time)
              by_slot[key] = slot
              keys[#keys + 1] = key
            end
            if first_key == nil or key < first_key then first_key = key end
          else
            slot = nil
          end
        end
        -- the value as sent: made text (value()) where it is read
        if slot then slot[cat] = it.fcstValue end
      end
    end
  end
  return by_slot, keys
end

-- The precipitation codes as text (value() of each is itself).
local PTY_TEXT = { ["0"] = true, ["1"] = true, ["2"] = true, ["3"] = true, ["4"] = true }

-- tonumber(value(v)) with no call to value() for text: a number v reads as
-- its text does (the n == v, n ~= n test: only a number converts to
-- itself, or to NaN).
local function number(v)
  local n = tonumber(v)
  if n ~= nil and (n == v or n ~= n) then n = tonumber(str(v)) end
  return n
end

-- Pure: forecast items + the current time -> summary table:
-- { slot = {date, time, TMP, SKY, PTY, POP}, today = {max_pop, min_tmp, max_tmp,
--   rain_from, snow}, conditions = {rain=bool,...}, tips = {...} }.
-- The items are parse_response's, or the item[] list of the decoded
-- response itself (read the same way: items without a category are
-- skipped, JSON null and non-strings are absent values, numbers strings).
function _M.summarize_items(items, now_epoch)
  local today, now_slot = kma_time.slot(now_epoch)
  local now_key = today .. now_slot
  local ok, by_slot, keys = pcall(read_slots, items, today, now_key, false)
  if not ok then by_slot, keys = read_slots(items, today, now_key, true) end
  table.sort(keys)
  if #keys == 0 then
    error("weather: the forecast has no time slot at or after " .. now_key, 0)
  end
  local slot = by_slot[keys[1]]
  for k, v in pairs(slot) do slot[k] = value(v) end
  local t = tips.thresholds
  local day = { max_pop = nil, min_tmp = nil, max_tmp = nil }
  for i = 1, #keys do
    local s = by_slot[keys[i]]
    local date = s.date
    if date == today or (date ~= nil and value(date) == today) then
      local pty = s.PTY
      if pty ~= nil and not PTY_TEXT[pty] then pty = value(pty) end
      local pop, tmp = number(s.POP), number(s.TMP)
      if pop and (not day.max_pop or pop > day.max_pop) then day.max_pop = pop end
      if tmp and (not day.min_tmp or tmp < day.min_tmp) then day.min_tmp = tmp end
      if tmp and (not day.max_tmp or tmp > day.max_tmp) then day.max_tmp = tmp end
      local wet = (pty == "1" or pty == "2" or pty == "4") or (pop and pop >= t.rain_pop)
      if wet and not day.rain_from then day.rain_from = value(s.time) end
      if pty == "3" and not day.snow_from then day.snow_from = value(s.time) end
    end
  end
  local cond = {
    rain = day.rain_from ~= nil,
    snow = day.snow_from ~= nil,
    hot = day.max_tmp ~= nil and day.max_tmp >= t.hot_tmp,
    cold = day.min_tmp ~= nil and day.min_tmp <= t.cold_tmp,
  }
  cond.clear = not cond.rain and not cond.snow
  local chosen = {}
  for _, tip in ipairs(tips) do
    if cond[tip.when] then chosen[#chosen + 1] = tip.text end
  end
  return { slot = slot, today = day, conditions = cond, tips = chosen }
end

-- Short Korean text of a summary for a place label.
function _M.describe(sum, label, base_date, base_time)
  local s = sum.slot
  local parts = {}
  parts[#parts + 1] = ("%s 날씨 (기상청 단기예보 %d월 %d일 %s 발표): %s 기온 %s℃, %s, 강수확률 %s%%")
    :format(label, tonumber(base_date:sub(5, 6)), tonumber(base_date:sub(7, 8)), hour_label(base_time), hour_label(s.time),
      s.TMP or "?", _M.sky_names[s.SKY or ""] or "하늘상태 미상", s.POP or "?")
  if s.PTY and s.PTY ~= "0" then parts[#parts] = parts[#parts] .. ", " .. (_M.pty_names[s.PTY] or "강수") end
  local d = sum.today
  if d.rain_from then
    parts[#parts + 1] = ("오늘 %s부터 비 예보 (최고 강수확률 %d%%)"):format(hour_label(d.rain_from), d.max_pop or 0)
  elseif d.snow_from then
    parts[#parts + 1] = ("오늘 %s부터 눈 예보"):format(hour_label(d.snow_from))
  elseif d.max_pop then
    parts[#parts + 1] = ("오늘 최고 강수확률 %d%%"):format(d.max_pop)
  end
  local text = concat(parts, ". ") .. "."
  if #sum.tips > 0 then text = text .. "\n팁: " .. concat(sum.tips, " ") end
  return text
end

local function unavailable(reason)
  return {
    ok = false, unavailable = true, source = "kma", sample = false,
    text = ("날씨 정보: 오프라인이라 날씨를 제공할 수 없습니다 (%s)."):format(reason),
    data = {},
  }
end

function _M.run(state, ctx)
  local cfg = adapter.config("kma", ctx, _M.default_base_url)
  if not cfg.online then
    return { contexts = { weather = unavailable("기상청 API 키 MOONGRAPH_KMA_API_KEY가 설정되지 않았습니다") } }
  end
  local loc = state and state.user_location
  local assumed = false
  if loc == nil then
    loc = os.getenv("MOONGRAPH_DEFAULT_LOCATION") or _M.default_location
    assumed = true
  end
  local point, err = geo.resolve(loc)
  if not point then error("weather: " .. err, 0) end
  local nx, ny = grid.to_grid(point.lat, point.lon)
  local clock = ctx and ctx.config and ctx.config.clock
  local now = (clock and clock()) or os.time()
  local base_date, base_time = kma_time.base(now)
  local req = _M.build_request(cfg, { nx = nx, ny = ny, base_date = base_date, base_time = base_time,
                                      rows = _M.rows_for(base_date, base_time, now) })
  local sum = _M.summarize_items(items_of(adapter.fetch("weather", req)), now)
  local label = point.label .. (assumed and " (위치 정보가 없어 기본 위치 기준)" or "")
  return {
    contexts = {
      weather = {
        ok = true, source = "kma", sample = false,
        text = _M.describe(sum, label, base_date, base_time),
        data = {
          location = point.label, assumed_location = assumed, nx = nx, ny = ny,
          base_date = base_date, base_time = base_time,
          now = sum.slot, today = sum.today, conditions = sum.conditions, tips = sum.tips,
        },
      },
    },
  }
end

return _M
