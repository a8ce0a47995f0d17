-- The sentence split of core.sentences.split written with Lua patterns (the
-- rule runtime/sentences.c follows), for specs and fuzz/sentences_fuzz.c to
-- hold the C one to.
local find, sub, byte = string.find, string.sub, string.byte

local function next_mark(line, from)
  local a = find(line, ".", from, true)
  local b = find(line, "!", from, true)
  local c = find(line, "?", from, true)
  if b and (not a or b < a) then a = b end
  if c and (not a or c < a) then a = c end
  return a
end

local function split_line(line, from, out)
  local at = from
  while true do
    local m = next_mark(line, at)
    if not m then break end
    local _, b = find(line, "^[%.!?]+%s+", m)
    if b then
      out[#out + 1] = sub(line, from, m)
      from = b + 1
      at = from
    else
      at = m + 1
    end
  end
  if from <= #line then out[#out + 1] = sub(line, from) end
end

return function(text, skip)
  local out = {}
  local pos, size = 1, #text
  while pos <= size + 1 do
    local nl = find(text, "\n", pos, true)
    local line = sub(text, pos, (nl or size + 1) - 1)
    pos = (nl or size + 1) + 1
    local at = find(line, "%S")
    local left_out = not at
    for _, p in ipairs(skip or {}) do
      if at and sub(line, at, at + #p - 1) == p then left_out = true end
    end
    if not left_out then
      local _, e = find(line, "^[%-%*•]%s*", at)
      if e then at = e + 1 end
      _, e = find(line, "^%d+[%.%)]%s*", at)
      if e then at = e + 1 end
      split_line(line, at, out)
    end
  end
  return out
end
