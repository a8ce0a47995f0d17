-- answer: the reply to the user, streamed token by token.
--
-- With an LLM (ctx.config.llm, a moongraph.llm client) the system prompt of
-- prompts/answer.txt, the in-context examples of prompts/answer_examples.txt,
-- the last turns of the conversation and the question with its contexts go
-- out with `stream`, and every delta reaches ctx.stream_token as it arrives.
-- Without an LLM the answer is extractive: the contexts' own texts under
-- their headings, labelled as an offline answer. Either way the answer ends
-- with the turn's notices (what could not be fetched, which contexts are
-- sample data), so a failing or unconfigured service is always named.
--
-- When the aggregator ended the turn at clarify, the answer is clarify's
-- request to rephrase. An LLM that fails before its first token gives way to
-- the extractive answer (saying so); one that fails midway keeps what it
-- streamed and says it was cut off. The node itself does not fail.
local turn = require "nodes.lib.turn"
local prompts = require "moongraph.prompt"
local general = require "nodes.general"

local type, ipairs, pairs, tostring, concat = type, ipairs, pairs, tostring, table.concat

local _M = {
  name = "answer",
  policy = "fail_close",
  timeout = 120,
  history_messages = 4,  -- earlier messages sent to the LLM
}

_M.offline_header = "[오프라인 답변] LLM이 설정되어 있지 않아, 찾은 정보를 그대로 정리했습니다."
_M.fallback_header = "[오프라인 답변] LLM 호출에 실패해, 찾은 정보를 그대로 정리했습니다"


