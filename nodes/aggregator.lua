-- aggregator: collects what the parallel nodes of the turn brought back.
--
-- The engine has already merged every node's `contexts` entry into the
-- state; this node checks them against what the router sent, writes an
-- entry for every node that failed (so `contexts` maps each node that ran to
-- its result or its error), lists the nodes that ran in order (`nodes_run`),
-- logs what arrived and what did not, and decides where the turn goes next
-- (`aggregate.next`):
--
--   answer    the primary request has a usable context, or it only lacks
--             services that are not configured (nothing to retry)
--   general   the primary request failed after its own fallback policy and
--             an LLM is configured: the general node answers it
--   clarify   as above without an LLM, or the general step was already
--             tried: ask the user to rephrase
--
-- Failure records come from three places: the engine's `errors` (a fail_open
-- node, or the end of a fallback chain), `node_runs` entries with ok = false
-- (a node whose fallback then succeeded), and a fallback's `fallback_of`
-- (the node it stood in for).
local ipairs, pairs, type, tostring = ipairs, pairs, type, tostring
local concat = table.concat

local _M = {
  name = "aggregator",
  policy = "fail_close",
  timeout = 5,
}

-- What each node's context is, for logs and the answer's headings.
_M.descriptions = {
  waste_rag = "분리배출 방법",
  character = "캐릭터 정보",
  location = "장소 정보",
  web_search = "웹 검색 결과",
  bulk_waste = "대형폐기물 정보",
  recyclable_price = "재활용 시세",
  weather = "날씨 정보",
  collection_point = "수거함 위치",
  image_generation = "이미지 생성",
  general = "일반 대화",
  clarify = "다시 질문 요청",
}

function _M.describe(node)
  return _M.descriptions[node] or node
end

local function list_of(v)
  if type(v) == "table" then return v end
  return {}
end

-- First line of an error without a leading "node 'x' failed: " or traceback.
local function clean_error(e)
  local s = tostring(e or "")
  s = s:gsub("\nstack traceback:.*$", "")
  s = s:match("^[^\n]*") or s
  return s
end
_M.clean_error = clean_error

