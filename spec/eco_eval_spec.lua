-- Routing evaluation and explanation: the library behind `moongraph eval`
-- and `moongraph route`, and the small Lua front ends in scripts/eco/.

local eval = require "scripts.eco.eval"
local route_command = require "scripts.eco.route_command"
local eval_command = require "scripts.eco.eval_command"
local cli = require "cli"
local tmp = require "tmp"
local explain = require "scripts.eco.explain"
local json = require "moongraph.json"
local cjson = require "cjson"

local function line(t)
  return json.encode(t)
end

local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok and 0 or code
end

describe("eco eval", function()
  local lines = {
    line{ message = "냉장고 버리려면 어떻게 해?", intent = "bulk_waste",
          nodes = json.array{ "bulk_waste", "weather" } },
    line{ message = "폐건전지 수거함 어디 있어?", intent = "collection_point",
          user_location = "서울", nodes = json.array{ "collection_point", "weather" } },
    "",
    line{ message = "종이 어떻게 버려? 그리고 수거함도 알려줘", intent = "waste",
          additional_intents = json.array{ "collection_point" },
          nodes = json.array{ "collection_point", "waste_rag", "weather" } },
    -- labelled wrong on purpose: the classifier says image_generation
    line{ message = "분리배출 방법을 인포그래픽으로 만들어줘", intent = "waste" },
    line{ message = "팔 수 있어?", prev_intent = "bulk_waste", intent = "recyclable_price",
          nodes = json.array{ "recyclable_price" } },
  }

  local report
  setup(function() report = assert(eval.eval(lines)) end)

  it("counts intent accuracy over every case", function()
    assert.equal(5, report.total)
    assert.same({ correct = 4, total = 5, accuracy = 0.8 }, report.intent)
  end)

  it("compares additional intents as sets, none expected when absent", function()
    assert.equal(5, report.additional_intents.correct)
  end)

  it("compares node sets only where the line gives them", function()
    assert.equal(4, report.nodes.total)
    assert.equal(4, report.nodes.correct)
    assert.equal(1, report.nodes.accuracy)
  end)

  it("computes per-intent precision and recall", function()
    local w = report.per_intent
    assert.same({ support = 2, predicted = 1, correct = 1, precision = 1, recall = 0.5 }, w.waste)
    assert.same({ support = 0, predicted = 1, correct = 0, precision = 0, recall = cjson.null },
      w.image_generation)
    assert.is_nil(w.general)
  end)

  it("fills the confusion matrix, expected by predicted", function()
    assert.equal(1, report.confusion.waste.image_generation)
    assert.equal(1, report.confusion.bulk_waste.bulk_waste)
  end)

  it("lists the failing cases with their line numbers", function()
    assert.equal(1, #report.failures)
    local f = report.failures[1]
    assert.equal(5, f.line)
    assert.same({ "intent" }, f.wrong)
    assert.equal("waste", f.expected.intent)
    assert.equal("image_generation", f.got.intent)
    assert.same({ "image_generation" }, f.got.nodes)
  end)

  it("writes a text report", function()
    local text = eval.text(report)
    assert.matches("intent accuracy:%s+80.0%%  %(4/5%)", text)
    assert.matches("node set exact match:%s+100.0%%  %(4/4%)", text)
    assert.matches("confusion matrix", text, 1, true)
    assert.matches("line 5: 분리배출 방법을 인포그래픽으로 만들어줘", text, 1, true)
  end)

  it("writes a JSON report on one line", function()
    local s = eval.json(report)
    assert.is_nil(s:find("\n"))
    local back = cjson.decode(s)
    assert.equal(0.8, back.intent.accuracy)
    assert.equal(1, #back.failures)
  end)

  it("prints an empty failure list as []", function()
    local r = assert(eval.eval({ lines[1] }))
    assert.matches('"failures":[]', eval.json(r), 1, true)
  end)

  describe("progress bar", function()
    it("is drawn on a terminal", function()
      local out = {}
      assert(eval.eval({ lines[1], lines[2] }, { is_tty = true, write = function(s) out[#out + 1] = s end }))
      assert.equal(3, #out)
      assert.matches("^\r%[#+%-+%] 1/2$", out[1])
      assert.matches("^\r%[#+%] 2/2$", out[2])
      assert.equal("\n", out[3])
    end)

    it("is not drawn otherwise", function()
      local out = {}
      assert(eval.eval({ lines[1] }, { is_tty = false, write = function(s) out[#out + 1] = s end }))
      assert.equal(0, #out)
    end)
  end)

  describe("bad input", function()
    it("names a line that is not JSON", function()
      local r, err = eval.eval({ lines[1], "{oops" })
      assert.is_nil(r)
      assert.equal("line 2: not a JSON object", err)
    end)

    it("names an unknown intent", function()
      local r, err = eval.eval({ line{ message = "안녕", intent = "weather" } })
      assert.is_nil(r)
      assert.equal("line 1: \"intent\" must be one of the intents, got weather", err)
    end)

    it("names a missing message", function()
      local _, err = eval.eval({ "", line{ intent = "general" } })
      assert.equal("line 2: \"message\" must be a non-empty string", err)
    end)

    it("names an unknown previous intent", function()
      local _, err = eval.eval({ line{ message = "안녕", intent = "general", prev_intent = "x" } })
      assert.equal("line 1: unknown \"prev_intent\" x", err)
    end)

    it("needs at least one case", function()
      local r, err = eval.eval({ "", "  " })
      assert.is_nil(r)
      assert.equal("no cases to evaluate", err)
    end)
  end)

  describe("on the routing check set", function()
    it("shares no message with the training data", function()
      local classifier = require "nodes.lib.intent_model"
      local function norm(m) return (m:gsub("[%s%p]", "")) end
      local taught, n_taught = {}, 0
      for _, o in ipairs(assert(classifier.read_jsonl(classifier.default_data_path()))) do
        taught[norm(o.message)] = true
        n_taught = n_taught + 1
      end
      local checks = assert(classifier.read_jsonl("spec/fixtures/routing_check.jsonl"))
      assert.is_true(n_taught > 0 and #checks > 0, n_taught .. " training lines, " .. #checks .. " check lines")
      for _, o in ipairs(checks) do
        assert.is_nil(taught[norm(o.message)], o.message)
      end
    end)

    it("reaches 95% intent accuracy and 90% node-set match offline", function()
      local ls = assert(eval.read_lines("spec/fixtures/routing_check.jsonl"))
      local r = assert(eval.eval(ls))
      assert.is_true(r.intent.accuracy >= 0.95, eval.text(r))
      assert.is_true(r.nodes.accuracy >= 0.90, eval.text(r))
    end)
  end)
end)

describe("eco explain", function()
  it("tells scores, boost, keywords and each Send with its rule", function()
    local lines, obj = explain.explain("팔 수 있어?", { prev_intent = "bulk_waste" })
    local text = table.concat(lines, "\n")
    assert.matches("source: offline classifier (no LLM configured)", text, 1, true)
    assert.matches("recyclable_price%s+0%.%d+ [#.]+  boost %+0%.08", text)
    assert.matches("transition boost from bulk_waste: location +0.12, recyclable_price +0.08", text, 1, true)
    assert.matches("keyword adjustment: -0.10 (no keyword of recyclable_price)", text, 1, true)
    assert.matches("confidence: ", text, 1, true)
    assert.matches('Send("recyclable_price")  rule=primary', text, 1, true)
    assert.equal("recyclable_price", obj.intent)
  end)

  it("shows clauses and every rule of a multi-intent message with a location", function()
    local lines, obj = explain.explain("종이 어떻게 버려? 그리고 수거함도 알려줘", { location = "서울 강남구" })
    local text = table.concat(lines, "\n")
    assert.matches('"수거함도 알려줘" -> collection_point', text, 1, true)
    assert.matches('Send("collection_point")  rule=multi_intent', text, 1, true)
    assert.matches('Send("weather")  rule=enrichment:waste->weather', text, 1, true)
    assert.same({ "collection_point", "waste_rag", "weather" }, obj.nodes)
  end)

  it("adds the decision as JSON on the last line", function()
    local lines = explain.explain("캐릭터 어떻게 얻어?", { json = true, location = "부산" })
    local obj = cjson.decode(lines[#lines])
    assert.equal("character", obj.intent)
    assert.same({}, obj.additional_intents)
    assert.same({ "character" }, obj.nodes)
    assert.is_number(obj.confidence)
    assert.matches('"additional_intents":[]', lines[#lines], 1, true)
  end)

  it("uses router options", function()
    local _, obj = explain.explain("페트병 어떻게 버려?", { router = { enable_enrichment = false } })
    assert.same({ "waste_rag" }, obj.nodes)
  end)

  describe("commands", function()
    local function sink()
      local buf = {}
      return { write = function(_, ...) for _, s in ipairs{ ... } do buf[#buf + 1] = s end end,
               text = function() return table.concat(buf) end }
    end

    it("route prints the explanation and ends with the JSON decision", function()
      local out, err = sink(), sink()
      local code = route_command.main({ "--location", "서울", "--json", "폐건전지 수거함 어디 있어?" },
        { stdout = out, stderr = err })
      assert.equal(0, code)
      assert.equal("", err.text())
      local obj = cjson.decode(out.text():match("([^\n]+)\n$"))
      assert.same({ "collection_point", "weather" }, obj.nodes)
    end)

    it("route reports bad usage with status 2", function()
      local err = sink()
      assert.equal(2, route_command.main({ "--prev-intent" }, { stdout = sink(), stderr = err }))
      assert.matches("--prev-intent needs a value", err.text(), 1, true)
      assert.equal(2, route_command.main({}, { stdout = sink(), stderr = sink() }))
      assert.equal(2, route_command.main({ "--verbose", "x" }, { stdout = sink(), stderr = sink() }))
      assert.equal(2, route_command.main({ "a", "b" }, { stdout = sink(), stderr = sink() }))
    end)

    it("eval draws its progress bar on stderr only on a terminal", function()
      local out, err = sink(), sink()
      assert.equal(0, eval_command.main({ "--json", "spec/fixtures/routing_check.jsonl" },
        { stdout = out, stderr = err, is_tty = true }))
      assert.matches("^\r%[", err.text())
      assert.is_number(cjson.decode(out.text()).nodes.accuracy)
      local quiet = sink()
      assert.equal(0, eval_command.main({ "spec/fixtures/routing_check.jsonl" }, { stdout = sink(), stderr = quiet }))
      assert.equal("", quiet.text())
    end)

    it("eval names a bad line with status 1", function()
      local path = tmp.file('{"message": "안녕", "intent": "general"}\n{"message": 3}\n', "cases.jsonl")
      local err = sink()
      local code = eval_command.main({ path }, { stdout = sink(), stderr = err })
      assert.equal(1, code)
      assert.matches(': line 2: "message" must be a non-empty string', err.text(), 1, true)
    end)
  end)

  describe("through the moongraph executable, from any directory", function()
    local function moongraph(args)
      local bin = cli.bin:sub(1, 1) == "/" and cli.bin or (os.getenv("PWD") .. "/" .. cli.bin)
      local q = {}
      for i, a in ipairs(args) do q[i] = cli.quote(a) end
      local spec = os.getenv("PWD") .. "/spec/fixtures/routing_check.jsonl"
      local cmd = "cd / && env MOONGRAPH_LLM_BASE_URL= MOONGRAPH_LLM_API_KEY= " .. cli.quote(bin) .. " " ..
        table.concat(q, " "):gsub("SPEC_FILE", spec)
      return run(cmd)
    end

    it("route prints the explanation and the JSON decision", function()
      local out, code = moongraph { "route", "--prev-intent", "bulk_waste", "--json", "팔 수 있어?" }
      assert.equal(0, code, out)
      local obj = cjson.decode(out:match("([^\n]+)\n$"))
      assert.equal("recyclable_price", obj.intent)
      assert.same({ "recyclable_price" }, obj.nodes)
    end)

    it("route rejects an unknown previous intent as bad usage", function()
      local out, code = moongraph { "route", "--prev-intent", "nope", "안녕" }
      assert.equal(2, code)
      assert.matches("route: unknown --prev-intent 'nope' (known: waste,", out, 1, true)
    end)

    it("eval reports on a file, as text or JSON", function()
      local out, code = moongraph { "eval", "SPEC_FILE" }
      assert.equal(0, code, out)
      assert.matches("intent accuracy:", out, 1, true)
      local js, jcode = moongraph { "eval", "--json", "SPEC_FILE" }
      assert.equal(0, jcode, js)
      assert.is_number(cjson.decode(js).intent.accuracy)
    end)

    it("eval names a file it cannot read", function()
      local out, code = moongraph { "eval", "/nonexistent.jsonl" }
      assert.equal(1, code)
      assert.matches("eval: ", out, 1, true)
    end)
  end)
end)
