-- moongraph.pretty: a readable rendering of Lua values for the REPL.
--
-- pretty.format(v, {depth = 4, indent = "  ", width = 80}) -> string.
-- Short tables stay on one line; keys are sorted (sequence part first);
-- cycles print as <cycle>; depth is bounded.

local type, tostring, string_format, concat, sort = type, tostring, string.format, table.concat, table.sort
local math_type = math.type

local _M = {}

local function is_identifier(s)
  return type(s) == "string" and s:match("^[%a_][%w_]*$") ~= nil
end

local function scalar(v)
  local t = type(v)
  if t == "string" then return string_format("%q", v):gsub("\\\n", "\\n") end
  if t == "number" then
    if math_type(v) == "float" and v == math.floor(v) and v > -1e15 and v < 1e15 then
      return string_format("%.1f", v)
    end
    return tostring(v)
  end
  return tostring(v)
end

local function key_order(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

local function render(v, opts, level, seen)
  if type(v) ~= "table" then return scalar(v) end
  if seen[v] then return "<cycle>" end
  if level >= opts.depth then return "{...}" end
  seen[v] = true
  local n = #v
  local parts = {}
  for i = 1, n do parts[#parts + 1] = render(v[i], opts, level + 1, seen) end
  local keys = {}
  for k in pairs(v) do
    if not (math_type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  sort(keys, key_order)
  for _, k in ipairs(keys) do
    local ks = is_identifier(k) and k or ("[" .. render(k, opts, level + 1, seen) .. "]")
    parts[#parts + 1] = ks .. " = " .. render(v[k], opts, level + 1, seen)
  end
  seen[v] = nil
  if #parts == 0 then return "{}" end
  local one = "{ " .. concat(parts, ", ") .. " }"
  if #one + #opts.indent * level <= opts.width and not one:find("\n", 1, true) then
    return one
  end
  local pad = opts.indent:rep(level + 1)
  return "{\n" .. pad .. concat(parts, ",\n" .. pad) .. "\n" .. opts.indent:rep(level) .. "}"
end

function _M.format(v, opts)
  opts = opts or {}
  local o = { depth = opts.depth or 4, indent = opts.indent or "  ", width = opts.width or 80 }
  return render(v, o, 0, {})
end

return _M
