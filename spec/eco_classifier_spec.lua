-- The offline intent classifier: features, training, calibrated
-- probabilities and the shipped data's quality.

local classifier = require "nodes.lib.intent_model"
local tmp = require "tmp"

local function tmpfile(content)
  return tmp.file(content, "intents.jsonl")
end

local function folds(examples, k, fold)
  local train, test = {}, {}
  for i, e in ipairs(examples) do
    if i % k == fold then test[#test + 1] = e else train[#train + 1] = e end
  end
  return train, test
end

describe("eco classifier", function()
  local model

  setup(function()
    classifier.reset()
    model = assert(classifier.default())
  end)

  describe("features", function()
    it("ignores punctuation and ASCII case", function()
      assert.same(classifier.features("냉장고 TV 버려"), classifier.features("냉장고!! tv, 버려?"))
    end)

    it("treats full-width punctuation as a separator", function()
      assert.same(classifier.features("버려 어디"), classifier.features("버려？어디…"))
    end)

    it("shares the stem of a word with and without a particle", function()
      local with = {}
      for _, f in ipairs(classifier.features("냉장고를")) do with[classifier.feature_name(f)] = true end
      assert.is_true(with["<냉장"])
      assert.is_true(with["냉장고"])
      assert.is_nil(with["냉장고>"])
    end)

    it("takes 1-, 2- and 3-grams of the padded word", function()
      local names = {}
      for _, f in ipairs(classifier.features("팔")) do names[#names + 1] = classifier.feature_name(f) end
      table.sort(names)
      assert.same({ "<팔", "<팔>", "팔", "팔>" }, names)
    end)

    it("survives invalid UTF-8", function()
      local names = {}
      for _, f in ipairs(classifier.features("캔\xff\xfe버려")) do names[classifier.feature_name(f)] = true end
      assert.is_true(names["<캔>"])
      assert.is_true(names["<버려"])
    end)

    it("lists every feature once", function()
      local seen, n = {}, 0
      for _, f in ipairs(classifier.features("버려 버려 버려")) do
        assert.is_nil(seen[f])
        seen[f] = true
        n = n + 1
      end
      -- the features of the word itself, each once
      local once = classifier.features("버려")
      assert.is_true(#once > 0)
      assert.equal(#once, n)
      for _, f in ipairs(once) do assert.is_true(seen[f]) end
    end)
  end)

  describe("the model trained from data/intents.jsonl", function()
    it("sends a refrigerator to bulk waste", function()
      local _, ranked = model:predict("냉장고 버리려면 어떻게 해?")
      assert.equal("bulk_waste", ranked[1].intent)
    end)

    it("sends an infographic about sorting to image generation", function()
      local _, ranked = model:predict("분리배출 방법을 인포그래픽으로 만들어줘")
      assert.equal("image_generation", ranked[1].intent)
    end)

    it("returns a probability for each of the nine intents, summing to 1", function()
      local probs, ranked = model:predict("페트병 라벨 떼고 버려?")
      local sum, n = 0, 0
      for _, c in ipairs(classifier.INTENTS) do
        assert.is_true(probs[c] >= 0 and probs[c] <= 1)
        sum = sum + probs[c]
        n = n + 1
      end
      assert.equal(9, n)
      assert.near(1, sum, 1e-9)
      assert.equal(9, #ranked)
      for i = 2, #ranked do assert.is_true(ranked[i - 1].p >= ranked[i].p) end
    end)

    it("gives the same probabilities and best label without the ranked tables", function()
      for _, text in ipairs({ "페트병 라벨 떼고 버려?", "냉장고", "👍", "그럼 그건?", "" }) do
        local probs, ranked, known = model:predict(text)
        local ps, best, known2 = model:probabilities(text)
        assert.equal(known, known2)
        assert.equal(ranked[1].intent, model.labels[best])
        for j, c in ipairs(model.labels) do assert.equal(probs[c], ps[j]) end
      end
      assert.has_error(function() model:probabilities(nil) end,
        "bad argument #1 to 'probabilities': expected a string, got nil")
    end)

    it("is less sure of a vague message than of a clear one", function()
      local _, vague = model:predict("그럼 그건?")
      local _, clear = model:predict("폐건전지 수거함 어디 있어?")
      assert.is_true(vague[1].p < 0.8)
      assert.is_true(clear[1].p > 0.9)
    end)

    it("softens naive Bayes with a fitted temperature", function()
      assert.is_true(model.temperature > 1)
      assert.is_true(model.loo_accuracy > 0.8)
    end)
  end)

  describe("on held-out folds of its own data", function()
    local lines = assert(classifier.read_jsonl(classifier.default_data_path()))
    local examples = classifier.training_examples(lines)
    local k = 5
    local results = {}
    for fold = 0, k - 1 do
      local train, test = folds(examples, k, fold)
      local m = classifier.train(train)
      for _, e in ipairs(test) do
        local _, ranked = m:predict(e.text)
        results[#results + 1] = { p = ranked[1].p, ok = ranked[1].intent == e.label }
      end
    end

    it("is right on at least 85% of unseen examples", function()
      local ok = 0
      for _, r in ipairs(results) do if r.ok then ok = ok + 1 end end
      assert.is_true(ok / #results >= 0.85, "accuracy " .. ok / #results)
    end)

    it("reports probabilities that match how often it is right (ECE < 0.08)", function()
      assert.is_true(#results >= 100, "held-out predictions: " .. #results)
      local bins = {}
      for _, r in ipairs(results) do
        local b = math.min(10, math.floor(r.p * 10) + 1)
        bins[b] = bins[b] or { n = 0, conf = 0, ok = 0 }
        bins[b].n = bins[b].n + 1
        bins[b].conf = bins[b].conf + r.p
        bins[b].ok = bins[b].ok + (r.ok and 1 or 0)
      end
      local ece = 0
      for _, b in pairs(bins) do
        ece = ece + b.n / #results * math.abs(b.conf / b.n - b.ok / b.n)
      end
      assert.is_true(ece < 0.08, "expected calibration error " .. ece)
    end)
  end)

  describe("the data file", function()
    local lines = assert(classifier.read_jsonl(classifier.default_data_path()))

    it("has at least 40 examples of every intent and 40 multi-intent lines", function()
      local per, multi = {}, 0
      for _, o in ipairs(lines) do
        if o.additional_intents and #o.additional_intents > 0 then
          multi = multi + 1
        else
          per[o.intent] = (per[o.intent] or 0) + 1
        end
      end
      for _, c in ipairs(classifier.INTENTS) do
        assert.is_true((per[c] or 0) >= 40, c .. " has " .. tostring(per[c]))
      end
      assert.is_true(multi >= 40, "multi-intent lines: " .. multi)
    end)

    it("labels only the nine intents and has no duplicate message", function()
      assert.is_true(#lines >= 9 * 40, "lines: " .. #lines)
      local known, seen = {}, {}
      for _, c in ipairs(classifier.INTENTS) do known[c] = true end
      for _, o in ipairs(lines) do
        assert.is_true(known[o.intent], o.message)
        for _, a in ipairs(o.additional_intents or {}) do assert.is_true(known[a], o.message) end
        assert.is_nil(seen[o.message], "duplicate: " .. o.message)
        seen[o.message] = true
      end
    end)
  end)

  describe("training", function()
    it("rejects an unknown label, naming the example", function()
      assert.has_error(function()
        classifier.train({ { text = "x", label = "weather" } })
      end, "bad argument #1 to 'train': example 1 has unknown label 'weather'")
    end)

    it("needs an example of every label", function()
      assert.has_error(function()
        classifier.train({ { text = "버려", label = "waste" } })
      end, "bad argument #1 to 'train': no example for label 'character'")
    end)

    it("can learn a custom label set", function()
      local m = classifier.train({
        { text = "사과 주세요", label = "fruit" }, { text = "배 주세요", label = "fruit" },
        { text = "버스 타요", label = "transport" }, { text = "기차 타요", label = "transport" },
      }, { labels = { "fruit", "transport" } })
      local _, ranked = m:predict("사과 하나")
      assert.equal("fruit", ranked[1].intent)
    end)

    it("rejects a non-string text in predict", function()
      assert.has_error(function() model:predict(42) end,
        "bad argument #1 to 'predict': expected a string, got number")
    end)
  end)

  describe("reading JSONL", function()
    it("names the line that is not JSON", function()
      local path = tmpfile('{"message": "a", "intent": "waste"}\nnot json\n')
      local lines, err = classifier.read_jsonl(path)
      assert.is_nil(lines)
      assert.matches(":2: not a JSON object", err, 1, true)
    end)

    it("names the line without a message", function()
      local path = tmpfile('\n{"intent": "waste"}\n')
      local lines, err = classifier.read_jsonl(path)
      assert.is_nil(lines)
      assert.matches(':2: needs string fields "message" and "intent"', err, 1, true)
    end)

    it("returns nil, err for a missing file", function()
      local lines, err = classifier.read_jsonl("/nonexistent/intents.jsonl")
      assert.is_nil(lines)
      assert.is_string(err)
    end)
  end)
end)
