-- Phase 2 of GCRI: merge the raw hypotheses of one iteration into
-- aggregated branches, so each distinct idea is verified once.
--
-- Offline: hypotheses whose normalised text is equal (case, spacing and a
-- trailing full stop ignored) become one branch; empty hypotheses are
-- discarded. With an LLM, the model proposes the merge as JSON; a reply
-- that does not account for every hypothesis exactly once is refused and
-- the offline merge is used instead (the summary says so).

local states = require "scripts.gcri.states"

local _M = {}

--[[ normalise(text) -> the text compared for equality: lower case, runs of
spaces as one, no spaces next to punctuation or operators, no trailing
full stop. ]]
function _M.normalise(text)
  local s = tostring(text or ""):lower()
  s = s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
  s = s:gsub(" ?([%p]) ?", "%1")
  s = s:gsub("%.$", "")
  return s
end

local function list_str(l)
  local out = {}
  for i, v in ipairs(l) do out[i] = tostring(v) end
  return table.concat(out, ", ")
end

--[[ offline(raws) -> AggregationResult
raws: this iteration's RawHypothesis list. Branch indices follow the first
source of each group, in raw index order. ]]
function _M.offline(raws)
  local ordered = {}
  for i, r in ipairs(raws) do ordered[i] = r end
  table.sort(ordered, function(a, b) return a.index < b.index end)
  local groups, by_text, discarded = {}, {}, {}
  for _, r in ipairs(ordered) do
    local key = _M.normalise(r.hypothesis)
    if key == "" then
      discarded[#discarded + 1] = r.index
    elseif by_text[key] then
      local g = by_text[key]
      g.sources[#g.sources + 1] = r.index
    else
      local g = { text = r.hypothesis, sources = { r.index } }
      by_text[key] = g
      groups[#groups + 1] = g
    end
  end
  local branches, merged = {}, 0
  for i, g in ipairs(groups) do
    local why
    if #g.sources == 1 then
      why = "only hypothesis " .. g.sources[1] .. " says this"
    else
      merged = merged + 1
      why = "hypotheses " .. list_str(g.sources) .. " are the same after normalisation"
    end
    branches[i] = states.AggregatedBranch {
      index = i, combined_hypothesis = g.text, source_indices = g.sources, merge_reasoning = why,
    }
  end
  local summary = string.format("%d hypotheses -> %d branch%s (%d merged from several), %d discarded%s",
    #raws, #branches, #branches == 1 and "" or "es", merged, #discarded,
    #discarded > 0 and (" (no hypothesis: " .. list_str(discarded) .. ")") or "")
  return states.AggregationResult {
    branches = branches, discarded_indices = discarded, aggregation_summary = summary,
  }
end

--[[ validate(result, raws) -> AggregationResult | nil, err
Every raw index in exactly one branch's sources or in discarded_indices;
branch indices renumbered 1..n in the given order. ]]
function _M.validate(result, raws)
  if type(result) ~= "table" or type(result.branches) ~= "table" then
    return nil, "no branches list"
  end
  local known, seen = {}, {}
  for _, r in ipairs(raws) do known[r.index] = true end
  local function claim(i, where)
    if math.type(i) ~= "integer" and type(i) == "number" and i % 1 == 0 then i = math.tointeger(i) end
    if not known[i] then return nil, where .. " names hypothesis " .. tostring(i) .. ", which does not exist" end
    if seen[i] then return nil, "hypothesis " .. i .. " is used twice" end
    seen[i] = true
    return i
  end
  local branches = {}
  for bi, b in ipairs(result.branches) do
    if type(b) ~= "table" or type(b.combined_hypothesis) ~= "string" or type(b.source_indices) ~= "table"
      or #b.source_indices == 0 then
      return nil, "branch " .. bi .. " lacks combined_hypothesis or source_indices"
    end
    local src = {}
    for _, i in ipairs(b.source_indices) do
      local v, err = claim(i, "branch " .. bi)
      if not v then return nil, err end
      src[#src + 1] = v
    end
    table.sort(src)
    branches[bi] = states.AggregatedBranch {
      index = bi, combined_hypothesis = b.combined_hypothesis, source_indices = src,
      merge_reasoning = type(b.merge_reasoning) == "string" and b.merge_reasoning or "",
    }
  end
  local discarded = {}
  for _, i in ipairs(type(result.discarded_indices) == "table" and result.discarded_indices or {}) do
    local v, err = claim(i, "discarded_indices")
    if not v then return nil, err end
    discarded[#discarded + 1] = v
  end
  for _, r in ipairs(raws) do
    if not seen[r.index] then return nil, "hypothesis " .. r.index .. " is neither in a branch nor discarded" end
  end
  table.sort(discarded)
  return states.AggregationResult {
    branches = branches, discarded_indices = discarded,
    aggregation_summary = type(result.aggregation_summary) == "string" and result.aggregation_summary or "",
  }
end

return _M
