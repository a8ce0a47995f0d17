-- moongraph eval [--json] FILE.jsonl
-- Scores the Eco² router on labelled lines: accuracy, per-intent precision
-- and recall, confusion matrix and the failing cases.
local app = require "moongraph.cmd.app"

return {
  main = function(args)
    return require("scripts.eco.commands").eval(args, {
      llm = app.llm_from_env(),
      is_tty = app.isatty(1),
    })
  end,
}
