-- moongraph route [--prev-intent I] [--location L] [--json] "message"
-- Explains the Eco² routing decision for one message (scripts/eco/, run
-- from the repository root, so an edited rule table takes effect at once).
local app = require "moongraph.cmd.app"

return {
  main = function(args)
    return require("scripts.eco.commands").route(args, { llm = app.llm_from_env() })
  end,
}
