-- The state types of the GCRI multi-branch workflow. Each type is a
-- constructor that checks its fields and returns a plain table (plain
-- tables go through checkpoints unchanged); a missing optional field gets
-- its default. Indices are 1-based, as Lua lists are.
--
--   RawHypothesis            one hypothesis branch's result (phase 1)
--   AggregatedBranch         hypotheses merged into one branch (phase 2)
--   AggregationResult        branches, discarded_indices, aggregation_summary
--   BranchState              the input of a hypothesis branch
--   VerificationBranchState  the input of a verification branch
--   HypothesisResult         one verification branch's result (phase 3)
--   TaskState                the main graph's schema (key -> reducer)

local mg = require "moongraph"

local _M = {}

local function is_int(v) return math.type(v) == "integer" end

local checks = {
  int = function(v) return is_int(v) end,
  string = function(v) return type(v) == "string" end,
  number = function(v) return type(v) == "number" end,
  bool = function(v) return type(v) == "boolean" end,
  table = function(v) return type(v) == "table" end,
  ["list<int>"] = function(v)
    if type(v) ~= "table" then return false end
    for k, x in pairs(v) do
      if not is_int(k) or not is_int(x) then return false end
    end
    return true
  end,
}

--[[ define(name, fields) -> constructor
fields: list of {key, type, default?}; a field with a default (possibly a
function making it) is optional. Unknown keys are refused. ]]
local function define(name, fields)
  local by_key = {}
  for _, f in ipairs(fields) do by_key[f[1]] = f end
  return function(t)
    if type(t) ~= "table" then
      error(name .. ": table expected, got " .. type(t), 2)
    end
    for k in pairs(t) do
      if not by_key[k] then error(name .. ": unknown field '" .. tostring(k) .. "'", 2) end
    end
    local out = {}
    for _, f in ipairs(fields) do
      local key, ty, default = f[1], f[2], f[3]
      local v = t[key]
      if v == nil and default ~= nil then
        if type(default) == "function" then v = default() else v = default end
      end
      if v == nil then
        if not f.optional then error(name .. ": field '" .. key .. "' is required", 2) end
      else
        local check = checks[ty] or ty
        if not check(v) then
          error(name .. ": field '" .. key .. "' must be " .. (type(ty) == "string" and ty or "valid") ..
            ", got " .. type(v), 2)
        end
        out[key] = v
      end
    end
    return out
  end
end

local function empty() return {} end

local function strategy_check(v)
  return type(v) == "table" and type(v.name) == "string" and type(v.description) == "string"
end

_M.RawHypothesis = define("RawHypothesis", {
  { "index", "int" },
  { "count", "int" },
  { "strategy_name", "string" },
  { "strategy_description", "string", "" },
  { "hypothesis", "string" },            -- "" when the branch found none
  { "reasoning", "string", "" },
  { "container_id", "string" },
})

_M.AggregatedBranch = define("AggregatedBranch", {
  { "index", "int" },
  { "combined_hypothesis", "string" },
  { "source_indices", "list<int>" },
  { "merge_reasoning", "string", "" },
})

local function branch_list(v)
  if type(v) ~= "table" then return false end
  for i = 1, #v do
    local ok = pcall(_M.AggregatedBranch, v[i])
    if not ok then return false end
  end
  return true
end

_M.AggregationResult = define("AggregationResult", {
  { "branches", branch_list },
  { "discarded_indices", "list<int>", empty },
  { "aggregation_summary", "string" },
})

_M.BranchState = define("BranchState", {
  { "index", "int" },
  { "count", "int" },
  { "strategy", strategy_check },
  { "container_id", "string" },
  { "task", "string" },
  { "memory", "table", empty },
  { "hypothesis", "string", optional = true },
  { "reasoning", "string", optional = true },
})

_M.VerificationBranchState = define("VerificationBranchState", {
  { "index", "int" },
  { "count", "int" },
  { "aggregated_branch", function(v) return pcall(_M.AggregatedBranch, v) end },
  { "container_id", "string" },
  { "task", "string" },
})

_M.HypothesisResult = define("HypothesisResult", {
  { "index", "int" },
  { "count", "int" },
  { "hypothesis", "string" },
  { "source_indices", "list<int>" },
  { "container_id", "string" },
  { "passed", "bool" },
  { "score", "number", 0 },
  { "feedback", "string", "" },
})

--[[ TaskState: the main graph's schema. raw_hypotheses and results are
appended by their reducers and keep every iteration (each item carries its
`count`); the rest is replaced by the node that writes it. ]]
function _M.TaskState()
  return {
    task = "last",
    count = "last",                 -- the iteration, 1, 2, ...
    max_iterations = "last",
    branches = "last",              -- strategies per iteration
    run_dir = "last",               -- the branches' workspaces live below it
    mode = "last",                  -- "offline" | "llm"
    strategies = "last",            -- this iteration's {name, description}
    raw_hypotheses = mg.reducers.append,
    aggregation = "last",           -- this iteration's AggregationResult
    aggregated_branches = "last",
    verification_container_map = "last",   -- list: aggregated index -> workspace
    results = mg.reducers.append,
    verification_summary = "last",
    final_decision = "last",        -- true: accepted; false: not (yet)
    answer = "last",                -- the accepted hypothesis
    memory = "last",                -- {tried_strategies, rejected, decisions}
  }
end

return _M
