local weather = require "nodes.weather"
local kma_time = require "nodes.lib.kma_time"
local fx = require "node_fixtures"

local online = { base_url = "http://127.0.0.1:8080", api_key = "svc-key", online = true }
local function at(h, mi)
  return kma_time.epoch_from_kst { year = 2024, month = 6, day = 15, hour = h, min = mi }
end

describe("weather node", function()
  it("follows the node contract", function()
    assert.are.equal("weather", weather.name)
    assert.are.equal("fail_open", weather.policy)
  end)

  it("builds the getVilageFcst request", function()
    local req = weather.build_request(online, { nx = 61, ny = 126, base_date = "20240615", base_time = "1400" })
    assert.are.equal("GET", req.method)
    assert.are.equal("http://127.0.0.1:8080/getVilageFcst", req.url)
    assert.are.same({ serviceKey = "svc-key", pageNo = 1, numOfRows = 300, dataType = "JSON",
                      base_date = "20240615", base_time = "1400", nx = 61, ny = 126 }, req.query)
  end)

  it("asks for the rows of the rest of today", function()
    local function rows(h, mi)
      local now = at(h, mi)
      local d, t = kma_time.base(now)
      return weather.rows_for(d, t, now)
    end
    assert.are.equal(9 * 12 + 2, rows(14, 30))   -- 1400 issue: 1500 .. 2300
    assert.are.equal(21 * 12 + 2, rows(2, 30))   -- 0200 issue: 0300 .. 2300
    assert.are.equal(24 * 12 + 2, rows(1, 0))    -- yesterday's 2300 issue: all of today
    assert.are.equal(12 + 2, rows(23, 30))       -- 2300 issue: tomorrow's first hour
    -- the rows asked for at 14:30 hold every slot the summary reads
    local items = weather.parse_response(fx.load("kma_vilage_fcst.json"))
    local first = {}
    for i = 1, rows(14, 30) do first[i] = items[i] end
    assert.are.same(weather.summarize_items(items, at(14, 30)), weather.summarize_items(first, at(14, 30)))
  end)

  it("summarizes the items that are tables, whatever else the list holds", function()
    local items = weather.parse_response(fx.load("kma_vilage_fcst.json"))
    local want = weather.summarize_items(items, at(14, 30))
    for _, odd in ipairs({ "TMP", 1500, true, require("cjson").null }) do
      local mixed = { odd }
      for i, it in ipairs(items) do mixed[i + 1] = it end
      mixed[#mixed + 1] = odd
      assert.are.same(want, weather.summarize_items(mixed, at(14, 30)))
    end
  end)

  it("names a missing request parameter", function()
    assert.has_error(function() weather.build_request(online, { nx = 1, ny = 2, base_date = "20240615" }) end,
      "bad argument #2 to 'build_request': missing base_time")
  end)

  it("parses forecast items", function()
    local items = weather.parse_response(fx.load("kma_vilage_fcst.json"))
    assert.are.equal(11 * 12, #items)
    assert.are.same({ category = "TMP", fcstDate = "20240615", fcstTime = "1500", fcstValue = "24" }, items[1])
  end)

  it("raises KMA's own error code and message", function()
    assert.has_error(function() weather.parse_response(fx.load("kma_no_data.json")) end,
      "weather: KMA error 03: NO_DATA")
    assert.has_error(function() weather.parse_response({}) end, "weather: KMA response has no response.header")
  end)

  it("summarises the current slot, today's rain and the tip", function()
    local items = weather.parse_response(fx.load("kma_vilage_fcst.json"))
    local sum = weather.summarize_items(items, at(14, 30))
    assert.are.same({ date = "20240615", time = "1500", TMP = "24", SKY = "3", PTY = "0", POP = "30",
                      UUU = "-1.2", VVV = "0.8", VEC = "124", WSD = "1.5", WAV = "0", PCP = "강수없음",
                      REH = "70", SNO = "적설없음" }, sum.slot)
    assert.are.equal(80, sum.today.max_pop)
    assert.are.equal("1800", sum.today.rain_from)
    assert.is_true(sum.conditions.rain)
    assert.is_false(sum.conditions.clear)
    local text = weather.describe(sum, "서울특별시 강남구", "20240615", "1400")
    assert.matches("^서울특별시 강남구 날씨 %(기상청 단기예보 6월 15일 14시 발표%): 15시 기온 24℃, 구름많음, 강수확률 30%%", text)
    assert.matches("오늘 18시부터 비 예보 %(최고 강수확률 80%%%)", text)
    assert.matches("종이류·박스는 젖지 않게", text)
  end)

  it("only looks at slots from the current hour on", function()
    local items = weather.parse_response(fx.load("kma_vilage_fcst.json"))
    local sum = weather.summarize_items(items, at(21, 20))
    assert.are.equal("2100", sum.slot.time)
    assert.is_nil(sum.today.rain_from)
    assert.is_true(sum.conditions.clear)
  end)

  it("raises when the forecast has nothing left for now", function()
    local items = weather.parse_response(fx.load("kma_vilage_fcst.json"))
    assert.has_error(function()
      weather.summarize_items(items, kma_time.epoch_from_kst { year = 2024, month = 6, day = 16, hour = 5, min = 0 })
    end, "weather: the forecast has no time slot at or after 202406160500")
  end)

  it("reports unavailable offline instead of inventing a forecast", function()
    local out = weather.run({ message = "종이 어떻게 버려?", user_location = "서울특별시 강남구" }, fx.offline_ctx())
    local c = out.contexts.weather
    assert.is_false(c.ok)
    assert.is_true(c.unavailable)
    assert.matches("오프라인이라 날씨를 제공할 수 없습니다", c.text)
  end)
end)
