--[[
moongraph.api.embedded — the LangGraph Agent API's service on one machine
(what `moongraph serve` runs without --redis and --pg): moongraph.service
over local files under a data directory (moongraph.service.files) with
runs executed as tasks in this process (moongraph.service.tasks).

  local embedded = require "moongraph.api.embedded"
  local svc = assert(embedded.new{
    data = ".moongraph",                               -- data directory
    scripts = { {name = "chat", path = "chat.lua"}, ... },
  })

Every script is an assistant whose id is its name (the graph id). Threads,
their checkpoints, runs and finished runs' event logs are kept in the data
directory; a run that was going when the process stopped is marked failed
with the reason when it starts again, and a new run on the thread with
input null continues from its last checkpoint. The operations are
moongraph.service's.
]]

local service = require "moongraph.service"
local files = require "moongraph.service.files"
local tasks = require "moongraph.service.tasks"
local ids = require "moongraph.ids"
local lgrun = require "moongraph.langgraph_run"
local lgstate = require "moongraph.api.langgraph_state"
local lgrequest = require "moongraph.api.langgraph_request"

local type, error = type, error

local _M = {}

_M.STREAM_MODES = lgrun.STREAM_MODES
_M.STRATEGIES = lgrequest.STRATEGIES
_M.MAX_RUNS_PER_THREAD = service.MAX_RUNS_PER_THREAD
_M.uuid4 = ids.uuid4
_M.thread_json = service.thread_json
_M.run_json = service.run_json
_M.interrupts_json = lgrun.interrupts_json
_M.state_json = lgstate.state_json

-- new{data = dir, scripts = {{name, path}, ...}} -> service | nil, err
function _M.new(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'new': options table expected, got " .. type(opts), 2)
  end
  local data = opts.data or ".moongraph"
  if type(data) ~= "string" or data == "" then
    error("bad argument #1 to 'new': data must be a directory path", 2)
  end
  if type(opts.scripts) ~= "table" then
    error("bad argument #1 to 'new': scripts must be a list of {name =, path =}", 2)
  end
  local storage, err = files.open(data)
  if not storage then return nil, err end
  return service.new { storage = storage, executor = tasks.new(), scripts = opts.scripts }
end

return _M
