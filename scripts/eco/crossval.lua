-- k-fold cross-validation of the offline intent classifier on the labelled
-- data: train on k-1 folds of data/intents.jsonl, evaluate intents,
-- additional intents and node sets on the held-out fold (multi-intent lines
-- are only ever evaluated), and print the pooled figures and failures.
--
--   lua5.4 scripts/eco/crossval.lua [K] [FILE.jsonl]

local root = (arg and arg[0] or ""):match("^(.-)scripts[/\\]eco[/\\]crossval%.lua$") or ""
root = root ~= "" and root or "./"
package.path = root .. "?.lua;" .. root .. "runtime/lua/?.lua;" .. package.path

local classifier = require "nodes.lib.intent_model"
local eval = require "scripts.eco.eval"
local json = require "moongraph.json"

local k = tonumber(arg[1] or "5")
local path = arg[2] or classifier.default_data_path()
local data, err = classifier.read_jsonl(path)
if not data then
  io.stderr:write("crossval: ", err, "\n")
  os.exit(1)
end

local total, failures = {}, {}
for _, key in ipairs{ "intent", "additional_intents" } do total[key] = { correct = 0, total = 0 } end
for fold = 0, k - 1 do
  local train, test = {}, {}
  for i, o in ipairs(data) do
    if i % k == fold then test[#test + 1] = o else train[#train + 1] = o end
  end
  local model = classifier.train(classifier.training_examples(train))
  local lines = {}
  for i, o in ipairs(test) do
    lines[i] = json.encode_output({ message = o.message, intent = o.intent,
      additional_intents = json.array(o.additional_intents or {}) })
  end
  local report = assert(eval.eval(lines, { model = model }))
  for _, key in ipairs{ "intent", "additional_intents" } do
    total[key].correct = total[key].correct + report[key].correct
    total[key].total = total[key].total + report[key].total
  end
  for _, f in ipairs(report.failures) do failures[#failures + 1] = f end
end
for _, f in ipairs(failures) do
  print(string.format("%-16s -> %-16s +[%s]/[%s]  %s", f.expected.intent, f.got.intent,
    table.concat(f.got.additional_intents, ","), table.concat(f.expected.additional_intents, ","),
    f.message))
end
for _, key in ipairs{ "intent", "additional_intents" } do
  print(string.format("%-20s %.1f%% (%d/%d)", key, 100 * total[key].correct / total[key].total,
    total[key].correct, total[key].total))
end
