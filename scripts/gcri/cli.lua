-- The `gcri` command: run the GCRI workflow on one task and print each
-- phase as it finishes. Shared by `moongraph gcri` and scripts/gcri/run.lua.
--
--   gcri [--branches N] [--max-iterations N] [--run-dir DIR] [--json] TASK
--
-- Offline (no MOONGRAPH_LLM_* set) the strategies are the deterministic
-- number-puzzle strategies: TASK must read like "make 24 from 4 7 8 8".
-- The workspaces and result.json are left in the run directory (default
-- .moongraph/gcri/<time>-<pid-ish>).

local args = require "moongraph.args"
local llm_mod = require "moongraph.llm"
local gcri = require "scripts.gcri.graph"
local puzzle = require "scripts.gcri.puzzle"
local json = require "cjson.safe"

local _M = {}

_M.SPEC = {
  name = "gcri",
  usage = "usage: gcri [--branches N] [--max-iterations N] [--run-dir DIR] [--json] TASK",
  options = { branches = "integer", ["max-iterations"] = "integer", ["run-dir"] = "string", json = "flag" },
  positional = { name = "task", label = "TASK", required = true, join = true },
}

local function default_run_dir()
  return string.format(".moongraph/gcri/%s-%04d", os.date("!%Y%m%dT%H%M%S"), math.random(0, 9999))
end

local function say(out, fmt, ...) out:write(string.format(fmt, ...), "\n") end

-- one line per finished phase
local function report(out, ev)
  local d = ev.data or {}
  if ev.node == "sample_strategies" and d.strategies then
    local names = {}
    for i, s in ipairs(d.strategies) do names[i] = s.name end
    say(out, "iteration %d: strategies %s", d.count, #names > 0 and table.concat(names, ", ") or "(none left)")
  elseif ev.node == "hypothesis_executor" and d.raw_hypotheses then
    for _, h in ipairs(d.raw_hypotheses) do
      say(out, "  hypothesis %d (%s): %s", h.index, h.strategy_name,
        h.hypothesis ~= "" and h.hypothesis or ("none — " .. h.reasoning))
    end
  elseif ev.node == "aggregate_hypotheses" and d.aggregation then
    say(out, "  aggregation: %s", d.aggregation.aggregation_summary)
    for _, b in ipairs(d.aggregation.branches) do
      local src = {}
      for i, x in ipairs(b.source_indices) do src[i] = tostring(x) end
      say(out, "    branch %d <- hypotheses %s, workspace %s", b.index, table.concat(src, ","),
        tostring(d.verification_container_map[b.index]))
    end
  elseif ev.node == "verification_executor" and d.results then
    for _, r in ipairs(d.results) do
      say(out, "  verified branch %d: %s — %s", r.index, r.passed and "PASS" or "FAIL", r.feedback)
    end
  elseif ev.node == "decide" then
    say(out, "  decision: %s", d.final_decision and "accept" or "not accepted")
  end
end

function _M.main(argv, opts)
  opts = opts or {}
  local out, err = opts.stdout or io.stdout, opts.stderr or io.stderr
  local o, perr = args.parse(_M.SPEC, argv)
  if not o then return args.usage_error(_M.SPEC, perr, err) end
  if o.help then return args.help(_M.SPEC, out) end
  local llm = opts.llm
  if llm == nil then
    local lerr
    llm, lerr = llm_mod.from_env()
    if lerr then err:write("gcri: no LLM: ", lerr, "; running offline\n") end
  end
  if not llm and not puzzle.parse(o.task) then
    err:write("gcri: offline (no LLM configured) the strategies solve number puzzles such as ",
      "\"make 24 from 4 7 8 8\"; set MOONGRAPH_LLM_BASE_URL / MOONGRAPH_LLM_API_KEY for other tasks\n")
    return 1
  end
  local ok, input = pcall(gcri.input, o.task, {
    branches = o.branches, max_iterations = o.max_iterations, run_dir = o.run_dir or default_run_dir() })
  if not ok then
    err:write("gcri: ", tostring(input):gsub("^bad argument #%d+ to '[%w_]+': ", ""), "\n")
    return 2
  end
  local app = gcri.build { llm = llm }
  if not o.json then
    say(out, "GCRI (%s) on: %s", llm and "LLM" or "offline strategies", o.task)
  end
  local final
  local rok, rerr = pcall(function()
    for ev in app:stream(input, { modes = { "updates", "values" } }) do
      if ev.mode == "values" then final = ev.data
      elseif not o.json then report(out, ev) end
    end
  end)
  if not rok then
    err:write("gcri: ", tostring(rerr):match("^[^\n]*"), "\n")
    return 1
  end
  local summary = {
    task = final.task, accepted = final.final_decision == true, answer = final.answer,
    iterations = final.count, run_dir = final.run_dir, memory = final.memory,
    verification_container_map = final.verification_container_map,
  }
  require("moongraph.core").store.write(final.run_dir .. "/result.json", json.encode(summary) .. "\n")
  if o.json then
    out:write(json.encode(summary), "\n")
  else
    if summary.accepted then
      say(out, "answer: %s (iteration %d)", summary.answer, summary.iterations)
    else
      say(out, "no hypothesis accepted after %d iteration(s)", summary.iterations)
    end
    say(out, "workspaces and result.json: %s", final.run_dir)
  end
  return summary.accepted and 0 or 3
end

return _M
