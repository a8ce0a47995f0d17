-- The engine floor of bench/pipeline.lua and bench/pipeline_profile.lua:
-- the Eco² graph with every node replaced by a stand-in. The intent node
-- returns the classifier's answer for the message, computed once. Each
-- upstream node makes again the request its node made in one pipeline run
-- (the URL with its query, the headers), decodes the body as a node must
-- (status checked, JSON parsed) and returns a fixed result. The other
-- nodes return at once. What is left is the engine: supersteps, Send
-- fan-out, reducers, HTTP and JSON, without the nodes' own work.
--
--   local floor = require "pipeline_floor"
--   local app = floor.build(chat, pipeline_run, MESSAGE, LOCATION)
--     pipeline_run(): one run of the real pipeline (its requests are recorded)
local http = require "moongraph.http"
local adapter = require "nodes.lib.adapter"

local _M = {}

_M.PATHS = { location = "/v2/local/search/keyword.json", collection_point = "/v1/collection-points",
             weather = "/getVilageFcst" }

-- the requests pipeline_run's nodes make, by node:
--   floor.requests(pipeline_run) -> { location = {url =, headers =, timeout =}, ... }
local function record(pipeline_run)
  local requests = {}
  local real = http.request
  http.request = function(req)
    for n, path in pairs(_M.PATHS) do
      if req.url:find(path, 1, true) then
        local url = req.url
        if req.query then url = url .. (url:find("?", 1, true) and "&" or "?") .. http.encode_query(req.query) end
        requests[n] = { url = url, headers = req.headers, timeout = 5 }
      end
    end
    return real(req)
  end
  local ok, err = pcall(pipeline_run)
  http.request = real
  if not ok then error(err, 0) end
  for n in pairs(_M.PATHS) do
    if not requests[n] then error("the pipeline made no request to " .. n, 0) end
  end
  return requests
end

_M.requests = record

function _M.build(chat, pipeline_run, message, location)
  local requests = record(pipeline_run)
  local nodes = {}
  local canned_intent = require("nodes.intent").new { rules = require("scripts.eco.routing").rules }
    .run({ message = message, user_location = location }, {})
  nodes.intent = { name = "intent", policy = "fail_close", run = function() return canned_intent end }
  for _, n in ipairs(chat.branch_nodes) do
    nodes[n] = { name = n, policy = "fail_open", run = function()
      if not requests[n] then return { contexts = { [n] = { ok = false, text = n } } } end
      local body = adapter.decode(n, http.request(requests[n]))
      return { contexts = { [n] = { ok = type(body) == "table", text = n } } }
    end }
  end
  for _, n in ipairs({ "answer", "feedback", "summarize" }) do
    nodes[n] = { name = n, policy = "fail_close", run = function() return { [n .. "_done"] = true } end }
  end
  return chat.build { nodes = nodes }
end

return _M
