-- general: small talk and questions outside the other nodes, answered by
-- the configured LLM (ctx.config.llm, a moongraph.llm client). Without an
-- LLM it gives a short fixed reply saying so and what the assistant can do
-- offline — except as a step of the fallback chain (its Send argument has
-- `chain_of`), where it fails so that its own fallback, clarify, answers.
local prompts = require "moongraph.prompt"

local _M = {
  name = "general",
  policy = { fallback = "clarify" },
  timeout = 30,
  history_turns = 6, -- previous messages passed to the LLM
}

_M.offline_text = "지금은 대화용 LLM이 설정되어 있지 않아 일반 대화에는 자세히 답하기 어려워요. "
  .. "대신 분리배출 방법(예: \"페트병 어떻게 버려?\"), 수거함 위치, 대형폐기물 수수료, "
  .. "재활용 시세, 캐릭터 컬렉션은 내장 데이터로 안내해 드릴 수 있어요."

-- Pure: chat messages for a state (system prompt, recent history, question).
function _M.messages(system, state)
  local msgs = { { role = "system", content = system } }
  local hist = type(state.messages) == "table" and state.messages or {}
  local first = math.max(1, #hist - _M.history_turns + 1)
  for i = first, #hist do
    local m = hist[i]
    if type(m) == "table" and (m.role == "user" or m.role == "assistant") and type(m.content) == "string" then
      msgs[#msgs + 1] = { role = m.role, content = m.content }
    end
  end
  local last = msgs[#msgs]
  if not (last and last.role == "user" and last.content == state.message) then
    msgs[#msgs + 1] = { role = "user", content = state.message }
  end
  return msgs
end

-- The reply text of an LLM chat result: a string, or a table carrying
-- content / text / message.content / choices[1].message.content.
function _M.reply_text(res)
  if type(res) == "string" then return res end
  if type(res) ~= "table" then return nil end
  if type(res.content) == "string" then return res.content end
  if type(res.text) == "string" then return res.text end
  if type(res.message) == "table" and type(res.message.content) == "string" then return res.message.content end
  local c = type(res.choices) == "table" and res.choices[1]
  if type(c) == "table" and type(c.message) == "table" and type(c.message.content) == "string" then
    return c.message.content
  end
  return nil
end

function _M.run(state, ctx)
  local message = state and state.message
  if type(message) ~= "string" or message:match("^%s*$") then
    error("general: the question (state.message) is empty", 0)
  end
  local llm = ctx and ctx.config and ctx.config.llm
  if not llm and state.chain_of then
    error("general: no LLM configured to answer in place of " .. tostring(state.chain_of), 0)
  end
  if not llm then
    return {
      contexts = {
        general = { ok = true, source = "offline", sample = false, text = _M.offline_text,
                    data = { llm = false } },
      },
    }
  end
  local system, err = prompts.load("general.txt")
  if not system then error("general: " .. err, 0) end
  -- a context for the answer, not the answer: never in the token stream
  local res, cerr = llm:chat { messages = _M.messages(system, state), stream = false }
  if not res then error("general: LLM call failed: " .. tostring(cerr), 0) end
  local text = _M.reply_text(res)
  if not text or text:match("^%s*$") then
    error("general: the LLM returned no text", 0)
  end
  return {
    contexts = {
      general = { ok = true, source = "llm", sample = false, text = text, data = { llm = true } },
    },
  }
end

return _M
