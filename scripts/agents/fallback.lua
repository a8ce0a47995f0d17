-- Fallback on error: the primary agent answers with the LLM, streaming its
-- tokens; when it fails before producing any output (no LLM configured, the
-- call failed), the router is asked again with the failed keys and picks the
-- fallback agent, which answers questions about moongraph from
-- data/agents/faq.json. A failure after the first token is not failed over.
--
--   ./moongraph run scripts/agents/fallback.lua "how do I run the tests?"

local mg = require "moongraph"
local common = require "scripts.agents.common"
local data = require "nodes.lib.data"

local _M = {}

_M.USAGE = "usage: moongraph run scripts/agents/fallback.lua MESSAGE"

local SYSTEM = "You are the primary assistant of the moongraph project. Answer briefly."

-- lower-case words of a text (ASCII words and Hangul runs)
local function words(text)
  local out = {}
  for w in text:lower():gmatch("[%w\128-\255]+") do out[w] = true end
  return out
end

--[[ faq_answer(question) -> entry, score | nil
The FAQ entry sharing the most keywords with the question; at least one
keyword must match. Ties go to the earlier entry. ]]
function _M.faq_answer(question)
  local faq = data.require("agents/faq.json")
  local w = words(question)
  local best, best_score = nil, 0
  for _, e in ipairs(faq.entries) do
    local score = 0
    for _, k in ipairs(e.keywords) do
      if w[k] then score = score + 1 end
    end
    if score > best_score then best, best_score = e, score end
  end
  if not best then return nil end
  return best, best_score
end

-- The primary streams its reply through ctx.stream_token: once a token is
-- out, a failure is no longer failed over (the user saw partial output).
function _M.primary(llm)
  return function(state, ctx)
    if not llm then
      error("no LLM configured (set MOONGRAPH_LLM_BASE_URL or MOONGRAPH_LLM_API_KEY)", 0)
    end
    local text, err = common.chat(llm, SYSTEM, common.question(state),
      { stream = function(delta) ctx.stream_token(delta) end })
    if not text then error(err, 0) end
    return common.reply("primary", text)
  end
end

function _M.fallback(state)
  local q = common.question(state)
  local e = _M.faq_answer(q)
  if not e then
    return common.reply("fallback", "The offline fallback only knows the moongraph FAQ " ..
      "(data/agents/faq.json), and none of its questions matches yours.")
  end
  return common.reply("fallback", e.answer .. "\n(from the offline FAQ: \"" .. e.question .. "\")")
end

-- The seed's router: primary first; the fallback once primary failed; then
-- nothing more to try.
function _M.router(_, ctx, error_ctx)
  if not error_ctx then return "primary" end
  if error_ctx.failed_keys.primary and not error_ctx.failed_keys.fallback then
    if ctx.emit then
      ctx.emit { routing = "primary failed (" .. tostring(error_ctx.last_error) .. "); trying fallback" }
    end
    return "fallback"
  end
  return nil
end

function _M.node(opts)
  opts = opts or {}
  return mg.routed_agent {
    name = "fallback_example",
    agents = { primary = opts.primary or _M.primary(opts.llm), fallback = opts.fallback or _M.fallback },
    router = _M.router,
  }
end

function _M.build(opts)
  return common.graph(_M.node(opts), opts and opts.compile)
end

function _M.main(args)
  return common.main(args, _M.USAGE, _M.build)
end

if (...) == "scripts.agents.fallback" then return _M end
return _M.main({ ... })
