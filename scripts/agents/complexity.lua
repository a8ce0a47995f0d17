-- Complexity-based routing: the router classifies the request before
-- choosing an agent. With an LLM configured it asks a lightweight classifier
-- call ("simple" or "complex"); offline, or when that call fails, the rules
-- of scripts/agents/complexity_rules.lua decide. Simple requests go to the
-- simple agent, complex ones to the expert agent (MOONGRAPH_LLM_COMPLEX_MODEL
-- selects a stronger model for it when set).
--
--   ./moongraph run scripts/agents/complexity.lua "what time is it in Seoul?"
--   ./moongraph run scripts/agents/complexity.lua "compare Redis and Postgres as checkpoint stores"

local mg = require "moongraph"
local common = require "scripts.agents.common"

local _M = {}

_M.USAGE = "usage: moongraph run scripts/agents/complexity.lua MESSAGE"

local function rules()
  package.loaded["scripts.agents.complexity_rules"] = nil
  return require "scripts.agents.complexity_rules"
end

--[[ offline_classify(text [, r]) -> {label = "simple"|"complex", reason, source = "rules"}
Deterministic: the same text always gets the same label. ]]
function _M.offline_classify(text, r)
  r = r or rules()
  local lower = text:lower()
  for _, m in ipairs(r.markers) do
    if lower:find(m, 1, true) then
      return { label = "complex", reason = "asks for analysis ('" .. m .. "')", source = "rules" }
    end
  end
  local n = 0
  for _ in text:gmatch("%S+") do n = n + 1 end
  if n > r.max_simple_words then
    return { label = "complex", reason = n .. " words (more than " .. r.max_simple_words .. ")", source = "rules" }
  end
  local q = select(2, text:gsub("[?？]", ""))
  if q >= r.min_questions then
    return { label = "complex", reason = q .. " questions in one request", source = "rules" }
  end
  return { label = "simple", reason = "a short single request", source = "rules" }
end

--[[ classify(text, llm) -> classification
The seed's classifier prompt when an LLM is given; its reply counts as
complex when it contains the word. A failed call falls back to the rules. ]]
function _M.classify(text, llm)
  if text == "" then return { label = "simple", reason = "empty request", source = "rules" } end
  if not llm then return _M.offline_classify(text) end
  local prompt = "Classify this request as 'simple' or 'complex'. Reply with ONLY that word.\nRequest: \"" ..
    text .. "\""
  local reply, err = common.chat(llm, "You classify requests.", prompt)
  if not reply then
    local c = _M.offline_classify(text)
    c.reason = c.reason .. "; the classifier call failed (" .. err .. ")"
    return c
  end
  local label = reply:lower():find("complex", 1, true) and "complex" or "simple"
  return { label = label, reason = "classifier replied '" .. reply:gsub("%s+$", "") .. "'", source = "llm" }
end

local function agent(key, instruction, llm, model)
  return function(state)
    local q = common.question(state)
    local c = state.classification or {}
    if llm then
      local text, err = common.chat(llm, instruction, q, model and { model = model } or nil)
      if not text then error(err, 0) end
      return common.reply(key, text)
    end
    return common.reply(key, "[" .. key .. " agent] No LLM is configured, so this agent has no answer " ..
      "to give; the request was routed here because it is " .. tostring(c.label) .. ": " ..
      tostring(c.reason) .. ".")
  end
end

function _M.node(opts)
  opts = opts or {}
  local llm = opts.llm
  local complex_model = opts.complex_model or os.getenv("MOONGRAPH_LLM_COMPLEX_MODEL")
  local routed = mg.routed_agent {
    name = "complexity_example",
    agents = {
      simple = agent("simple", "You are a simple assistant for basic questions.", llm),
      complex = agent("complex", "You are an expert assistant for complex analysis.", llm,
        complex_model ~= "" and complex_model or nil),
    },
    router = function(_, ctx)
      local c = _M.classify(ctx.user_message or ctx.state.question or "", llm)
      ctx.state.classification = c
      if ctx.emit then ctx.emit { routing = c.label .. " (" .. c.source .. ": " .. c.reason .. ")" } end
      return c.label
    end,
  }
  -- the classification is part of the answer's record
  return function(state, ctx)
    local input = {}
    for k, v in pairs(state) do input[k] = v end
    local up = routed(input, ctx)
    up.classification = input.classification
    return up
  end
end

function _M.build(opts)
  return common.graph(_M.node(opts), opts and opts.compile)
end

function _M.main(args)
  return common.main(args, _M.USAGE, _M.build)
end

if (...) == "scripts.agents.complexity" then return _M end
return _M.main({ ... })
