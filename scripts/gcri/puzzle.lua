-- Number puzzles, the task family the offline GCRI strategies can solve:
-- "make 24 from 4 7 8 8" — combine every given number exactly once with
-- + - * / and parentheses to reach the target. Arithmetic is exact
-- (fractions), so 8/(3-8/3) is 24, not 23.999.
--
--   parse(task)          -> {target = 24, numbers = {4, 7, 8, 8}} | nil
--   evaluate(expr)       -> value (fraction), numbers used | nil, err
--   check(task, expr)    -> passed, feedback
--   search(numbers, target, opts) -> expression | nil
--   greedy(numbers, target)       -> expression (not always right)

local _M = {}

_M.MAX_NUMBERS = 5   -- the exhaustive search stays well under a second

---------------------------------------------------------------------------
-- fractions {n, d}, d > 0, reduced

local function gcd(a, b)
  a, b = math.abs(a), math.abs(b)
  while b ~= 0 do a, b = b, a % b end
  return a
end

local function frac(n, d)
  d = d or 1
  if d < 0 then n, d = -n, -d end
  local g = gcd(n, d)
  if g > 1 then n, d = n // g, d // g end
  return { n, d }
end
_M.frac = frac

local function add(a, b) return frac(a[1] * b[2] + b[1] * a[2], a[2] * b[2]) end
local function sub(a, b) return frac(a[1] * b[2] - b[1] * a[2], a[2] * b[2]) end
local function mul(a, b) return frac(a[1] * b[1], a[2] * b[2]) end
local function div(a, b)
  if b[1] == 0 then return nil end
  return frac(a[1] * b[2], a[2] * b[1])
end
local function eq(a, b) return a[1] == b[1] and a[2] == b[2] end
local function tofloat(a) return a[1] / a[2] end

function _M.fraction_string(a)
  if a[2] == 1 then return tostring(a[1]) end
  return a[1] .. "/" .. a[2]
end

---------------------------------------------------------------------------
-- the task

