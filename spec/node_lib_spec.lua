-- Pure helpers of the node layer: Korean normalisation, the KMA grid
-- projection, the forecast release-time rule and location resolution.
local korean = require "nodes.lib.korean"
local grid = require "nodes.lib.grid"
local kma_time = require "nodes.lib.kma_time"
local geo = require "nodes.lib.geo"

local function texts(tokens)
  local out = {}
  for i, t in ipairs(tokens) do out[i] = t.text end
  return out
end

describe("nodes.lib.korean", function()
  it("normalises punctuation, case and spacing", function()
    assert.are.equal("깨진 유리 어떻게 버려", korean.normalize("  깨진   유리, 어떻게 버려?! "))
    assert.are.equal("pet병", korean.normalize("PET병"))
    assert.are.equal("페트병", korean.compact("페트 병"))
  end)

  it("drops invalid UTF-8 bytes instead of failing", function()
    assert.are.equal("페트병 버려", korean.normalize("페트병\255 버려"))
    assert.are.same({ "페트병" }, texts(korean.content_tokens("페트병\200\201 어떻게 버려")))
  end)

  it("strips one particle or ending but keeps at least one character", function()
    assert.are.equal("종이", korean.strip_particle("종이는"))
    assert.are.equal("유리", korean.strip_particle("유리를"))
    assert.are.equal("수거함", korean.strip_particle("수거함에서"))
    assert.are.equal("캔", korean.strip_particle("캔"))
  end)

  it("keeps every variant so an over-cut stem never hides the real word", function()
    assert.are.same({ "종이", "종" }, korean.variants("종이"))
    assert.are.same({ "수거함도", "수거함" }, korean.variants("수거함도"))
  end)

  it("drops question words, verbs and filler from content tokens", function()
    assert.are.same({ "페트병" }, texts(korean.content_tokens("페트병 어떻게 버려")))
    assert.are.same({ "종이", "수거함도" },
      texts(korean.content_tokens("종이 어떻게 버려? 그리고 수거함도 알려줘")))
    assert.are.same({ "스티로폼" }, texts(korean.content_tokens("스티로폼 버리는 법")))
    assert.are.same({}, texts(korean.content_tokens("어디에 버려요?")))
  end)

  it("tells whether a question mentions a word, or any word of a list", function()
    local asked = korean.matcher("의류 수거함이랑 옷은 어디에?")
    assert.is_true(asked:mentions("의류수거함"))
    assert.is_true(asked:mentions("옷"))
    assert.is_false(asked:mentions("약"))
    assert.is_true(asked:mentions_any({ "약", "폐건전지", "옷" }))
    assert.is_true(asked:mentions_any({ "건전지", "의류 수거함" }))
    assert.is_false(asked:mentions_any({ "약", "건전지", "", "옷걸이" }))
    assert.is_false(asked:mentions_any({}))
    -- a list that grows is read again
    local words = { "건전지" }
    assert.is_false(asked:mentions_any(words))
    words[2] = "수거함"
    assert.is_true(asked:mentions_any(words))
    -- the same answers as mentions() word by word
    local list = { "옷", "약", "의류", "수거", "함이", "어디", "에?", "PET", "x" }
    for _, q in ipairs({ "옷걸이 버려", "약 봉투", "PET병 의류", "어디에? 함이" }) do
      local m = korean.matcher(q)
      for i = 1, #list do
        local one = false
        for j = 1, i do one = one or m:mentions(list[j]) end
        assert.equal(one, m:mentions_any({ table.unpack(list, 1, i) }), q)
      end
    end
  end)

  it("scores bigram similarity for spelling variants", function()
    assert.are.equal(1, korean.similarity("스티로폼", "스티로폼"))
    assert.is_true(korean.similarity("스티로폴", "스티로폼") >= 0.6)
    assert.are.equal(0, korean.similarity("냉장고", "건전지"))
  end)

  it("rejects a non-string with a clear message", function()
    assert.has_error(function() korean.normalize(42) end,
      "bad argument #1 to 'normalize': string expected, got number")
  end)
end)

