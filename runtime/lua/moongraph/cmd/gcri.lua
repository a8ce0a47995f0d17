-- moongraph gcri [--branches N] [--max-iterations N] [--run-dir DIR] [--json] "task"
-- Runs the GCRI multi-branch workflow (scripts/gcri/, run from the
-- repository root) on one task.
local app = require "moongraph.cmd.app"

return {
  main = function(args)
    return require("scripts.gcri.cli").main(args, { llm = app.llm_from_env() })
  end,
}
