--[[
moongraph.public_error — what a client may be told of a run or job that
failed: which node failed (the node the error names first) and the id the
server logged the detail under. Never the error's own text: it may hold
file paths, SQL, an upstream's address and its reply. The HTTP APIs and
the worker say it this way wherever a failure reaches a client (an error
event, a stored answer, a run's output); the detail goes to their logs.

  local public_error = require "moongraph.public_error"
  public_error.message(err, "run 1f0c...")  -> "node 'answer' failed (run 1f0c...)"
  public_error.message(err, "job j-...")    -> "the run failed (job j-...)"  (no node named)
  public_error.node(err)                    -> "answer" | nil
]]

local errors = require "moongraph.errors"

local type = type

local _M = {}

-- The node an error names: the first node_failed in its chain of wraps. A
-- string is the first line of an error a job stored (job_results.error,
-- whose format "node 'x' failed: ..." the worker writes).
function _M.node(err)
  if errors.is(err) then
    local f = errors.find(err, "node_failed")
    return f and f.details and f.details.node or nil
  end
  if type(err) ~= "string" then return nil end
  return err:match("^node '([^']+)'")
end

function _M.message(err, where)
  local node = _M.node(err)
  local said = node and ("node '" .. node .. "' failed") or "the run failed"
  if where then said = said .. " (" .. where .. ")" end
  return said
end

return _M
