-- clarify: the end of the fallback chain (RAG -> web search -> general ->
-- clarify). When nothing could answer the question it asks the user to say
-- it again, more concretely, and tells why: no matching rule, or a service
-- that failed (then trying again later may help as well).
--
-- It runs as general's fallback (the LLM failed, or there is none). Input:
-- the state or the aggregator's Send argument, whose `chain_failures` lists
-- {node, error} of the steps that failed; ctx.failures (the engine's) adds
-- the nodes that failed before it in its own task, such as general. It
-- never fails.
local ipairs, type, tostring, concat = ipairs, type, tostring, table.concat

local _M = {
  name = "clarify",
  policy = "fail_close",
  timeout = 1,
}

_M.ask = "질문을 정확히 이해하지 못했어요. 찾으시는 품목이나 장소를 조금 더 구체적으로 "
  .. "다시 말씀해 주시겠어요?"

_M.examples = {
  "\"투명 페트병 어떻게 버려?\"",
  "\"강남구 의류수거함 어디 있어?\"",
  "\"소파 버리는 수수료 얼마야?\"",
}

-- How a failure reads to the user: named, never quoted (an upstream's
-- error is for the operator; state.errors keeps it).
local function reason_text(f)
  local e = type(f.error) == "string" and f.error or ""
  if e:find("no disposal rule matches", 1, true) then
    return "분리배출 규정에서 질문에 맞는 품목을 찾지 못했습니다"
  end
  if e:find("LLM", 1, true) or f.node == "general" then
    return "대화용 LLM 호출에 실패했습니다"
  end
  if e:find("unavailable", 1, true) or e:find("오프라인", 1, true) then
    return (f.node or "서비스") .. "은(는) 지금 사용할 수 없습니다"
  end
  return (f.node or "서비스") .. " 조회에 실패했습니다"
end

function _M.run(state, ctx)
  local failures = {}
  local given = type(state) == "table" and state.chain_failures
  for _, f in ipairs(type(given) == "table" and given or {}) do failures[#failures + 1] = f end
  local own = ctx and ctx.failures
  for _, f in ipairs(type(own) == "table" and own or {}) do
    -- general giving way for want of an LLM is the chain, not a failure to report
    if not (f.node == "general" and tostring(f.error):find("no LLM configured", 1, true)) then
      failures[#failures + 1] = f
    end
  end
  local reasons, service_error = {}, false
  for _, f in ipairs(failures) do
    if type(f) == "table" then
      reasons[#reasons + 1] = reason_text(f)
      local e = type(f.error) == "string" and f.error or ""
      if not e:find("no disposal rule matches", 1, true) then service_error = true end
    end
  end
  local lines = { _M.ask }
  if #reasons > 0 then lines[#lines + 1] = "(" .. concat(reasons, "; ") .. ")" end
  if service_error then
    lines[#lines + 1] = "일시적인 문제일 수 있으니 잠시 후 다시 시도해 주셔도 됩니다."
  end
  lines[#lines + 1] = "예: " .. concat(_M.examples, ", ")
  return {
    contexts = {
      clarify = {
        ok = true, source = "clarify", sample = false,
        text = concat(lines, "\n"),
        data = { reasons = reasons },
      },
    },
  }
end

return _M
