local summarize = require "nodes.summarize"
local tokens = require "nodes.lib.tokens"
local reducers = require "moongraph.reducers"

-- A synthetic conversation of n turns: a Korean question and answer each,
-- tagged with their turn number and intent as the pipeline writes them.
local function history(n, first)
  first = first or 1
  local intents = { "waste", "collection_point", "bulk_waste", "recyclable_price" }
  local items = { "페트병", "종이컵", "형광등", "소파", "건전지", "유리병", "냉장고", "스티로폼" }
  local msgs = {}
  for t = first, first + n - 1 do
    local item = items[t % #items + 1]
    local intent = intents[t % #intents + 1]
    msgs[#msgs + 1] = { id = "u" .. t, role = "user", turn = t, intent = intent,
                        content = ("%d번째 질문: %s 어떻게 버려?"):format(t, item) }
    msgs[#msgs + 1] = { id = "a" .. t, role = "assistant", turn = t,
                        content = ("%s은 깨끗이 비우고 분리배출합니다. 자세한 방법은 구청 안내를 확인하세요."):format(item) }
  end
  return msgs
end

local function ctx_with(settings)
  return { config = { summarize = settings } }
end

local function records_by_tier(summary)
  local out = {}
  for _, r in ipairs(summary.records) do
    out[r.tier] = out[r.tier] or {}
    table.insert(out[r.tier], r.n)
  end
  for _, l in pairs(out) do table.sort(l) end
  return out
end

-- Apply the node's update to the state the way the graph engine does.
local function apply(state, update)
  local s = {}
  for k, v in pairs(state) do s[k] = v end
  for k, v in pairs(update) do
    if k == "messages" then s.messages = reducers.messages(s.messages, v) else s[k] = v end
  end
  return s
end

describe("summarize node", function()
  describe("token estimate", function()
    it("counts one token per Hangul syllable and about four letters per English token", function()
      assert.are.equal(5, tokens.estimate("분리배출법"))
      assert.are.equal(3, tokens.estimate("recycling"))     -- ceil(9 / 4)
      assert.are.equal(2, tokens.estimate("2024"))           -- ceil(4 / 3)
      assert.are.equal(0, tokens.estimate("  \n\t"))
      -- a Korean sentence costs far more than its whitespace words suggest
      local s = "종이는 물기 없이 펴서 묶어 배출합니다."
      assert.are.equal(17, tokens.estimate(s))               -- 16 syllables + the period
    end)

    it("adds a framing cost per chat message", function()
      assert.are.equal(3 + 4 + 1 + 4, tokens.messages {
        { role = "user", content = "안녕?" }, { role = "assistant", content = "hi" } })
    end)

    it("rejects non-strings", function()
      assert.has_error(function() tokens.estimate(nil) end,
        "bad argument #1 to 'estimate': string expected, got nil")
    end)
  end)

  describe("tiers", function()
    it("are the seed's 5 / 20 / 100 / 500 / rest by turn age", function()
      local r = summarize.ranges(summarize.defaults.tiers)
      assert.are.same({ "immediate", 1, 5 }, r[1])
      assert.are.same({ "recent", 6, 25 }, r[2])
      assert.are.same({ "session", 26, 125 }, r[3])
      assert.are.same({ "archive", 126, 625 }, r[4])
      assert.are.equal("forgotten", r[5][1])
      assert.are.equal(626, r[5][2])
      assert.are.equal(math.huge, r[5][3])
    end)
  end)

  describe("on a 700-turn history", function()
    local state = { messages = history(700), turn = 700 }

    it("leaves a history under the trigger alone", function()
      local up = summarize.run(state, ctx_with { trigger_tokens = 10 ^ 9 })
      assert.is_nil(up.messages)
      assert.is_nil(up.summary)
      assert.are.equal(tokens.messages(state.messages), up.context_tokens)
    end)

    it("compresses over the trigger into the five tiers at 5 / 20 / 100 / 500", function()
      local up = summarize.run(state, ctx_with { trigger_tokens = 1000, prune_protect = 0 })
      local s = up.summary
      assert.are.equal(700, s.turns)
      assert.are.same({ count = 5, from = 696, to = 700 }, s.tiers.immediate)
      assert.are.same({ count = 20, from = 676, to = 695 }, s.tiers.recent)
      assert.are.same({ count = 100, from = 576, to = 675 }, s.tiers.session)
      assert.are.same({ count = 500, from = 76, to = 575 }, s.tiers.archive)
      assert.are.same({ count = 75, from = 1, to = 75 }, s.tiers.forgotten)
      local by = records_by_tier(s)
      assert.are.equal(20, #by.recent)
      assert.are.equal(100, #by.session)
      assert.are.equal(500, #by.archive)
      assert.is_nil(by.forgotten)          -- metadata only
      assert.are.equal(75, s.forgotten.turns)
      assert.are.equal(1, s.forgotten.first)
      assert.are.equal(75, s.forgotten.last)
      local n = 0
      for _, c in pairs(s.forgotten.intents) do n = n + c end
      assert.are.equal(75, n)
      -- the history keeps the immediate turns verbatim, nothing else
      local after = apply(state, up)
      assert.are.equal(10, #after.messages)
      assert.are.same(state.messages[1391], after.messages[1])
      assert.are.same(state.messages[1400], after.messages[10])
      assert.is_true(up.context_tokens < tokens.messages(state.messages) / 5)
    end)

    it("keeps less detail the older a turn is", function()
      local s = summarize.run(state, ctx_with { trigger_tokens = 1000, prune_protect = 0 }).summary
      assert.are.equal(620, #s.records)   -- recent 20, session 100, archive 500
      for _, r in ipairs(s.records) do
        if r.tier == "recent" then
          assert.is_string(r.q)
          assert.is_string(r.a)
          assert.matches("분리배출", r.a)
        elseif r.tier == "session" then
          assert.is_string(r.q)
          assert.is_nil(r.a)
        else
          assert.are.equal("archive", r.tier)
          assert.is_nil(r.q)
          assert.is_table(r.keys)
          assert.is_true(#r.keys >= 1)
        end
      end
      assert.matches("최근 %(6~25턴 전%)", s.text)
      assert.matches("세션 %(26~125턴 전%)", s.text)
      assert.matches("보관 %(126~625턴 전%)", s.text)
      assert.matches("잊힘 %(626턴 전 이전%): 1~75턴, 75턴", s.text)
    end)

    it("keeps the protected recent tokens verbatim", function()
      local per_turn = tokens.messages { state.messages[1399], state.messages[1400] }
      local protect = per_turn * 30 + 1          -- room for about 30 turns
      local up = summarize.run(state, ctx_with { trigger_tokens = 1000, prune_protect = protect })
      local after = apply(state, up)
      local kept_turns = #after.messages // 2
      assert.is_true(kept_turns >= 28 and kept_turns <= 32, "kept " .. kept_turns .. " turns")
      assert.are.equal(kept_turns, up.summary.tiers.immediate.count)
      assert.is_true(tokens.messages(after.messages) <= protect)
      -- exactly the newest messages, unchanged
      for i = 1, #after.messages do
        assert.are.same(state.messages[#state.messages - #after.messages + i], after.messages[i])
      end
      -- the protected turns are not summarised a second time
      assert.is_true(#up.summary.records > 0)
      for _, r in ipairs(up.summary.records) do
        assert.is_true(r.n <= 700 - kept_turns)
      end
      assert.are.equal(kept_turns, up.summary.protected.turns)
    end)

    it("re-tiers earlier summaries by their new age, only ever losing detail", function()
      local cfg = ctx_with { trigger_tokens = 1000, prune_protect = 0 }
      local s1 = apply(state, summarize.run(state, cfg))
      -- 100 more turns, then compress again
      local more = history(100, 701)
      local grown = { messages = {}, summary = s1.summary, turn = 800 }
      for _, m in ipairs(s1.messages) do grown.messages[#grown.messages + 1] = m end
      for _, m in ipairs(more) do grown.messages[#grown.messages + 1] = m end
      local s2 = summarize.run(grown, cfg).summary
      assert.are.same({ count = 5, from = 796, to = 800 }, s2.tiers.immediate)
      assert.are.same({ count = 20, from = 776, to = 795 }, s2.tiers.recent)
      assert.are.same({ count = 100, from = 676, to = 775 }, s2.tiers.session)
      assert.are.same({ count = 500, from = 176, to = 675 }, s2.tiers.archive)
      assert.are.same({ count = 175, from = 1, to = 175 }, s2.tiers.forgotten)
      -- turn 680 was "recent" at 700 (age 21) and is "session" at 800
      local r680
      for _, r in ipairs(s2.records) do if r.n == 680 then r680 = r end end
      assert.are.equal("session", r680.tier)
      assert.is_nil(r680.a)
    end)
  end)

  describe("settings", function()
    it("reads the trigger and prune_protect from the environment", function()
      local real = os.getenv
      os.getenv = function(k)
        if k == "MOONGRAPH_SUMMARIZE_TRIGGER_TOKENS" then return "123" end
        if k == "MOONGRAPH_SUMMARIZE_PRUNE_PROTECT" then return "45" end
        return real(k)
      end
      local ok, s = pcall(summarize.settings, { config = {} })
      os.getenv = real
      assert.is_true(ok, s)
      assert.are.equal(123, s.trigger_tokens)
      assert.are.equal(45, s.prune_protect)
    end)

    it("defaults to the seed's 272,000 / 40,000", function()
      -- whatever the caller's environment holds
      local real = os.getenv
      os.getenv = function(k)
        if k:match("^MOONGRAPH_SUMMARIZE_") then return nil end
        return real(k)
      end
      local ok, s = pcall(summarize.settings, { config = {} })
      os.getenv = real
      assert.is_true(ok, s)
      assert.are.equal(272000, s.trigger_tokens)
      assert.are.equal(40000, s.prune_protect)
    end)

    it("rejects tiers that are not the five in order", function()
      assert.has_error(function()
        summarize.settings(ctx_with { tiers = { { "recent", 5 } } })
      end, "summarize: tiers must list the five tiers {name, size} in order")
    end)
  end)
end)
