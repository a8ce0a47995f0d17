-- The offline GCRI strategies: deterministic functions for number puzzles
-- ("make 24 from 4 7 8 8", see scripts/gcri/puzzle.lua). sample_strategies
-- takes them in this order, skipping the ones the memory says were tried, so
-- the cheap guesses go first and the exhaustive searches come in a later
-- iteration if the guesses are rejected.
--
-- A strategy: {name, description, hypothesize = fn(task) -> hypothesis | nil,
-- reasoning}. A nil hypothesis means the strategy found none (the
-- aggregation discards it).

local puzzle = require "scripts.gcri.puzzle"

local function parsed(task)
  local p = puzzle.parse(task)
  if not p then
    return nil, "not a number puzzle (the offline strategies solve tasks like 'make 24 from 4 7 8 8')"
  end
  return p
end

local function sorted(list, desc)
  local out = {}
  for i, v in ipairs(list) do out[i] = v end
  table.sort(out, function(a, b) if desc then return a > b end return a < b end)
  return out
end

local function greedy(desc)
  return function(task)
    local p, err = parsed(task)
    if not p then return nil, err end
    local nums = desc and sorted(p.numbers, true) or p.numbers
    return puzzle.greedy(nums, p.target),
      "joined the numbers " .. (desc and "largest first" or "in the given order") ..
      ", each with the operator that lands closest to " .. p.target
  end
end

local function search(order, ops)
  return function(task)
    local p, err = parsed(task)
    if not p then return nil, err end
    local nums = p.numbers
    if order == "asc" then nums = sorted(nums) elseif order == "desc" then nums = sorted(nums, true) end
    local e, serr = puzzle.search(nums, p.target, { ops = ops })
    if not e then
      return nil, serr or ("no combination of " .. table.concat(p.numbers, " ") .. " reaches " .. p.target)
    end
    return e, "searched every way to combine two numbers at a time (operators in the order " .. ops ..
      ") until one expression was left equal to " .. p.target
  end
end

return {
  { name = "greedy_in_order", description = "combine the numbers left to right, greedily toward the target",
    hypothesize = greedy(false) },
  { name = "greedy_largest_first", description = "combine the largest numbers first, greedily toward the target",
    hypothesize = greedy(true) },
  { name = "search_in_order", description = "exhaustive search over pairwise combinations, numbers in the given order",
    hypothesize = search("given", "+-*/") },
  { name = "search_multiply_first", description = "exhaustive search trying * and / before + and -, smallest numbers first",
    hypothesize = search("asc", "*/+-") },
  { name = "search_largest_first", description = "exhaustive search, largest numbers first, * before + and -",
    hypothesize = search("desc", "*+-/") },
}
