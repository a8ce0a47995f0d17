-- moongraph worker --script [NAME=]PATH... [--redis URL] [--pg URL] [--concurrency N] ...
-- Runs jobs from the Redis stream PREFIX:jobs with the scripts given (by
-- --script or MOONGRAPH_WORKER_SCRIPT; there is no default) until SIGTERM
-- (see moongraph.worker and docs/worker.md). Exit status: 0 after a drain,
-- 1 when it cannot start, 2 on bad usage (no script included).
local config = require "moongraph.worker.config"

return {
  main = function(args)
    local cfg, err = config.parse(args)
    if not cfg then
      io.stderr:write("moongraph worker: ", err, "\n", config.USAGE)
      return 2
    end
    if cfg.help then
      io.stdout:write(config.USAGE)
      return 0
    end
    local ok, perr = require("moongraph.redis").parse_url(cfg.redis)
    if not ok then
      io.stderr:write("moongraph worker: --redis: ", perr, "\n")
      return 2
    end
    local worker = require "moongraph.worker"
    local w = worker.new(cfg, { llm = (require("moongraph.llm").from_env()) })
    return w:run()
  end,
}
