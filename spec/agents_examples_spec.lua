local mg = require "moongraph"
local cli = require "cli"
local tmp = require "tmp"

local OFFLINE = "env -u MOONGRAPH_LLM_BASE_URL -u MOONGRAPH_LLM_API_KEY -u AB_SELECTED_AGENT -u AB_CONFIG -u PLANNING_MODE"

local function ask(app, text, extra)
  local input = { question = text, messages = { { role = "user", content = text } } }
  for k, v in pairs(extra or {}) do input[k] = v end
  local events = {}
  local final
  mg.run(function()
    for ev in app:stream(input, { modes = { "custom", "values" } }) do
      if ev.mode == "custom" then events[#events + 1] = ev.data.routing end
      if ev.mode == "values" then final = ev.data end
    end
  end)
  return final, events
end

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

describe("scripts/agents/fallback", function()
  local fallback = require "scripts.agents.fallback"

  it("without an LLM the primary fails before any output and the fallback answers from the FAQ", function()
    local out, events = ask(fallback.build {}, "how do I run the tests?")
    assert.equal("fallback", out.agent)
    assert.matches("make test", out.answer)
    assert.equal(1, #events)
    assert.matches("^primary failed %(no LLM configured", events[1])
  end)

  it("the fallback says so when the FAQ has nothing for the question", function()
    local out = ask(fallback.build {}, "what is the weather tomorrow")
    assert.equal("fallback", out.agent)
    assert.matches("none of its questions matches", out.answer)
  end)

  it("a failing fallback ends the routing with its own error", function()
    local app = fallback.build { fallback = function() error("faq file missing", 0) end }
    local ok, err = pcall(ask, app, "hi")
    assert.is_false(ok)
    assert.matches("faq file missing", err)
  end)

  it("runs from the command line", function()
    local r = cli.run({ "run", "scripts/agents/fallback.lua", "how do I start the REPL?" }, { env = OFFLINE })
    assert.equal(0, r.code)
    assert.matches("%[agent%] fallback", r.out)
    assert.matches("moongraph repl", r.out)
  end)
end)

describe("scripts/agents/ab_test", function()
  local ab = require "scripts.agents.ab_test"

  it("routes by the configuration file, read afresh on every call", function()
    local dir = tmp.dir()
    local path = dir .. "/ab.json"
    local function select_agent(key)
      local f = assert(io.open(path, "w"))
      f:write('{"selected_agent": "' .. key .. '"}')
      f:close()
    end
    local app = ab.build { config_path = path }
    select_agent("agent_a")
    local a = ask(app, "who are you?")
    select_agent("agent_b")
    local b = ask(app, "who are you?")
    assert.equal("agent_a", a.agent)
    assert.matches("^I am Agent A", a.answer)
    assert.equal("agent_b", b.agent)
    assert.matches("^I am Agent B", b.answer)
  end)

  it("a configuration naming no known agent is an error", function()
    local dir = tmp.dir()
    local path = dir .. "/ab.json"
    local f = assert(io.open(path, "w"))
    f:write('{"selected_agent": "agent_z"}')
    f:close()
    local ok, err = pcall(ask, ab.build { config_path = path }, "hi")
    assert.is_false(ok)
    assert.matches("selects 'agent_z'; expected agent_a or agent_b", err)
  end)

  it("AB_SELECTED_AGENT overrides the file from the command line", function()
    local r = cli.run({ "run", "scripts/agents/ab_test.lua", "who are you?" }, { env = OFFLINE .. " AB_SELECTED_AGENT=agent_b" })
    assert.equal(0, r.code)
    assert.matches("I am Agent B", r.out)
    r = cli.run({ "run", "scripts/agents/ab_test.lua", "who are you?" }, { env = OFFLINE })
    assert.equal(0, r.code, r.err)
    assert.matches("I am Agent A", r.out)   -- data/agents/ab_config.json
  end)
end)

describe("scripts/agents/planning", function()
  local planning = require "scripts.agents.planning"

  it("the basic agent writes; the planning agent only reads and answers with a plan", function()
    local dir = tmp.dir()
    local app = planning.build { dir = dir }
    local w = ask(app, "write notes.txt: buy milk")
    assert.equal("basic", w.agent)
    assert.equal("buy milk", slurp(dir .. "/notes.txt"))
    local p, events = ask(app, "write notes.txt: buy bread", { mode = "planning" })
    assert.equal("planning", p.agent)
    assert.matches("read%-only", p.answer)
    assert.matches("notes.txt exists %(8 bytes%)", p.answer)
    assert.equal("buy milk", slurp(dir .. "/notes.txt"))     -- unchanged
    assert.same({ "planning mode on: planning agent" }, events)
    local r = ask(app, "read notes.txt", { mode = "planning" })
    assert.equal("notes.txt:\nbuy milk", r.answer)
  end)

  it("paths stay inside the workspace", function()
    local dir = tmp.dir()
    local out = ask(planning.build { dir = dir }, "read ../../etc/passwd")
    assert.matches("leaves the workspace", out.answer)
  end)

  it("runs from the command line in both modes", function()
    local dir = tmp.dir()
    local r = cli.run({ "run", "scripts/agents/planning.lua", "--dir", dir, "write a.txt: one" }, { env = OFFLINE })
    assert.equal(0, r.code)
    assert.matches("wrote 3 bytes to a.txt", r.out)
    r = cli.run({ "run", "scripts/agents/planning.lua", "--dir", dir, "--plan", "write a.txt: two" }, { env = OFFLINE })
    assert.equal(0, r.code)
    assert.matches("%[agent%] planning", r.out)
    assert.equal("one", slurp(dir .. "/a.txt"))
  end)
end)

describe("scripts/agents/complexity", function()
  local complexity = require "scripts.agents.complexity"

  it("the offline classifier follows its rule table", function()
    assert.equal("simple", complexity.offline_classify("what time is it?").label)
    assert.equal("complex", complexity.offline_classify("Compare Redis and Postgres").label)
    assert.equal("complex", complexity.offline_classify("레디스 장단점 알려줘").label)
    assert.equal("complex", complexity.offline_classify("where is it? when does it open?").label)
    local long = string.rep("word ", 26)
    local c = complexity.offline_classify(long)
    assert.equal("complex", c.label)
    assert.equal("26 words (more than 25)", c.reason)
  end)

  it("routes simple and complex requests to their agents and records the classification", function()
    local app = complexity.build {}
    local s = ask(app, "what time is it?")
    local c, events = ask(app, "explain why the sky is blue")
    assert.equal("simple", s.agent)
    assert.equal("complex", c.agent)
    assert.same({ label = "complex", reason = "asks for analysis ('why')", source = "rules" }, c.classification)
    assert.same({ "complex (rules: asks for analysis ('why'))" }, events)
  end)

  it("runs from the command line", function()
    local r = cli.run({ "run", "scripts/agents/complexity.lua", "analyze the trade-offs of async durability" },
      { env = OFFLINE })
    assert.equal(0, r.code)
    assert.matches("%[agent%] complex", r.out)
  end)
end)

describe("scripts/agents with an LLM (OpenAI-compatible test server)", function()
  local testserver = require "testserver"
  local llm = require "moongraph.llm"
  local json = require "cjson"
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)

  local function client()
    return assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m", max_retries = 0 })
  end
  local function script(replies) mg.run(function() srv:reset(); srv:script(replies) end) end
  local function requests()
    local reqs = mg.run(function() return srv:requests("/v1/chat/completions") end)
    for i, r in ipairs(reqs) do reqs[i] = json.decode(r.body) end
    return reqs
  end

  it("fallback: the primary answers with the LLM when it can", function()
    script { { content = "Run make test." } }
    local out, events = ask(require("scripts.agents.fallback").build { llm = client() }, "how do I test?")
    assert.equal("primary", out.agent)
    assert.equal("Run make test.", out.answer)
    assert.same({}, events)
  end)

  it("fallback: the primary's tokens reach the stream; a failure after the first token is not failed over", function()
    script { { content = "partial reply here", fault = "truncate" } }
    local app = require("scripts.agents.fallback").build { llm = client() }
    local tokens = {}
    local ok, err = pcall(mg.run, function()
      for ev in app:stream({ question = "q", messages = { { role = "user", content = "q" } } },
        { modes = { "messages" } }) do
        tokens[#tokens + 1] = ev.data
      end
    end)
    assert.is_false(ok)
    assert.matches("truncated response", err)
    assert.same({ "partial " }, tokens)
    assert.equal(1, #requests())
  end)

  it("fallback: an LLM error before any output sends the question to the FAQ agent", function()
    script { { status = 400, json = { error = { message = "model not found" } } } }
    local out, events = ask(require("scripts.agents.fallback").build { llm = client() }, "how do I run the tests?")
    assert.equal("fallback", out.agent)
    assert.matches("make test", out.answer)
    assert.matches("model not found", events[1])
  end)

  it("complexity: the classifier call decides, then the chosen agent answers on its model", function()
    script { { content = "complex" }, { content = "A long analysis." } }
    local app = require("scripts.agents.complexity").build { llm = client(), complex_model = "big-model" }
    local out, events = ask(app, "hi")
    assert.equal("complex", out.agent)
    assert.equal("A long analysis.", out.answer)
    assert.same({ label = "complex", reason = "classifier replied 'complex'", source = "llm" }, out.classification)
    assert.same({ "complex (llm: classifier replied 'complex')" }, events)
    local reqs = requests()
    assert.matches("Classify this request as 'simple' or 'complex'", reqs[1].messages[2].content)
    assert.equal("m", reqs[1].model)
    assert.equal("big-model", reqs[2].model)
  end)

  it("complexity: a failed classifier call falls back to the rules", function()
    script { { status = 400, json = { error = { message = "nope" } } }, { content = "Short answer." } }
    local out = ask(require("scripts.agents.complexity").build { llm = client() }, "what time is it?")
    assert.equal("simple", out.agent)
    assert.equal("rules", out.classification.source)
    assert.matches("classifier call failed", out.classification.reason)
  end)

  it("planning: the LLM picks a tool from the agent's own list only", function()
    local dir = tmp.dir()
    script { { content = json.encode { tool = "write_file", path = "plan.txt", content = "step 1" } },
             { content = json.encode { tool = "read_file", path = "plan.txt" } } }
    local app = require("scripts.agents.planning").build { llm = client(), dir = dir }
    local w = ask(app, "save step 1 to plan.txt")
    assert.equal("wrote 6 bytes to plan.txt", w.answer)
    local r = ask(app, "what is in plan.txt?", { mode = "planning" })
    assert.equal("plan.txt:\nstep 1", r.answer)
    local reqs = requests()
    local enum1 = reqs[1].response_format.json_schema.schema.properties.tool.enum
    local enum2 = reqs[2].response_format.json_schema.schema.properties.tool.enum
    assert.same({ "read_file", "write_file", "none" }, enum1)
    assert.same({ "read_file", "none" }, enum2)
  end)
end)
