-- The relevance check of a strategy draft: length, store name, data
-- evidence, numbers, intent keywords and forbidden words
-- (rules.relevance). Every check reports {name, passed, detail}; the draft
-- passes when all do.

local rules = require "scripts.marketing.rules"

local _M = {}

local function count_terms(text, terms)
  local lower, hits, found = text:lower(), 0, {}
  for _, t in ipairs(terms) do
    if lower:find(t:lower(), 1, true) then
      hits = hits + 1
      found[#found + 1] = t
    end
  end
  return hits, found
end

--[[ run_all_checks(draft, ctx [, r]) -> report
ctx: {store_name, brand, intent}. report: {passed, score (0..1), checks,
failed (names of failed checks), feedback (one line per failed check)}. ]]
function _M.run_all_checks(draft, ctx, r)
  r = (r or rules).relevance
  draft = tostring(draft or "")
  local checks = {}
  local function add(name, passed, detail) checks[#checks + 1] = { name = name, passed = passed, detail = detail } end

  local len = utf8.len(draft) or #draft
  add("length", len >= r.min_length and len <= r.max_length,
    len .. " characters (expected " .. r.min_length .. " to " .. r.max_length .. ")")

  local named = (ctx.store_name and draft:find(ctx.store_name, 1, true)) or
    (ctx.brand and draft:find(ctx.brand, 1, true))
  add("store_name", named ~= nil, named and "mentions the store" or
    ("does not mention " .. tostring(ctx.store_name)))

  local dhits, dfound = count_terms(draft, r.data_terms)
  add("data_evidence", dhits > 0, dhits > 0 and ("cites " .. table.concat(dfound, ", ")) or
    "cites none of the store's data (" .. table.concat(r.data_terms, ", ") .. ")")

  local has_number = draft:find("%d") ~= nil
  add("numbers", has_number, has_number and "contains figures" or "contains no figure")

  local words = r.intent_keywords[ctx.intent] or {}
  local ihits, ifound = count_terms(draft, words)
  add("intent_keywords", ihits >= r.min_intent_keywords,
    ihits .. " " .. tostring(ctx.intent) .. " keywords" .. (ihits > 0 and (" (" .. table.concat(ifound, ", ") .. ")") or "") ..
    ", need " .. r.min_intent_keywords)

  local fhits, ffound = count_terms(draft, r.forbidden)
  add("forbidden_words", fhits == 0, fhits == 0 and "no forbidden claim" or
    ("makes forbidden claims: " .. table.concat(ffound, ", ")))

  local failed, feedback, ok = {}, {}, 0
  for _, c in ipairs(checks) do
    if c.passed then ok = ok + 1 else
      failed[#failed + 1] = c.name
      feedback[#feedback + 1] = c.name .. ": " .. c.detail
    end
  end
  return { passed = #failed == 0, score = ok / #checks, checks = checks, failed = failed, feedback = feedback }
end

return _M