--[[ parse(task) -> {target, numbers} | nil
Understands "make 24 from 4 7 8 8", "reach 100 with 25 50 3 6", "24 using
4, 7, 8, 8" and the Korean "4 7 8 8로 24 만들기". ]]
function _M.parse(task)
  if type(task) ~= "string" then return nil end
  local t = task:lower()
  local target, rest = t:match("make%s+(%-?%d+)%s+from%s+(.+)")
  if not target then target, rest = t:match("reach%s+(%-?%d+)%s+with%s+(.+)") end
  if not target then target, rest = t:match("^%s*(%-?%d+)%s+using%s+(.+)") end
  if not target then
    local nums, tgt = t:match("^%s*([%d%s,]+)%s*%S*로%s+(%-?%d+)%s*만들")
    if nums then target, rest = tgt, nums end
  end
  if not target then return nil end
  local numbers = {}
  for n in rest:gmatch("%d+") do numbers[#numbers + 1] = tonumber(n) end
  if #numbers < 2 then return nil end
  return { target = tonumber(target), numbers = numbers }
end

---------------------------------------------------------------------------
-- expressions: parsing and exact evaluation

--[[ evaluate(expr) -> value, numbers | nil, err
value is a fraction; numbers lists the integer literals in order. Only
integers, + - * /, parentheses and spaces are accepted. ]]
function _M.evaluate(expr)
  if type(expr) ~= "string" then return nil, "no expression" end
  local s = expr:gsub("[×xX]", "*"):gsub("÷", "/")
  local pos, used = 1, {}
  local function skip() pos = s:find("[^%s]", pos) or (#s + 1) end
  local parse_sum
  local function parse_atom()
    skip()
    local c = s:sub(pos, pos)
    if c == "(" then
      pos = pos + 1
      local v, err = parse_sum()
      if not v then return nil, err end
      skip()
      if s:sub(pos, pos) ~= ")" then return nil, "missing ')' at position " .. pos end
      pos = pos + 1
      return v
    end
    local num = s:match("^%d+", pos)
    if not num then
      return nil, (c == "" and "unexpected end" or ("unexpected '" .. c .. "'")) .. " at position " .. pos
    end
    pos = pos + #num
    used[#used + 1] = tonumber(num)
    return frac(tonumber(num))
  end
  local function parse_product()
    local v, err = parse_atom()
    if not v then return nil, err end
    while true do
      skip()
      local op = s:sub(pos, pos)
      if op ~= "*" and op ~= "/" then return v end
      pos = pos + 1
      local r, rerr = parse_atom()
      if not r then return nil, rerr end
      if op == "*" then v = mul(v, r) else
        v = div(v, r)
        if not v then return nil, "division by zero" end
      end
    end
  end
  parse_sum = function()
    local v, err = parse_product()
    if not v then return nil, err end
    while true do
      skip()
      local op = s:sub(pos, pos)
      if op ~= "+" and op ~= "-" then return v end
      pos = pos + 1
      local r, rerr = parse_product()
      if not r then return nil, rerr end
      v = op == "+" and add(v, r) or sub(v, r)
    end
  end
  local v, err = parse_sum()
  if not v then return nil, err end
  skip()
  if pos <= #s then return nil, "unexpected '" .. s:sub(pos, pos) .. "' at position " .. pos end
  return v, used
end

local function same_multiset(a, b)
  if #a ~= #b then return false end
  local count = {}
  for _, x in ipairs(a) do count[x] = (count[x] or 0) + 1 end
  for _, x in ipairs(b) do
    if not count[x] or count[x] == 0 then return false end
    count[x] = count[x] - 1
  end
  return true
end

--[[ check(task, expr) -> passed, feedback
The exact verifier: expr must use each given number once and equal the
target. ]]
function _M.check(task, expr)
  local p = type(task) == "table" and task or _M.parse(task)
  if not p then return false, "not a number puzzle" end
  if type(expr) ~= "string" or not expr:find("%S") then return false, "empty hypothesis" end
  local v, used = _M.evaluate(expr)
  if not v then return false, "not a valid expression: " .. used end
  if not same_multiset(used, p.numbers) then
    local u = {}
    for i, x in ipairs(used) do u[i] = tostring(x) end
    local g = {}
    for i, x in ipairs(p.numbers) do g[i] = tostring(x) end
    return false, "uses " .. table.concat(u, " ") .. " instead of " .. table.concat(g, " ")
  end
  if not eq(v, frac(p.target)) then
    return false, "evaluates to " .. _M.fraction_string(v) .. ", not " .. p.target
  end
  return true, "evaluates to " .. p.target .. " using every number once"
end

---------------------------------------------------------------------------
-- canonical printing: commutative operands in a fixed order, minimal
-- parentheses, so one solution found two ways prints the same

local PREC = { ["+"] = 1, ["-"] = 1, ["*"] = 2, ["/"] = 2 }

local function show(e, parent_prec, right_side, parent_op)
  if e.op == nil then return tostring(e.num) end
  local p = PREC[e.op]
  local l = show(e.l, p, false, e.op)
  local r = show(e.r, p, true, e.op)
  local s = l .. " " .. e.op .. " " .. r
  local need = p < parent_prec or
    (p == parent_prec and right_side and (parent_op == "-" or parent_op == "/"))
  if need then s = "(" .. s .. ")" end
  return s
end

local function node(op, a, b)
  if (op == "+" or op == "*") then
    local sa, sb = show(a, 0), show(b, 0)
    if sb < sa then a, b = b, a end
  end
  return { op = op, l = a, r = b }
end

function _M.show(e) return show(e, 0) end

---------------------------------------------------------------------------
-- strategies' engines

--[[ search(numbers, target, opts) -> canonical expression | nil
Exhaustive: repeatedly combine two items with an operator until one is
left. opts.ops: operator order (default "+-*/"); the numbers' order is the
caller's. The first solution in that order wins. ]]
function _M.search(numbers, target, opts)
  if #numbers > _M.MAX_NUMBERS then return nil, "more than " .. _M.MAX_NUMBERS .. " numbers" end
  local ops = (opts and opts.ops) or "+-*/"
  local goal = frac(target)
  local items = {}
  for i, n in ipairs(numbers) do items[i] = { v = frac(n), e = { num = n } } end
  local seen = {}
  local function key(list)
    local parts = {}
    for i, it in ipairs(list) do parts[i] = it.v[1] .. "/" .. it.v[2] end
    table.sort(parts)
    return table.concat(parts, ",")
  end
  local function rec(list)
    if #list == 1 then
      if eq(list[1].v, goal) then return list[1].e end
      return nil
    end
    local k = key(list)
    if seen[k] then return nil end
    seen[k] = true
    for i = 1, #list do
      for j = 1, #list do
        if i ~= j then
          local a, b = list[i], list[j]
          for oi = 1, #ops do
            local op = ops:sub(oi, oi)
            local v
            if op == "+" then if i < j then v = add(a.v, b.v) end
            elseif op == "*" then if i < j then v = mul(a.v, b.v) end
            elseif op == "-" then v = sub(a.v, b.v)
            else v = div(a.v, b.v) end
            if v then
              local rest = { { v = v, e = node(op, a.e, b.e) } }
              for m = 1, #list do
                if m ~= i and m ~= j then rest[#rest + 1] = list[m] end
              end
              local found = rec(rest)
              if found then return found end
            end
          end
        end
      end
    end
    return nil
  end
  local e = rec(items)
  return e and show(e, 0) or nil
end

--[[ greedy(numbers, target) -> expression
Left to right: each number joins the running result with the operator that
lands closest to the target. Fast, often wrong: a hypothesis for the
verifier to reject. ]]
function _M.greedy(numbers, target)
  local goal = target
  local cur = { v = frac(numbers[1]), e = { num = numbers[1] } }
  for i = 2, #numbers do
    local n = frac(numbers[i])
    local best, best_d = nil, math.huge
    for _, op in ipairs { "+", "-", "*", "/" } do
      local v
      if op == "+" then v = add(cur.v, n) elseif op == "-" then v = sub(cur.v, n)
      elseif op == "*" then v = mul(cur.v, n) else v = div(cur.v, n) end
      if v then
        local d = math.abs(tofloat(v) - goal)
        if d < best_d then best, best_d = { v = v, e = { op = op, l = cur.e, r = { num = numbers[i] } } }, d end
      end
    end
    cur = best
  end
  return show(cur.e, 0)
end

return _M
