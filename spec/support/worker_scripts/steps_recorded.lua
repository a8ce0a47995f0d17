-- steps.lua with a record hook: each answered job adds a row to
-- stepspec_turns (created by the script's own migration, scope
-- "stepspec"), in the transaction that stores its result. The table has no
-- key, so a job recorded twice would show as two rows.
local steps = require "spec.support.worker_scripts.steps"

return {
  build = steps.build,
  worker = {
    scope = "stepspec",
    migrations = {
      { version = 1, name = "turns", sql = "CREATE TABLE stepspec_turns (job_id text NOT NULL, answer text)" },
    },
    record = function(tx, job, _, result)
      if result.status ~= "done" then return true end
      return tx:query("INSERT INTO stepspec_turns (job_id, answer) VALUES ($1, $2)", { job.job_id, result.answer })
    end,
  },
}
