-- moongraph chat [--thread ID] [--location L] [--trace FILE] [--json] "message"
-- One turn of the Eco² chat pipeline (scripts/eco/chat.lua, run from the
-- repository root): the answer streams to stdout, the steps and their
-- timings go to stderr, turns are checkpointed per thread.
local app = require "moongraph.cmd.app"

return {
  main = function(args)
    return require("scripts.eco.chat_command").run(args, { llm = app.llm_from_env() })
  end,
}