describe("nodes.lib.grid", function()
  it("maps Seoul City Hall to nx 60, ny 127", function()
    local x, y = grid.to_grid(37.5665, 126.9780)
    assert.are.equal(60, x)
    assert.are.equal(127, y)
  end)

  it("maps other city halls to their published grid points", function()
    local cases = {
      { 35.1796, 129.0756, 98, 76 },  -- 부산광역시청
      { 36.3504, 127.3845, 67, 100 }, -- 대전광역시청
      { 35.1595, 126.8526, 58, 74 },  -- 광주광역시청
      { 37.4563, 126.7052, 55, 124 }, -- 인천광역시청
      { 37.5172, 127.0473, 61, 126 }, -- 강남구청
    }
    for _, c in ipairs(cases) do
      local x, y = grid.to_grid(c[1], c[2])
      assert.are.same({ c[3], c[4] }, { x, y })
    end
  end)

  it("inverts back to a point inside the same 5 km cell", function()
    local lat, lon = grid.to_latlon(60, 127)
    assert.is_true(math.abs(lat - 37.5665) < 0.05)
    assert.is_true(math.abs(lon - 126.9780) < 0.05)
    assert.are.same({ 60, 127 }, { grid.to_grid(lat, lon) })
    assert.are.same({ 43, 136 }, { grid.to_grid(grid.to_latlon(43, 136)) })
  end)

  it("rejects coordinates out of range", function()
    assert.has_error(function() grid.to_grid(nil, 127) end,
      "bad argument #1 (lat) to 'to_grid': number in [-89.9, 89.9] expected, got nil")
    assert.has_error(function() grid.to_grid(37, 999) end,
      "bad argument #2 (lon) to 'to_grid': number in [-180, 180] expected, got 999")
  end)
end)

describe("nodes.lib.kma_time", function()
  local function at(y, mo, d, h, mi)
    return kma_time.epoch_from_kst { year = y, month = mo, day = d, hour = h, min = mi }
  end

  it("converts KST wall clock to Unix time", function()
    assert.are.equal(1704034800, at(2024, 1, 1, 0, 0)) -- 2023-12-31T15:00:00Z
  end)

  it("uses the latest issue that is at least ten minutes old", function()
    assert.are.same({ "20240615", "1400" }, { kma_time.base(at(2024, 6, 15, 14, 30)) })
    assert.are.same({ "20240615", "1100" }, { kma_time.base(at(2024, 6, 15, 14, 9)) })
    assert.are.same({ "20240615", "1400" }, { kma_time.base(at(2024, 6, 15, 14, 10)) })
    assert.are.same({ "20240615", "0500" }, { kma_time.base(at(2024, 6, 15, 7, 59)) })
    assert.are.same({ "20240615", "2300" }, { kma_time.base(at(2024, 6, 15, 23, 10)) })
    assert.are.same({ "20240615", "2000" }, { kma_time.base(at(2024, 6, 15, 23, 9)) })
  end)

  it("uses the previous day's 2300 issue before 02:10", function()
    assert.are.same({ "20240614", "2300" }, { kma_time.base(at(2024, 6, 15, 0, 0)) })
    assert.are.same({ "20240614", "2300" }, { kma_time.base(at(2024, 6, 15, 2, 9)) })
    assert.are.same({ "20240615", "0200" }, { kma_time.base(at(2024, 6, 15, 2, 10)) })
  end)

  it("crosses month, year and leap-day boundaries", function()
    assert.are.same({ "20231231", "2300" }, { kma_time.base(at(2024, 1, 1, 1, 0)) })
    assert.are.same({ "20240229", "2300" }, { kma_time.base(at(2024, 3, 1, 0, 30)) })
    assert.are.same({ "20230228", "2300" }, { kma_time.base(at(2023, 3, 1, 0, 30)) })
  end)

  it("names the current hour slot", function()
    assert.are.same({ "20240615", "1400" }, { kma_time.slot(at(2024, 6, 15, 14, 59)) })
  end)

  it("rejects a non-number clock", function()
    assert.has_error(function() kma_time.base("now") end,
      "bad argument #1 to 'base': number (Unix seconds) expected, got string")
  end)
end)

describe("nodes.lib.geo", function()
  it("resolves a district inside its city", function()
    local p = geo.resolve("서울특별시 강남구")
    assert.are.equal("서울특별시 강남구", p.label)
    assert.are.same({ 61, 126 }, { grid.to_grid(p.lat, p.lon) })
  end)

  it("accepts short city names and a bare district", function()
    assert.are.equal("부산광역시 해운대구", geo.resolve("부산 해운대구 우동").label)
    assert.are.equal("서울특별시 마포구", geo.resolve("마포구").label)
    assert.are.equal("대전광역시", geo.resolve("대전").label)
  end)

  it("falls back to the city when the district is not in the table", function()
    assert.are.equal("부산광역시", geo.resolve("부산광역시 강서구").label)
  end)

  it("accepts coordinate tables in both shapes", function()
    assert.are.equal(37.5, geo.resolve({ lat = 37.5, lon = 127 }).lat)
    assert.are.equal(127, geo.resolve({ 37.5, 127 }).lon)
  end)

  it("reports unknown places and bad tables", function()
    local p, err = geo.resolve("아틀란티스")
    assert.is_nil(p)
    assert.matches("unknown location", err)
    p, err = geo.resolve({ lat = "x" })
    assert.is_nil(p)
    assert.matches("numeric lat and lon", err)
  end)

  it("measures distances in metres", function()
    local d = geo.distance(37.5665, 126.9780, 37.5172, 127.0473)
    assert.is_true(d > 7500 and d < 9000)
  end)
end)