-- Pure: the turn's report from the state. Returns
-- { order = {node...}, status = {node = "ok"|"unavailable"|"empty"|"failed"},
--   failures = {node = {error=, fallback=, fallback_of=, chain_of=}},
--   chained = bool, primary = node }
function _M.report(state)
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  local runs = list_of(state.node_runs)
  local errors = list_of(state.errors)
  local failures, fallback_to, chain_of = {}, {}, {}
  local ran = {}

  for _, r in ipairs(runs) do
    if type(r) == "table" and r.node then
      ran[r.node] = true
      if r.fallback_of then fallback_to[r.fallback_of] = r.node end
      if r.chain_of then chain_of[r.node] = r.chain_of end
      if r.ok == false then
        failures[r.node] = { error = clean_error(r.error), fallback_of = r.fallback_of }
      end
    end
  end
  for _, e in ipairs(errors) do
    if type(e) == "table" and e.node then
      ran[e.node] = true
      failures[e.node] = failures[e.node] or {}
      failures[e.node].error = clean_error(e.error)
      if e.fallback_of then
        failures[e.node].fallback_of = e.fallback_of
        fallback_to[e.fallback_of] = fallback_to[e.fallback_of] or e.node
        -- the node the chain started from failed too, even when its own
        -- record did not survive the chain's failure
        if not failures[e.fallback_of] and not (contexts[e.fallback_of] or {}).ok then
          failures[e.fallback_of] = { error = "실패하여 " .. e.node .. "(으)로 대체" }
          ran[e.fallback_of] = true
        end
      end
    end
  end
  for node, f in pairs(failures) do
    if fallback_to[node] then f.fallback = fallback_to[node] end
  end

  local status = {}
  for node, c in pairs(contexts) do
    if type(c) == "table" and c.__reset == nil then
      ran[node] = true
      if c.ok then status[node] = "ok"
      elseif c.unavailable then status[node] = "unavailable"
      elseif c.error then status[node] = "failed"
      else status[node] = "empty" end
    end
  end
  for node in pairs(failures) do
    if not status[node] or status[node] == "failed" then status[node] = "failed" end
  end

  -- order: routed nodes, each followed by its fallbacks, then the rest
  local order, seen = {}, {}
  local function add(node)
    if node and ran[node] and not seen[node] then
      seen[node] = true
      order[#order + 1] = node
      add(fallback_to[node])
    end
  end
  local primary
  for _, d in ipairs(list_of(state.routing)) do
    if type(d) == "table" then
      if d.rule == "primary" then primary = d.node end
      add(d.node)
    end
  end
  local rest = {}
  for node in pairs(ran) do
    if not seen[node] then rest[#rest + 1] = node end
  end
  table.sort(rest, function(a, b)
    -- chain steps (general, then clarify) after everything else
    local ca, cb = chain_of[a] and 1 or 0, chain_of[b] and 1 or 0
    if ca ~= cb then return ca < cb end
    if a == "clarify" or b == "clarify" then return b == "clarify" end
    return a < b
  end)
  for _, node in ipairs(rest) do add(node) end

  local chained = next(chain_of) ~= nil or status.clarify ~= nil
  return { order = order, status = status, failures = failures, chained = chained,
           primary = primary, fallback_to = fallback_to }
end

-- Pure: where the turn goes after the report -> "answer" | "general" |
-- "clarify", and why.
function _M.next_step(rep, has_llm)
  local p = rep.primary
  if not p then return "answer", "nothing was routed" end
  local chain, node = {}, p
  while node and #chain < 10 do
    chain[#chain + 1] = node
    node = rep.fallback_to[node]
  end
  local failed = false
  for _, n in ipairs(chain) do
    local s = rep.status[n]
    if s == "ok" then return "answer", n .. " answered" end
    if s == "failed" or s == "empty" then failed = true end
  end
  if rep.chained then return "answer", "the fallback chain already ran" end
  if not failed then
    return "answer", concat(chain, " -> ") .. " not configured"
  end
  if has_llm and p ~= "general" and not rep.status.general then
    return "general", concat(chain, " -> ") .. " failed; asking the LLM"
  end
  return "clarify", concat(chain, " -> ") .. " failed"
end

function _M.run(state, ctx)
  local rep = _M.report(state)
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  local add_ctx = nil
  local collected, missing, samples = {}, {}, {}
  for _, node in ipairs(rep.order) do
    local s = rep.status[node]
    local f = rep.failures[node]
    local c = contexts[node]
    if s == "failed" and f and not (type(c) == "table" and c.error) then
      add_ctx = add_ctx or {}
      add_ctx[node] = { ok = false, error = f.error, fallback = f.fallback,
                        fallback_of = f.fallback_of }
    end
    if s == "ok" then
      collected[#collected + 1] = node
      if type(c) == "table" and c.sample then samples[#samples + 1] = node end
    else
      local reason
      if type(c) == "table" and c.text and s ~= "failed" then reason = c.text
      elseif f then reason = f.error
      elseif type(c) == "table" and c.error then reason = clean_error(c.error) end
      missing[#missing + 1] = { node = node, status = s, reason = reason or s,
                                fallback = f and f.fallback or nil }
    end
  end
  local has_llm = ctx and ctx.llm ~= nil
  local nxt, why = _M.next_step(rep, has_llm)
  local aggregate = {
    collected = collected, missing = missing, samples = samples,
    primary = rep.primary, next = nxt, reason = why,
  }
  if ctx and ctx.emit then
    local names = {}
    for i, n in ipairs(collected) do names[i] = n end
    local lost = {}
    for i, m in ipairs(missing) do lost[i] = m.node .. " (" .. m.status .. ")" end
    ctx.emit { type = "log", node = "aggregator",
      text = ("arrived: %s; missing: %s; next: %s (%s)"):format(
        #names > 0 and concat(names, ", ") or "none",
        #lost > 0 and concat(lost, ", ") or "none", nxt, why) }
  end
  local up = { nodes_run = rep.order, aggregate = aggregate }
  if add_ctx then up.contexts = add_ctx end
  return up
end

return _M