-- Pure: the in-context examples of prompts/answer_examples.txt as
-- { {question, contexts, missing, answer}, ... }.
function _M.parse_examples(text)
  local out = {}
  for block in (text .. "\n---\n"):gmatch("(.-)\n%-%-%-%s*\n") do
    local ex, key = {}, nil
    for line in (block .. "\n"):gmatch("(.-)\n") do
      local h = line:match("^###%s*(.-)%s*$")
      if h then
        key = ({ ["질문"] = "question", ["컨텍스트"] = "contexts",
                 ["가져오지 못한 정보"] = "missing", ["답변"] = "answer" })[h]
        if key then ex[key] = {} end
      elseif key then
        local t = ex[key]
        t[#t + 1] = line
      end
    end
    if ex.question and ex.answer then
      local e = {}
      for k, lines in pairs(ex) do
        e[k] = concat(lines, "\n"):gsub("^%s+", ""):gsub("%s+$", "")
      end
      out[#out + 1] = e
    end
  end
  return out
end

-- Pure: the user message of one question with its contexts and what is missing.
function _M.user_prompt(question, contexts_text, missing_lines)
  local parts = { "### 질문\n" .. question }
  parts[#parts + 1] = "### 컨텍스트\n" .. (contexts_text ~= "" and contexts_text or "(없음)")
  if missing_lines and #missing_lines > 0 then
    local m = {}
    for i, l in ipairs(missing_lines) do m[i] = "- " .. l:gsub("^※%s*", "") end
    parts[#parts + 1] = "### 가져오지 못한 정보\n" .. concat(m, "\n")
  end
  return concat(parts, "\n\n")
end

-- Pure: the chat messages for the LLM -> list | nil, err (the system
-- template names a value the node does not have).
function _M.messages(state, system, examples)
  local sections = turn.sections(state)
  local notices = turn.notices(state, sections)
  local summary = type(state.summary) == "table" and state.summary.text or nil
  local system_text, err = prompts.render(system, {
    summary = summary and ("\n이전 대화 요약:\n" .. summary) or "",
  }, "answer.txt")
  if not system_text then return nil, err end
  local msgs = { { role = "system", content = system_text } }
  for _, ex in ipairs(examples or {}) do
    local missing = nil
    if ex.missing then
      missing = {}
      for l in (ex.missing .. "\n"):gmatch("(.-)\n") do
        if l:find("%S") then missing[#missing + 1] = (l:gsub("^%-%s*", "")) end
      end
    end
    msgs[#msgs + 1] = { role = "user", content = _M.user_prompt(ex.question, ex.contexts or "", missing) }
    msgs[#msgs + 1] = { role = "assistant", content = ex.answer }
  end
  -- earlier turns (the current question is the last user message)
  local hist = type(state.messages) == "table" and state.messages or {}
  local last = #hist
  if last > 0 and hist[last].role == "user" and hist[last].content == state.message then
    last = last - 1
  end
  for i = math.max(1, last - _M.history_messages + 1), last do
    local m = hist[i]
    if type(m) == "table" and (m.role == "user" or m.role == "assistant") and type(m.content) == "string" then
      msgs[#msgs + 1] = { role = m.role, content = m.content }
    end
  end
  msgs[#msgs + 1] = { role = "user", content = _M.user_prompt(state.message or "", turn.render(sections), notices) }
  return msgs
end

-- Pure: the extractive answer's lines (header, sections, notices).
-- sections: turn.sections(state) when the caller has them already.
function _M.offline_lines(state, header, sections)
  local lines = { header or _M.offline_header }
  sections = sections or turn.sections(state)
  for _, s in ipairs(sections) do
    lines[#lines + 1] = ""
    lines[#lines + 1] = "■ " .. s.heading
    lines[#lines + 1] = s.text
  end
  if #sections == 0 then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "질문에 답할 정보를 찾지 못했습니다."
  end
  return lines
end

local function emitter(ctx)
  local parts = {}
  local put = ctx and ctx.stream_token
  return parts, function(text)
    if text == nil or text == "" then return end
    parts[#parts + 1] = text
    if put then put(text) end
  end
end

local function stream_lines(out, lines, first)
  for i, l in ipairs(lines) do
    if i > 1 or not first then out("\n") end
    out(l)
  end
end

local function footer(out, notices)
  if #notices == 0 then return end
  out("\n")
  for _, l in ipairs(notices) do out("\n" .. l) end
end

local function ask_llm(llm, state, out)
  local system, err = prompts.load("answer.txt")
  if not system then return nil, err end
  local ex_text = prompts.load("answer_examples.txt")
  local examples = ex_text and _M.parse_examples(ex_text) or {}
  local messages, merr = _M.messages(state, system, examples)
  if not messages then return nil, merr end
  local streamed = 0
  local res, cerr = llm:chat {
    messages = messages,
    stream = function(delta)
      local text = type(delta) == "table" and (delta.content or delta.text) or delta
      if type(text) == "string" and text ~= "" then
        streamed = streamed + 1
        out(text)
      end
    end,
  }
  if not res then return nil, tostring(cerr), streamed end
  if streamed == 0 then
    -- a client that did not stream: send the whole reply at once
    local text = general.reply_text(res)
    if not text or not text:find("%S") then return nil, "the LLM returned no text", 0 end
    out(text)
    streamed = 1
  end
  return true, nil, streamed
end

function _M.run(state, ctx)
  local parts, out = emitter(ctx)
  local sections = turn.sections(state)
  local notices = turn.notices(state, sections)
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  local source, llm_error
  local llm = ctx and ctx.config and ctx.config.llm
  if type(contexts.clarify) == "table" and contexts.clarify.ok then
    source = "clarify"
    out(contexts.clarify.text)
  elseif llm then
    local ok, err, streamed = ask_llm(llm, state, out)
    if ok then
      source = "llm"
    elseif streamed and streamed > 0 then
      source = "llm"
      llm_error = err
      out("\n(응답 생성이 중단되었습니다)")
    else
      source = "offline"
      llm_error = err
      stream_lines(out, _M.offline_lines(state, _M.fallback_header .. ".", sections), true)
    end
  else
    source = "offline"
    stream_lines(out, _M.offline_lines(state, nil, sections), true)
  end
  footer(out, notices)
  local answer = concat(parts)
  return {
    answer = answer,
    answer_source = source,
    -- why the LLM answer failed, for the operator (never in the answer)
    answer_error = llm_error or false,
    messages = { role = "assistant", content = answer, turn = state.turn },
  }
end

return _M
