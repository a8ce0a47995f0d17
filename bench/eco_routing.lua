-- Speed of the Eco² offline routing: loading and training the classifier
-- from data/intents.jsonl, classifying a message, routing a decision.
--
--   lua5.4 bench/eco_routing.lua

package.path = "./?.lua;" .. package.path

local classifier = require "nodes.lib.intent_model"
local intent = require "scripts.eco.routing"
local routing = require "scripts.eco.routing"

local clock = os.clock

local function best_of(n, fn)
  local best = math.huge
  for _ = 1, n do
    local t = clock()
    fn()
    best = math.min(best, clock() - t)
  end
  return best
end

local lines = assert(classifier.read_jsonl(classifier.default_data_path()))
local examples = classifier.training_examples(lines)

local load_s = best_of(7, function()
  classifier.reset()
  assert(classifier.default())
end)
local train_s = best_of(7, function() classifier.train(examples) end)
local nocal_s = best_of(7, function() classifier.train(examples, { calibrate = false }) end)
local model = assert(classifier.default())

local messages = {
  "냉장고 버리려면 어떻게 해?", "팔 수 있어?", "근처 제로웨이스트샵 어디 있어?",
  "종이 어떻게 버려? 그리고 수거함도 알려줘", "분리배출 방법을 인포그래픽으로 만들어줘",
}
local n = 400
local classify_s = best_of(3, function()
  for i = 1, n do intent.classify(messages[i % #messages + 1], { prev_intent = "waste" }) end
end) / n
local route = routing.new_router{}
local state = { intent = "waste", additional_intents = { "collection_point" }, user_location = "서울" }
local route_s = best_of(3, function()
  for _ = 1, 10000 do route(state) end
end) / 10000

print(string.format("training examples     %d (%d features)", #examples, model.vocab))
print(string.format("load + train          %.1f ms", load_s * 1e3))
print(string.format("train (calibrated)    %.1f ms", train_s * 1e3))
print(string.format("train (uncalibrated)  %.1f ms", nocal_s * 1e3))
print(string.format("classify, offline     %.1f us / message", classify_s * 1e6))
print(string.format("route                 %.2f us / state", route_s * 1e6))
