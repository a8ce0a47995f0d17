--[[
The GCRI multi-branch workflow: hypothesis generation in parallel branches,
aggregation, verification of the aggregated branches, decision, memory.

  local gcri = require "scripts.gcri.graph"
  local app = gcri.build { llm = client_or_nil }
  local out = app:invoke(gcri.input("make 24 from 4 7 8 8", { run_dir = "/tmp/gcri" }))

Main graph (state: states.TaskState):

  sample_strategies -> Send one hypothesis_executor per strategy
  hypothesis_executor (subgraph: hypothesis -> reasoning_and_refine)
  aggregate_hypotheses -> Send one verification_executor per aggregated branch
  verification_executor (subgraph: verify)
  collect_verification -> decide -> update_memory -> END or sample_strategies

Each hypothesis branch works in its own workspace directory
(scripts/gcri/sandbox.lua); a verification branch reuses the workspace of
its branch's (first) source, recorded in verification_container_map.

Offline (no LLM, or opts.strategies given) the strategies are deterministic
functions (scripts/gcri/strategies.lua, number puzzles) and the
aggregation merges hypotheses with equal normalised text. With an LLM the
strategies, hypotheses, refinements, merge and verification come from the
model (prompts/gcri/*.txt); a number puzzle is always verified exactly.
]]

local mg = require "moongraph"
local json = require "cjson.safe"
local prompts = require "moongraph.prompt"
local states = require "scripts.gcri.states"
local sandbox = require "scripts.gcri.sandbox"
local aggregator = require "scripts.gcri.aggregator"
local puzzle = require "scripts.gcri.puzzle"

local Send, START, END = mg.Send, mg.START, mg.END

local _M = {}

_M.DEFAULTS = { branches = 2, max_iterations = 3, run_dir = ".moongraph/gcri/run" }

---------------------------------------------------------------------------
-- LLM helpers

local function reply_text(res)
  if type(res) == "string" then return res end
  if type(res) ~= "table" then return nil end
  if type(res.content) == "string" then return res.content end
  if type(res.text) == "string" then return res.text end
  if type(res.message) == "table" and type(res.message.content) == "string" then return res.message.content end
  local c = type(res.choices) == "table" and res.choices[1]
  if type(c) == "table" and type(c.message) == "table" then return c.message.content end
  return nil
end

-- ask(llm, prompt_name, vars, schema) -> decoded JSON object | nil, err
local function ask(llm, name, vars, schema)
  local text, perr = prompts.file("gcri/" .. name .. ".txt", vars)
  if not text then return nil, perr end
  local res, err = llm:chat {
    messages = { { role = "user", content = text } },
    json_schema = schema,
  }
  if not res then return nil, "LLM call failed: " .. tostring(err) end
  if type(res) == "table" and type(res.json) == "table" then return res.json end
  local text = reply_text(res)
  if not text then return nil, "the LLM returned no text" end
  local obj = json.decode(text) or json.decode(text:match("%b{}") or "")
  if type(obj) ~= "table" then return nil, "the LLM reply is not JSON: " .. text:sub(1, 200) end
  return obj
end

local function must_ask(llm, name, vars, schema)
  local obj, err = ask(llm, name, vars, schema)
  if not obj then error("gcri " .. name .. ": " .. err, 0) end
  return obj
end

local function lines_of(list, fmt)
  if not list or #list == 0 then return "(none)" end
  local out = {}
  for i, v in ipairs(list) do out[i] = "- " .. fmt(v) end
  return table.concat(out, "\n")
end

local function rejected_text(memory)
  return lines_of(memory and memory.rejected, function(r)
    return r.hypothesis .. " (" .. r.feedback .. ")"
  end)
end

local STR = { type = "string" }

---------------------------------------------------------------------------
-- memory

local function empty_memory() return { tried_strategies = {}, rejected = {}, decisions = {} } end

local function copy_memory(m)
  m = m or empty_memory()
  local out = empty_memory()
  for k in pairs(out) do
    for i, v in ipairs(m[k] or {}) do out[k][i] = v end
  end
  return out
end

local function of_count(list, count)
  local out = {}
  for _, v in ipairs(list or {}) do
    if v.count == count then out[#out + 1] = v end
  end
  return out
end

---------------------------------------------------------------------------
-- the two branch subgraphs

local function hypothesis_branch(env)
  local g = mg.graph {
    "index", "count", "strategy", "container_id", "task", "memory", "hypothesis", "reasoning",
    "raw_hypotheses",
  }
  g:add_node("hypothesis", function(s)
    local b = states.BranchState(s)
    local hyp, why
    if env.offline then
      local strat = env.registry[b.strategy.name]
      if not strat then error("gcri: no offline strategy named '" .. b.strategy.name .. "'", 0) end
      hyp, why = strat.hypothesize(b.task, b)
    else
      local obj = must_ask(env.llm, "hypothesis", {
        task = b.task, strategy_name = b.strategy.name, strategy_description = b.strategy.description,
        rejected = rejected_text(b.memory),
      }, { type = "object", properties = { hypothesis = STR, reasoning = STR }, required = { "hypothesis" } })
      hyp, why = obj.hypothesis, obj.reasoning
    end
    hyp = type(hyp) == "string" and hyp or ""
    why = type(why) == "string" and why or ""
    sandbox.write_json(b.container_id, "strategy.json", b.strategy)
    sandbox.write(b.container_id, "hypothesis.txt", hyp)
    return { hypothesis = hyp, reasoning = why }
  end)
  g:add_node("reasoning_and_refine", function(s)
    local hyp, why = s.hypothesis, s.reasoning
    if hyp ~= "" then
      if env.offline then
        local p = puzzle.parse(s.task)
        if p then
          local v, detail = puzzle.evaluate(hyp)
          why = why .. "; self-check: " .. (v and ("evaluates to " .. puzzle.fraction_string(v) ..
            " (target " .. p.target .. ")") or ("does not parse: " .. detail))
        end
      else
        local obj = must_ask(env.llm, "refine", {
          task = s.task, strategy_name = s.strategy.name, hypothesis = hyp, reasoning = why,
        }, { type = "object", properties = { hypothesis = STR, reasoning = STR }, required = { "hypothesis" } })
        if type(obj.hypothesis) == "string" then hyp = obj.hypothesis end
        if type(obj.reasoning) == "string" then why = obj.reasoning end
        sandbox.write(s.container_id, "hypothesis.txt", hyp)
      end
    end
    sandbox.write(s.container_id, "reasoning.txt", why)
    return {
      hypothesis = hyp, reasoning = why,
      raw_hypotheses = { states.RawHypothesis {
        index = s.index, count = s.count, strategy_name = s.strategy.name,
        strategy_description = s.strategy.description, hypothesis = hyp, reasoning = why,
        container_id = s.container_id,
      } },
    }
  end)
  g:add_edge(START, "hypothesis")
  g:add_edge("hypothesis", "reasoning_and_refine")
  g:add_edge("reasoning_and_refine", END)
  return g:compile { name = "hypothesis_branch" }
end

-- verify(task, hypothesis) -> passed, feedback, score
local function verifier(env)
  return function(task, hyp)
    local p = puzzle.parse(task)
    if p then
      local ok, feedback = puzzle.check(p, hyp)
      return ok, feedback, ok and 1 or 0
    end
    if env.verify then return env.verify(task, hyp) end
    if env.offline then
      error("gcri: offline verification needs a number puzzle or opts.verify", 0)
    end
    local obj = must_ask(env.llm, "verify", { task = task, hypothesis = hyp }, {
      type = "object", required = { "passed" },
      properties = { passed = { type = "boolean" }, score = { type = "number" }, feedback = STR },
    })
    local score = tonumber(obj.score) or (obj.passed and 1 or 0)
    return obj.passed == true, type(obj.feedback) == "string" and obj.feedback or "", score
  end
end

local function verification_branch(env)
  local verify = verifier(env)
  local g = mg.graph { "index", "count", "aggregated_branch", "container_id", "task", "results" }
  g:add_node("verify", function(s)
    local v = states.VerificationBranchState(s)
    local b = v.aggregated_branch
    -- the candidate goes into the reused workspace and is checked from there
    sandbox.write(v.container_id, "candidate.txt", b.combined_hypothesis)
    local candidate = assert(sandbox.read(v.container_id, "candidate.txt"))
    local passed, feedback, score = verify(v.task, candidate)
    local result = states.HypothesisResult {
      index = v.index, count = v.count, hypothesis = candidate, source_indices = b.source_indices,
      container_id = v.container_id, passed = passed == true, score = tonumber(score) or 0,
      feedback = feedback or "",
    }
    sandbox.write_json(v.container_id, "verification.json", result)
    return { results = { result } }
  end)
  g:add_edge(START, "verify")
  g:add_edge("verify", END)
  return g:compile { name = "verification_branch" }
end

---------------------------------------------------------------------------
-- main graph nodes

local function sample_strategies(env)
  return function(s)
    local count = (s.count or 0) + 1
    local memory = s.memory or empty_memory()
    local tried = {}
    for _, n in ipairs(memory.tried_strategies) do tried[n] = true end
    local n = s.branches or _M.DEFAULTS.branches
    local picked = {}
    if env.offline then
      for _, st in ipairs(env.strategies) do
        if #picked >= n then break end
        if not tried[st.name] then
          picked[#picked + 1] = { name = st.name, description = st.description or "" }
        end
      end
    else
      local obj = must_ask(env.llm, "strategies", {
        task = s.task, n = n, rejected = rejected_text(memory),
        tried = lines_of(memory.tried_strategies, tostring),
      }, { type = "object", required = { "strategies" }, properties = { strategies = {
        type = "array", items = { type = "object", required = { "name", "description" },
          properties = { name = STR, description = STR } } } } })
      for _, st in ipairs(type(obj.strategies) == "table" and obj.strategies or {}) do
        if #picked >= n then break end
        if type(st) == "table" and type(st.name) == "string" and not tried[st.name] then
          tried[st.name] = true
          picked[#picked + 1] = { name = st.name, description = tostring(st.description or "") }
        end
      end
    end
    return { count = count, strategies = picked, memory = memory, mode = env.offline and "offline" or "llm" }
  end
end

-- Send one hypothesis branch per strategy, each in a fresh workspace
local function map_hypothesis_branches(s)
  if #s.strategies == 0 then return "decide" end
  local sends = {}
  for index, strategy in ipairs(s.strategies) do
    local container_id = sandbox.setup_branch(s.run_dir, s.count, index)
    sends[index] = Send("hypothesis_executor", states.BranchState {
      index = index, count = s.count, strategy = strategy, container_id = container_id,
      task = s.task, memory = s.memory,
    })
  end
  return sends
end

local function aggregate_hypotheses(env)
  return function(s)
    local raws = of_count(s.raw_hypotheses, s.count)
    local result
    if env.offline then
      result = aggregator.offline(raws)
    else
      local listing = {}
      for _, r in ipairs(raws) do listing[#listing + 1] = r.index .. ": " .. r.hypothesis end
      local obj, err = ask(env.llm, "aggregate", { task = s.task, hypotheses = table.concat(listing, "\n") })
      local why
      if obj then result, why = aggregator.validate(obj, raws) else why = err end
      if not result then
        result = aggregator.offline(raws)
        result.aggregation_summary = result.aggregation_summary ..
          " (offline merge: the LLM's merge was refused: " .. tostring(why) .. ")"
      end
    end
    local source_containers = {}
    for _, r in ipairs(raws) do source_containers[r.index] = r.container_id end
    local map = sandbox.setup_verification_branches(result.branches, source_containers)
    return {
      aggregation = result,
      aggregated_branches = result.branches,
      verification_container_map = map,
    }
  end
end

local function map_verification_branches(s)
  if #s.aggregated_branches == 0 then return "collect_verification" end
  local sends = {}
  for i, branch in ipairs(s.aggregated_branches) do
    sends[i] = Send("verification_executor", states.VerificationBranchState {
      index = branch.index, count = s.count, aggregated_branch = branch,
      container_id = s.verification_container_map[branch.index], task = s.task,
    })
  end
  return sends
end

local function collect_verification(s)
  local results = of_count(s.results, s.count)
  table.sort(results, function(a, b) return a.index < b.index end)
  local passed = {}
  for _, r in ipairs(results) do if r.passed then passed[#passed + 1] = r.index end end
  return { verification_summary = {
    count = s.count, verified = #results, passed = passed,
    discarded = s.aggregation and s.aggregation.discarded_indices or {},
  } }
end

local function decide(s)
  local best = nil
  for _, r in ipairs(of_count(s.results, s.count)) do
    if r.passed and (not best or r.score > best.score or (r.score == best.score and r.index < best.index)) then
      best = r
    end
  end
  return { final_decision = best ~= nil, answer = best and best.hypothesis or nil }
end

local function update_memory(s)
  local m = copy_memory(s.memory)
  for _, st in ipairs(s.strategies or {}) do m.tried_strategies[#m.tried_strategies + 1] = st.name end
  for _, r in ipairs(of_count(s.results, s.count)) do
    if not r.passed then
      m.rejected[#m.rejected + 1] = { count = s.count, hypothesis = r.hypothesis, feedback = r.feedback }
    end
  end
  local raws = of_count(s.raw_hypotheses, s.count)
  -- with no strategy left this iteration aggregated nothing
  local discarded = #s.strategies > 0 and s.aggregation and s.aggregation.discarded_indices or {}
  for _, i in ipairs(discarded) do
    for _, r in ipairs(raws) do
      if r.index == i then
        m.rejected[#m.rejected + 1] = { count = s.count, hypothesis = "(none from " .. r.strategy_name .. ")",
          feedback = "discarded: " .. r.reasoning }
      end
    end
  end
  m.decisions[#m.decisions + 1] = {
    count = s.count, accepted = s.final_decision == true,
    answer = s.final_decision and s.answer or nil,
    summary = #s.strategies == 0 and "no untried strategy left" or
      (s.aggregation and s.aggregation.aggregation_summary or ""),
  }
  return { memory = m }
end

local function next_iteration(s)
  if s.final_decision then return END end
  if #s.strategies == 0 then return END end
  if s.count >= (s.max_iterations or _M.DEFAULTS.max_iterations) then return END end
  return "sample_strategies"
end

---------------------------------------------------------------------------

--[[ build(opts) -> compiled graph
opts: llm (a client with :chat), strategies (offline strategy list; default
scripts/gcri/strategies.lua), verify (fn(task, hypothesis) -> passed,
feedback, score, for offline tasks that are not number puzzles),
checkpointer, recursion_limit. Offline when there is no llm or when
strategies are given. ]]
function _M.build(opts)
  opts = opts or {}
  local env = { llm = opts.llm, verify = opts.verify }
  env.offline = opts.llm == nil or opts.strategies ~= nil
  env.strategies = opts.strategies or require "scripts.gcri.strategies"
  env.registry = {}
  for _, st in ipairs(env.strategies) do
    if type(st.name) ~= "string" or type(st.hypothesize) ~= "function" then
      error("bad argument #1 to 'build': each strategy needs a name and a hypothesize function", 2)
    end
    env.registry[st.name] = st
  end

  local g = mg.graph(states.TaskState())
  g:add_node("sample_strategies", sample_strategies(env))
  g:add_node("hypothesis_executor", hypothesis_branch(env))
  g:add_node("aggregate_hypotheses", aggregate_hypotheses(env))
  g:add_node("verification_executor", verification_branch(env))
  g:add_node("collect_verification", collect_verification)
  g:add_node("decide", decide)
  g:add_node("update_memory", update_memory)

  g:add_edge(START, "sample_strategies")
  g:add_conditional_edges("sample_strategies", map_hypothesis_branches, { "hypothesis_executor", "decide" })
  g:add_edge("hypothesis_executor", "aggregate_hypotheses")
  g:add_conditional_edges("aggregate_hypotheses", map_verification_branches,
    { "verification_executor", "collect_verification" })
  g:add_edge("verification_executor", "collect_verification")
  g:add_edge("collect_verification", "decide")
  g:add_edge("decide", "update_memory")
  g:add_conditional_edges("update_memory", next_iteration, { "sample_strategies", END })
  return g:compile {
    name = "gcri", checkpointer = opts.checkpointer,
    recursion_limit = opts.recursion_limit or 8 * 10 + 5,
  }
end

--[[ input(task, opts) -> the initial TaskState
opts: branches (strategies per iteration, default 2), max_iterations
(default 3), run_dir (workspaces; default .moongraph/gcri/run). ]]
function _M.input(task, opts)
  opts = opts or {}
  if type(task) ~= "string" or not task:find("%S") then
    error("bad argument #1 to 'input': task text expected", 2)
  end
  local n = opts.branches or _M.DEFAULTS.branches
  local max = opts.max_iterations or _M.DEFAULTS.max_iterations
  if math.type(n) ~= "integer" or n < 1 then error("bad argument #2 to 'input': branches must be a positive integer", 2) end
  if math.type(max) ~= "integer" or max < 1 or max > 10 then
    error("bad argument #2 to 'input': max_iterations must be an integer from 1 to 10", 2)
  end
  return {
    task = task, branches = n, max_iterations = max,
    run_dir = opts.run_dir or _M.DEFAULTS.run_dir, memory = empty_memory(),
  }
end

return _M
