local rag = require "nodes.waste_rag"
local cjson = require "cjson"

local function top(q)
  local kept = rag.search(q)
  return kept[1] and kept[1].item.id
end

describe("waste_rules.json", function()
  local doc = rag.index().doc

  it("holds at least 100 items with the fields the node reads", function()
    assert.is_true(#doc.items >= 100)
    local ids = {}
    for _, it in ipairs(doc.items) do
      assert.is_string(it.id)
      assert.is_nil(ids[it.id], "duplicate id " .. it.id)
      ids[it.id] = true
      assert.is_string(it.name)
      assert.is_string(it.how)
      assert.is_string(it.bin)
      assert.is_table(it.aliases)
      assert.is_true(#it.aliases >= 1, it.id .. " has no aliases")
      assert.is_not_nil(doc.disposal_types[it.disposal], it.id .. ": unknown disposal " .. tostring(it.disposal))
    end
  end)
end)

describe("waste_rag retrieval", function()
  local cases = {
    { "페트병 어떻게 버려", "pet_clear" },
    { "스티로폼 버리는 법", "styrofoam" },
    { "깨진 유리 어떻게 버려?", "broken_glass" },
    { "폐건전지 어디에 버려?", "battery" },
    { "종이 어떻게 버려? 그리고 수거함도 알려줘", "paper" },
    { "우유팩은 어떻게 버려요", "milk_carton" },
    { "택배 박스 버리는 방법", "cardboard_box" },
    { "음식물 쓰레기 버리는 법", "food_waste" },
    { "닭뼈는 음식물 쓰레기야?", "chicken_bone" },
    { "계란 껍데기 음식물이야?", "eggshell" },
    { "소파 버리려면", "sofa" },
    { "쇼파 버리고 싶어", "sofa" },
    { "냉장고 버리는 법", "refrigerator" },
    { "형광등 어디에 버려", "fluorescent_lamp" },
    { "약 버리는 곳", "medicine" },
    { "안 입는 옷 어디에 버려", "clothes" },
    { "부탄가스 버리는법", "butane_can" },
    { "치킨 뼈 어디에 버려", "chicken_bone" },
    { "스티로폴 박스", "styrofoam" },       -- loanword spelling variant
    { "스치로폴 어케 버림", "styrofoam" },   -- colloquial spelling and ending
    { "페트 병은?", "pet_clear" },           -- spacing variant
    { "보조배터리 버리는 법", "power_bank" },
    { "밧데리 버리는곳", "battery" },
    { "유리컵 깨졌는데 어떻게 버려", "glass_cup" },
    { "두유팩 재활용 돼?", "aseptic_carton" },
    { "음쓰 어떻게 버려", "food_waste" },
    { "폐식용유 어디에 버려", "cooking_oil" },
    { "라면봉지는?", "snack_bag" },
    { "컵라면 용기 분리수거", "cup_noodle" },
    { "티비 버리려면", "tv" },
    { "how to dispose styrofoam", "styrofoam" },
  }
  for _, c in ipairs(cases) do
    it(("finds %s for %q"):format(c[2], c[1]), function()
      assert.are.equal(c[2], top(c[1]))
    end)
  end

  it("returns several items for a question about several things", function()
    local kept = rag.search("페트병이랑 캔 어떻게 버려")
    local ids = {}
    for _, r in ipairs(kept) do ids[r.item.id] = true end
    assert.is_true(ids.pet_clear and ids.can)
  end)

  it("prefers the specific item over its generic category", function()
    local kept = rag.search("귤껍질 음식물 쓰레기야?")
    assert.are.equal("fruit_peel", kept[1].item.id)
    assert.are.equal("food_waste", kept[2].item.id)
    assert.is_true(kept[1].score > kept[2].score)
  end)

  it("finds nothing for unrelated questions", function()
    assert.are.same({}, (rag.search("오늘 날씨 어때?")))
    assert.are.same({}, (rag.search("안녕")))
  end)

  it("grades retrieval quality", function()
    assert.are.equal("high", rag.quality(rag.search("폐건전지 어디에 버려?")).level)
    assert.are.equal("none", rag.quality({}).level)
  end)
end)

describe("waste_rag node", function()
  it("follows the node contract", function()
    assert.are.equal("waste_rag", rag.name)
    assert.are.same({ fallback = "web_search" }, rag.policy)
    assert.is_function(rag.run)
  end)

  it("returns the top rules, a summary and a quality score", function()
    local out = rag.run({ message = "깨진 유리 어떻게 버려?" }, {})
    local c = out.contexts.waste_rag
    assert.is_true(c.ok)
    assert.are.equal("local", c.source)
    assert.is_false(c.sample)
    assert.are.equal("broken_glass", c.data.items[1].id)
    assert.matches("신문지", c.text)
    assert.are.equal("high", c.data.quality.level)
    assert.is_true(c.data.items[1].score >= c.data.items[#c.data.items].score)
    -- the context must survive JSON (checkpoints, --json output)
    assert.is_string(cjson.encode(out))
  end)

  it("raises when nothing relevant is found so the fallback runs", function()
    assert.has_error(function() rag.run({ message = "오늘 주가 전망 알려줘" }, {}) end,
      'waste_rag: no disposal rule matches "오늘 주가 전망 알려줘" (best score 0.00, needed 0.50)')
  end)

  it("raises on an empty question", function()
    assert.has_error(function() rag.run({ message = "  " }, {}) end,
      "waste_rag: the question (state.message) is empty")
  end)

  it("takes its thresholds from ctx.config.waste_rag", function()
    local out = rag.run({ message = "종이 어떻게 버려" }, { config = { waste_rag = { top_k = 1 } } })
    assert.are.equal(1, #out.contexts.waste_rag.data.items)
  end)
end)
