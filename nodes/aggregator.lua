-- aggregator: collects what the parallel nodes of the turn brought back.
--
-- The engine has already merged every node's `contexts` entry into the
-- state and recorded how each task went (ctx.previous_tasks: the node asked
-- for, the node that finally ran, its error, and the fallback chain of the
-- nodes that failed before it). This node writes an entry for every node
-- that failed (so `contexts` maps each node that ran to its result or its
-- error), lists the nodes that ran in order (`nodes_run`), logs what arrived
-- and what did not, and decides where the turn goes next (`aggregate.next`):
--
--   answer    the primary request has a usable context, or it only lacks
--             services that are not configured (nothing to retry), or the
--             fallback chain already ran
--   general   the primary request failed after its own fallback policy:
--             the chain goes on with the general node (which, without an
--             LLM, fails over to clarify by its own policy)
local text = require "moongraph.text"
local turn = require "nodes.lib.turn"

local ipairs, pairs, type, tostring = ipairs, pairs, type, tostring
local concat = table.concat

local _M = {
  name = "aggregator",
  policy = "fail_close",
  timeout = 5,
}

_M.describe = turn.describe

local function list_of(v)
  if type(v) == "table" then return v end
  return {}
end

-- The first line of an error, for the report and the answer's notices.
local function clean_error(e)
  local s = text.error_message(e or "")
  return s:match("^[^\n]*") or s
end
_M.clean_error = clean_error

-- Pure: the turn's report from the state and the engine's records of the
-- run's earlier tasks. Returns
-- { order = {node...}, status = {node = "ok"|"unavailable"|"empty"|"failed"},
--   failures = {node = {error=, fallback=, fallback_of=}},
--   chained = bool, primary = node, fallback_to = {node = its fallback} }
function _M.report(state, records)
  local contexts = type(state.contexts) == "table" and state.contexts or {}
  local failures, fallback_to, chain_step = {}, {}, {}
  local ran, chained = {}, false
  local after_aggregator = false
  for _, r in ipairs(list_of(records)) do
    if r.node == _M.name then
      after_aggregator = true
    elseif r.send ~= nil and r.ran then
      -- a branch task (every branch runs as a Send)
      local chain = list_of(r.chain)
      for i, c in ipairs(chain) do
        local nxt = chain[i + 1] and chain[i + 1].node or r.ran
        ran[c.node] = true
        failures[c.node] = { error = clean_error(c.error), fallback = nxt,
                             fallback_of = chain[i - 1] and chain[i - 1].node or nil }
        fallback_to[c.node] = nxt
      end
      ran[r.ran] = true
      if r.status == "failed" then
        failures[r.ran] = { error = clean_error(r.error),
                            fallback_of = chain[1] and chain[#chain].node or nil }
      end
      if after_aggregator then
        chained = true
        chain_step[r.node] = true
        for _, c in ipairs(chain) do chain_step[c.node] = true end
        chain_step[r.ran] = true
      end
    end
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

  -- order: routed nodes, each followed by its fallbacks, then the rest,
  -- the chain's steps last
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
    if not seen[node] and not chain_step[node] then rest[#rest + 1] = node end
  end
  table.sort(rest)
  for _, node in ipairs(rest) do add(node) end
  for _, r in ipairs(list_of(records)) do
    if r.send ~= nil and chain_step[r.node] then
      for _, c in ipairs(list_of(r.chain)) do add(c.node) end
      add(r.node)
      add(r.ran)
    end
  end

  return { order = order, status = status, failures = failures, chained = chained,
           primary = primary, fallback_to = fallback_to, chain_step = chain_step }
end

-- Pure: where the turn goes after the report -> "answer" | "general", and why.
function _M.next_step(rep)
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
  if p ~= "general" and not rep.status.general then
    return "general", concat(chain, " -> ") .. " failed; the chain goes on"
  end
  return "answer", concat(chain, " -> ") .. " failed"
end

function _M.run(state, ctx)
  local rep = _M.report(state, ctx and ctx.previous_tasks)
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
    elseif rep.chain_step[node] then
      -- a step of the fallback chain that gave way to the next one (general
      -- without an LLM) is how the chain works, not something missing
    else
      local reason
      if type(c) == "table" and c.text and s ~= "failed" then reason = c.text
      elseif f then reason = f.error
      elseif type(c) == "table" and c.error then reason = clean_error(c.error) end
      missing[#missing + 1] = { node = node, status = s, reason = reason or s,
                                fallback = f and f.fallback or nil }
    end
  end
  local nxt, why = _M.next_step(rep)
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
