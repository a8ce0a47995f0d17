-- A script with no worker hooks, for the worker specs: its run input is the
-- job's input as it came. `echo` answers "echo: <input.text>" (or gives a
-- non-string answer when input.number_answer is set) and keeps what it saw;
-- with input.wait it first waits that many seconds.
local mg = require "moongraph"

local _M = {}

function _M.build(opts)
  local g = mg.graph()
  g:add_node("echo", function(state)
    if state.wait then mg.sleep(state.wait) end
    if state.number_answer then return { answer = 42 } end
    return { answer = "echo: " .. tostring(state.text or state.message), echoed = true }
  end)
  g:add_edge(mg.START, "echo")
  g:add_edge("echo", mg.END)
  return g:compile { checkpointer = opts.checkpointer }
end

return _M
