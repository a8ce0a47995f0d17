-- Store resolution: candidates from search_merchant, ranked exact match >
-- prefix match > shorter name (then name order), and the choice among them.

local tools_mod = require "scripts.marketing.tools"

local _M = {}

local norm = tools_mod.norm

local function tier(query, m)
  local q, n = norm(query), norm(m.name)
  if n == q then return 0 end
  if n:sub(1, #q) == q then return 1 end
  return 2
end

--[[ rank(query, merchants) -> new list, best first ]]
function _M.rank(query, merchants)
  local list = {}
  for i, m in ipairs(merchants) do list[i] = m end
  table.sort(list, function(a, b)
    local ta, tb = tier(query, a), tier(query, b)
    if ta ~= tb then return ta < tb end
    local la, lb = utf8.len(a.name) or #a.name, utf8.len(b.name) or #b.name
    if la ~= lb then return la < lb end
    return a.name < b.name
  end)
  return list
end

--[[ pick(answer, candidates) -> candidate | nil
The candidate a clarification answer names: its store_id, its position in
the list ("2", "2번"), its exact name, or the only candidate whose name
contains the answer. ]]
function _M.pick(answer, candidates)
  if type(answer) ~= "string" then return nil end
  local a = answer:gsub("^%s+", ""):gsub("%s+$", "")
  local n = tonumber(a:match("^(%d+)$") or a:match("^(%d+)%s*번$"))
  if n and candidates[n] then return candidates[n] end
  for _, c in ipairs(candidates) do
    if c.store_id == a or norm(c.name) == norm(a) then return c end
  end
  local hit = nil
  for _, c in ipairs(candidates) do
    if norm(a) ~= "" and norm(c.name):find(norm(a), 1, true) then
      if hit then return nil end
      hit = c
    end
  end
  return hit
end

return _M
