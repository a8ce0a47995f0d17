local mg = require "moongraph"
local cli = require "cli"
local tmp = require "tmp"
local gcri = require "scripts.gcri.graph"
local states = require "scripts.gcri.states"
local aggregator = require "scripts.gcri.aggregator"
local puzzle = require "scripts.gcri.puzzle"
local json = require "cjson"

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function run(app, task, opts)
  return mg.run(function() return app:invoke(gcri.input(task, opts)) end)
end

-- deterministic strategies: name -> fixed hypothesis text (nil: none)
local function fixed(list, seen)
  local out = {}
  for i, e in ipairs(list) do
    out[i] = { name = e[1], description = "says " .. tostring(e[2]), hypothesize = function(task, b)
      if seen then seen[#seen + 1] = { name = e[1], index = b.index, count = b.count,
        container_id = b.container_id, task = task, rejected = #b.memory.rejected } end
      return e[2], "fixed answer of " .. e[1]
    end }
  end
  return out
end

local function accept(answer)
  return function(_, hyp)
    return hyp == answer, hyp == answer and "right" or ("wrong: " .. hyp), hyp == answer and 1 or 0
  end
end

describe("GCRI state types", function()
  it("check their fields and fill defaults", function()
    local b = states.AggregatedBranch { index = 1, combined_hypothesis = "x", source_indices = { 1, 3 } }
    assert.equal("", b.merge_reasoning)
    local r = states.AggregationResult { branches = { b }, aggregation_summary = "s" }
    assert.same({}, r.discarded_indices)
    assert.has_error(function() states.RawHypothesis { index = 1 } end,
      "RawHypothesis: field 'count' is required")
    assert.has_error(function() states.AggregatedBranch { index = 1.5, combined_hypothesis = "x", source_indices = {} } end,
      "AggregatedBranch: field 'index' must be int, got number")
    assert.has_error(function() states.HypothesisResult { bogus = true } end, "HypothesisResult: unknown field 'bogus'")
    assert.has_error(function() states.BranchState { index = 1, count = 1, strategy = { name = "s" },
      container_id = "/w", task = "t" } end, "BranchState: field 'strategy' must be valid, got table")
  end)

  it("TaskState appends raw_hypotheses and results by reducer", function()
    local schema = states.TaskState()
    assert.equal(mg.reducers.append, schema.raw_hypotheses)
    assert.equal(mg.reducers.append, schema.results)
    assert.equal("last", schema.final_decision)
  end)
end)

describe("GCRI number puzzles (the offline strategies' domain)", function()
  it("verifies exactly, with fractions", function()
    assert.is_true((puzzle.check("make 24 from 3 3 8 8", "8/(3-8/3)")))
    assert.same({ false, "evaluates to 28, not 24" }, { puzzle.check("make 24 from 4 7 8 8", "4*7-8+8") })
    assert.same({ false, "uses 4 7 8 instead of 4 7 8 8" }, { puzzle.check("make 24 from 4 7 8 8", "4*7-8") })
    assert.is_false((puzzle.check("make 24 from 4 7 8 8", "os.exit()")))
  end)

  it("the exhaustive search finds a solution the checker accepts", function()
    local e = puzzle.search({ 3, 3, 8, 8 }, 24)
    assert.is_true((puzzle.check("make 24 from 3 3 8 8", e)))
    assert.is_nil(puzzle.search({ 1, 2, 3 }, 1000))
  end)
end)

describe("GCRI aggregation", function()
  local function raw(i, text) return { index = i, count = 1, hypothesis = text } end

  it("merges hypotheses with equal normalised text and keeps the discarded indices", function()
    local r = aggregator.offline { raw(1, "(4 + 7 - 8) * 8"), raw(2, ""), raw(3, "(4+7-8)*8."), raw(4, "4 * (7 - 8/8)"),
      raw(5, "   ") }
    assert.equal(2, #r.branches)
    assert.same({ 1, 3 }, r.branches[1].source_indices)
    assert.equal("(4 + 7 - 8) * 8", r.branches[1].combined_hypothesis)
    assert.equal("hypotheses 1, 3 are the same after normalisation", r.branches[1].merge_reasoning)
    assert.same({ 4 }, r.branches[2].source_indices)
    assert.equal(2, r.branches[2].index)
    assert.same({ 2, 5 }, r.discarded_indices)
    assert.equal("5 hypotheses -> 2 branches (1 merged from several), 2 discarded (no hypothesis: 2, 5)",
      r.aggregation_summary)
  end)

  it("normalisation ignores case, spacing and a final full stop, nothing else", function()
    assert.equal(aggregator.normalise("Use A  Cache ."), aggregator.normalise("use a cache"))
    assert.not_equal(aggregator.normalise("use a cache"), aggregator.normalise("use the cache"))
  end)

  it("refuses an LLM merge that does not account for every hypothesis exactly once", function()
    local raws = { raw(1, "a"), raw(2, "b"), raw(3, "c") }
    assert.same({ nil, "hypothesis 3 is neither in a branch nor discarded" }, { aggregator.validate({
      branches = { { combined_hypothesis = "a or b", source_indices = { 1, 2 } } } }, raws) })
    assert.same({ nil, "hypothesis 1 is used twice" }, { aggregator.validate({
      branches = { { combined_hypothesis = "a", source_indices = { 1 } } }, discarded_indices = { 1, 2, 3 } }, raws) })
    local ok = aggregator.validate({ branches = { { combined_hypothesis = "a/b", source_indices = { 2, 1 } } },
      discarded_indices = { 3 }, aggregation_summary = "merged" }, raws)
    assert.same({ 1, 2 }, ok.branches[1].source_indices)
    assert.same({ 3 }, ok.discarded_indices)
  end)
end)

describe("GCRI workflow", function()
  it("is a main graph with the two compiled branch subgraphs as nodes", function()
    local m = gcri.build {}:mermaid()
    assert.matches('n_hypothesis_executor%[%["hypothesis_executor"%]%]', m)
    assert.matches('n_verification_executor%[%["verification_executor"%]%]', m)
    assert.matches("n_update_memory %-%.%-> n_sample_strategies", m)
  end)

  it("sends one hypothesis branch per strategy, each with its own index, strategy and workspace", function()
    local dir, seen = tmp.dir("gcri"), {}
    local app = gcri.build { strategies = fixed({ { "s1", "A" }, { "s2", "B" }, { "s3", "C" } }, seen),
      verify = accept("B") }
    local out = run(app, "pick a letter", { branches = 3, run_dir = dir })
    table.sort(seen, function(a, b) return a.index < b.index end)
    assert.equal(3, #seen)
    for i, s in ipairs(seen) do
      assert.equal(i, s.index)
      assert.equal("s" .. i, s.name)
      assert.equal(dir .. "/iter-1/branch-" .. i, s.container_id)
      assert.equal("pick a letter", s.task)
      assert.equal(({ "A", "B", "C" })[i], slurp(s.container_id .. "/hypothesis.txt"))
    end
    assert.equal(3, #out.raw_hypotheses)
    assert.is_true(out.final_decision)
    assert.equal("B", out.answer)
  end)

  it("reuses workspaces for verification: a single source its own, a merged branch its first source's", function()
    local dir = tmp.dir("gcri")
    local app = gcri.build { verify = accept("none"), strategies = fixed {
      { "s1", "Same idea" }, { "s2", "other" }, { "s3", "same  IDEA." }, { "s4", nil } } }
    local out = run(app, "t", { branches = 4, max_iterations = 1, run_dir = dir })
    local agg = out.aggregation
    assert.same({ 4 }, agg.discarded_indices)
    assert.equal(2, #agg.branches)
    assert.same({ 1, 3 }, agg.branches[1].source_indices)
    assert.same({ 2 }, agg.branches[2].source_indices)
    assert.same({ dir .. "/iter-1/branch-1", dir .. "/iter-1/branch-2" }, out.verification_container_map)
    -- the verification branches worked in those workspaces
    assert.equal("Same idea", slurp(dir .. "/iter-1/branch-1/candidate.txt"))
    local v = json.decode(slurp(dir .. "/iter-1/branch-1/verification.json"))
    assert.same({ 1, 3 }, v.source_indices)
    assert.is_nil(slurp(dir .. "/iter-1/branch-3/verification.json"))   -- merged away
    assert.equal(2, #out.results)
  end)

  it("decide starts another iteration until accepted; update_memory makes it avoid what was tried", function()
    local dir, seen = tmp.dir("gcri"), {}
    local app = gcri.build { verify = accept("right"), strategies = fixed({
      { "a", "wrong 1" }, { "b", "wrong 2" }, { "c", "right" }, { "d", "wrong 3" }, { "e", "not reached" } }, seen) }
    local out = run(app, "t", { branches = 2, max_iterations = 3, run_dir = dir })
    assert.equal(2, out.count)
    assert.is_true(out.final_decision)
    assert.equal("right", out.answer)
    assert.same({ "a", "b", "c", "d" }, out.memory.tried_strategies)
    assert.same({ { count = 1, hypothesis = "wrong 1", feedback = "wrong: wrong 1" },
      { count = 1, hypothesis = "wrong 2", feedback = "wrong: wrong 2" },
      { count = 2, hypothesis = "wrong 3", feedback = "wrong: wrong 3" } }, out.memory.rejected)
    assert.equal(2, #out.memory.decisions)
    assert.is_false(out.memory.decisions[1].accepted)
    assert.is_true(out.memory.decisions[2].accepted)
    -- iteration 2's branches saw iteration 1's rejections
    assert.equal(4, #seen)
    for _, s in ipairs(seen) do
      assert.equal(s.count == 1 and 0 or 2, s.rejected)
    end
    -- results of both iterations are kept, tagged with their iteration
    local counts = {}
    for _, r in ipairs(out.results) do counts[#counts + 1] = r.count end
    table.sort(counts)
    assert.same({ 1, 1, 2, 2 }, counts)
  end)

  it("the decide loop is bounded by max_iterations", function()
    local dir = tmp.dir("gcri")
    local list = {}
    for i = 1, 10 do list[i] = { "s" .. i, "wrong " .. i } end
    local app = gcri.build { verify = accept("right"), strategies = fixed(list) }
    local out = run(app, "t", { branches = 1, max_iterations = 4, run_dir = dir })
    assert.equal(4, out.count)
    assert.is_false(out.final_decision)
    assert.is_nil(out.answer)
    assert.equal(4, #out.memory.decisions)
  end)

  it("ends when no untried strategy is left", function()
    local dir = tmp.dir("gcri")
    local app = gcri.build { verify = accept("right"), strategies = fixed { { "only", "wrong" } } }
    local out = run(app, "t", { branches = 2, max_iterations = 5, run_dir = dir })
    assert.equal(2, out.count)
    assert.is_false(out.final_decision)
    assert.equal("no untried strategy left", out.memory.decisions[2].summary)
  end)

  it("solves a number puzzle offline with the built-in strategies, under a checkpointer too", function()
    local dir = tmp.dir("gcri")
    local app = gcri.build { checkpointer = mg.checkpoint.memory() }
    local out = mg.run(function()
      return app:invoke(gcri.input("make 24 from 4 7 8 8", { run_dir = dir }), { thread_id = "g1" })
    end)
    assert.is_true(out.final_decision)
    assert.is_true((puzzle.check("make 24 from 4 7 8 8", out.answer)))
    assert.equal(2, out.count)              -- the greedy guesses of iteration 1 are rejected
    assert.equal(1, #out.aggregation.branches)   -- both searches found the same expression
    assert.same({ 1, 2 }, out.aggregation.branches[1].source_indices)
  end)

  it("input checks its options", function()
    assert.has_error(function() gcri.input("") end, "bad argument #1 to 'input': task text expected")
    assert.has_error(function() gcri.input("t", { branches = 0 }) end,
      "bad argument #2 to 'input': branches must be a positive integer")
    assert.has_error(function() gcri.input("t", { max_iterations = 11 }) end,
      "bad argument #2 to 'input': max_iterations must be an integer from 1 to 10")
  end)
end)

describe("moongraph gcri", function()
  local OFFLINE = "env -u MOONGRAPH_LLM_BASE_URL -u MOONGRAPH_LLM_API_KEY"

  it("runs offline and leaves the workspaces and result.json in the run directory", function()
    local dir = tmp.dir("gcri")
    local r = cli.run({ "gcri", "--run-dir", dir, "make 24 from 4 7 8 8" }, { env = OFFLINE })
    assert.equal(0, r.code)
    assert.matches("iteration 2: strategies search_in_order, search_multiply_first", r.out)
    assert.matches("branch 1 <%- hypotheses 1,2, workspace " .. dir:gsub("%p", "%%%0") .. "/iter%-2/branch%-1", r.out)
    assert.matches("answer: %(4 %+ 7 %- 8%) %* 8 %(iteration 2%)", r.out)
    local res = json.decode(slurp(dir .. "/result.json"))
    assert.is_true(res.accepted)
  end)

  it("exits 3 when nothing is accepted, 1 for a task offline strategies cannot take, 2 on bad usage", function()
    local dir = tmp.dir("gcri")
    assert.equal(3, cli.run({ "gcri", "--run-dir", dir, "--max-iterations", "1", "make 1000 from 1 2 3" },
      { env = OFFLINE }).code)
    local r = cli.run({ "gcri", "write a poem" }, { env = OFFLINE })
    assert.equal(1, r.code)
    assert.matches("number puzzles", r.err)
    assert.equal(2, cli.run({ "gcri", "--bogus", "x" }, { env = OFFLINE }).code)
    assert.equal(2, cli.run({ "gcri" }, { env = OFFLINE }).code)
  end)

  it("scripts/gcri/run.lua is the same command", function()
    local dir = tmp.dir("gcri")
    local r = cli.run({ "run", "scripts/gcri/run.lua", "--json", "--run-dir", dir, "make 24 from 3 3 8 8" },
      { env = OFFLINE })
    assert.equal(0, r.code)
    local res = json.decode(r.out)
    assert.is_true((puzzle.check("make 24 from 3 3 8 8", res.answer)))
  end)
end)

describe("GCRI with an LLM (OpenAI-compatible test server)", function()
  local testserver = require "testserver"
  local llm = require "moongraph.llm"
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)

  local function client()
    return assert(llm.new { base_url = srv.url .. "/v1", api_key = "k", model = "m", max_retries = 0 })
  end

  local HYP = { content = json.encode { hypothesis = "Cache the parsed config.", reasoning = "it is read on every call" } }

  it("samples strategies, drafts and refines per branch, merges and verifies through the model", function()
    mg.run(function()
      srv:reset()
      srv:script {
        { content = json.encode { strategies = { { name = "memoize", description = "cache results" },
          { name = "profile", description = "measure first" } } } },
        HYP, HYP, HYP, HYP,             -- two branches: hypothesis and refine each, in any order
        { content = json.encode { branches = { { combined_hypothesis = "Cache the parsed config.",
          source_indices = { 2, 1 }, merge_reasoning = "both say caching" } }, discarded_indices = {},
          aggregation_summary = "one idea" } },
        { content = json.encode { passed = true, score = 0.8, feedback = "addresses the hot path" } },
      }
    end)
    local dir = tmp.dir("gcri")
    local out = run(gcri.build { llm = client() }, "make the config loader faster", { run_dir = dir })
    assert.is_true(out.final_decision)
    assert.equal("Cache the parsed config.", out.answer)
    assert.equal("one idea", out.aggregation.aggregation_summary)
    assert.same({ 1, 2 }, out.aggregation.branches[1].source_indices)
    assert.same({ dir .. "/iter-1/branch-1" }, out.verification_container_map)
    assert.equal(0.8, out.results[1].score)
    local reqs = mg.run(function() return srv:requests("/v1/chat/completions") end)
    assert.equal(7, #reqs)
    assert.matches("Propose 2 distinct strategies", json.decode(reqs[1].body).messages[1].content)
  end)

  it("refuses a merge that loses a hypothesis and merges offline instead", function()
    mg.run(function()
      srv:reset()
      srv:script {
        { content = json.encode { strategies = { { name = "a", description = "x" }, { name = "b", description = "y" } } } },
        HYP, HYP, HYP, HYP,
        { content = json.encode { branches = { { combined_hypothesis = "x", source_indices = { 1 } } } } },
        { content = json.encode { passed = false, score = 0.1, feedback = "too vague" } },
      }
    end)
    local dir = tmp.dir("gcri")
    local out = run(gcri.build { llm = client() }, "make the config loader faster",
      { run_dir = dir, max_iterations = 1 })
    assert.matches("offline merge: the LLM's merge was refused: hypothesis 2 is neither in a branch nor discarded",
      out.aggregation.aggregation_summary)
    assert.same({ 1, 2 }, out.aggregation.branches[1].source_indices)
    assert.is_false(out.final_decision)
    assert.equal("too vague", out.memory.rejected[1].feedback)
  end)
end)
