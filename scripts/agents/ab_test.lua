-- A/B by external configuration: the router reads which agent to use from a
-- configuration file on every call (AB_CONFIG, default
-- data/agents/ab_config.json, {"selected_agent": "agent_a"}); the
-- environment variable AB_SELECTED_AGENT overrides the file. Change either
-- between calls and the next call goes to the other agent.
--
--   ./moongraph run scripts/agents/ab_test.lua "who are you?"
--   AB_SELECTED_AGENT=agent_b ./moongraph run scripts/agents/ab_test.lua "who are you?"

local mg = require "moongraph"
local common = require "scripts.agents.common"
local data = require "nodes.lib.data"
local json = require "cjson.safe"

local _M = {}

_M.USAGE = "usage: [AB_SELECTED_AGENT=agent_a|agent_b] [AB_CONFIG=FILE] moongraph run scripts/agents/ab_test.lua MESSAGE"

function _M.config_path()
  local p = os.getenv("AB_CONFIG")
  if p and p ~= "" then return p end
  -- a missing file is reported when it is read, by this name
  return data.path("agents/ab_config.json") or "data/agents/ab_config.json"
end

--[[ selected(path) -> agent key | nil, err
AB_SELECTED_AGENT when set, else the file's selected_agent. The file is read
through the runtime's file store, so the router yields while it is read. ]]
function _M.selected(path)
  local env = os.getenv("AB_SELECTED_AGENT")
  if env and env ~= "" then return env end
  local store = require("moongraph.core").store
  local text, err = store.read(path)
  if not text then return nil, "cannot read the A/B configuration " .. path .. ": " .. tostring(err) end
  local cfg = json.decode(text)
  if type(cfg) ~= "table" or type(cfg.selected_agent) ~= "string" then
    return nil, "the A/B configuration " .. path .. " needs {\"selected_agent\": \"agent_a\"|\"agent_b\"}"
  end
  return cfg.selected_agent
end

local function agent(key, label, llm)
  local system = "You are " .. label .. ". Always identify yourself as " .. label .. "."
  return function(state)
    local q = common.question(state)
    if llm then
      local text, err = common.chat(llm, system, q)
      if not text then error(err, 0) end
      return common.reply(key, text)
    end
    return common.reply(key, "I am " .. label .. " (offline: no LLM is configured, so I only say who I am). " ..
      "You asked: " .. q)
  end
end

function _M.node(opts)
  opts = opts or {}
  local path = opts.config_path or _M.config_path()
  return mg.routed_agent {
    name = "ab_example",
    agents = { agent_a = agent("agent_a", "Agent A", opts.llm), agent_b = agent("agent_b", "Agent B", opts.llm) },
    router = function(agents, ctx)
      local key, err = _M.selected(path)
      if not key then error(err, 0) end
      if not agents[key] then error("the A/B configuration selects '" .. key .. "'; expected agent_a or agent_b", 0) end
      if ctx.emit then ctx.emit { routing = "configuration selects " .. key } end
      return key
    end,
  }
end

function _M.build(opts)
  return common.graph(_M.node(opts), opts and opts.compile)
end

function _M.main(args)
  return common.main(args, _M.USAGE, _M.build)
end

if (...) == "scripts.agents.ab_test" then return _M end
return _M.main({ ... })
