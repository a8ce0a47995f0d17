-- moongraph: the public Lua face of the runtime.
--
-- Tasks, sleeping, timeouts, gather and queues come from moongraph.tasks
-- (the C scheduler, moongraph.core.loop). Graphs, clients and savers live in
-- their own modules and are loaded on first use through the `lazy` table
-- below, so `require "moongraph"` stays cheap.

local tasks = require "moongraph.tasks"

local setmetatable, pairs = setmetatable, pairs

local _M = { _VERSION = require("moongraph.core").version }
for k, v in pairs(tasks) do _M[k] = v end

-- Names served by other modules, loaded on first use: {module, field};
-- without a field the name is the module itself.
local lazy = {
  graph = { "moongraph.graph", "graph" },
  START = { "moongraph.graph", "START" },
  END = { "moongraph.graph", "END" },
  Send = { "moongraph.graph", "Send" },
  Command = { "moongraph.graph", "Command" },
  Overwrite = { "moongraph.graph", "Overwrite" },
  PARENT = { "moongraph.graph", "PARENT" },
  interrupt = { "moongraph.graph", "interrupt" },
  task = { "moongraph.functional", "task" },
  entrypoint = { "moongraph.functional", "entrypoint" },
  reducers = { "moongraph.reducers" },
  checkpoint = { "moongraph.checkpoint" },
  store = { "moongraph.store" },
  routed_agent = { "moongraph.routed_agent", "routed_agent" },
  process = { "moongraph.process" },
  prebuilt = { "moongraph.prebuilt" },
}

return setmetatable(_M, {
  __index = function(t, k)
    local entry = lazy[k]
    if not entry then return nil end
    local mod = require(entry[1])
    local v = mod
    if entry[2] then v = mod[entry[2]] end
    t[k] = v
    return v
  end,
})
