--[[
moongraph.args — the command line of every moongraph command, parsed one way.

  local args = require "moongraph.args"
  local SPEC = {
    name = "chat",
    usage = "usage: chat [--thread ID] [--json] MESSAGE",
    options = { thread = "string", json = "flag", branches = "integer",
                timeout = "number", script = "list", ["prev-intent"] = "string" },
    positional = { name = "message", label = "MESSAGE", required = true },
  }
  local o, err = args.parse(SPEC, argv)     -- o.thread, o.json, o.prev_intent, o.message
  if not o then return args.usage_error(SPEC, err) end   -- prints, returns 2
  if o.help then return args.help(SPEC) end              -- prints, returns 0

Options are `--name value` or `--name=value`; "flag" options take no value,
"list" options may repeat (values in order); "integer" and "number" values
are checked. `--` ends the options. -h and --help set o.help. Option names
become keys with - turned into _.

positional: nil (none allowed), { name, label, required } (exactly one
argument: a second is "one LABEL only (quote it)"), or { name, label,
required, join = true } (every argument, joined with spaces). A required one
that is missing or blank is "missing LABEL".
]]

local type, tonumber, ipairs, error, tostring = type, tonumber, ipairs, error, tostring
local math_tointeger, table_concat = math.tointeger, table.concat
local string_find, string_gsub, string_sub, string_match =
  string.find, string.gsub, string.sub, string.match

local _M = {}

local KINDS = { string = true, flag = true, integer = true, number = true, list = true }

local function convert(kind, flag, v)
  if kind == "integer" then
    local n = math_tointeger(tonumber(v))
    if not n then return nil, flag .. ": whole number expected, got '" .. v .. "'" end
    return n
  elseif kind == "number" then
    local n = tonumber(v)
    if not n or n ~= n then return nil, flag .. ": number expected, got '" .. v .. "'" end
    return n
  end
  if v == "" then return nil, flag .. " needs a value" end
  return v
end

-- parse(spec, argv) -> options table | nil, message
function _M.parse(spec, argv)
  if type(spec) ~= "table" or type(spec.options or {}) ~= "table" then
    error("bad argument #1 to 'parse': command spec table expected", 2)
  end
  local options = spec.options or {}
  local pos = spec.positional
  local o, words = {}, {}
  local i, only_words = 1, false
  while i <= #argv do
    local a = argv[i]
    if only_words or string_sub(a, 1, 1) ~= "-" or a == "-" then
      words[#words + 1] = a
    elseif a == "--" then
      only_words = true
    elseif a == "-h" or a == "--help" then
      o.help = true
    else
      local name, inline = string_match(a, "^%-%-([%w][%w%-_]*)=(.*)$")
      name = name or string_match(a, "^%-%-([%w][%w%-_]*)$")
      local kind = name and options[name]
      if not kind then return nil, "unknown option " .. a end
      if not KINDS[kind] then error("moongraph.args: option --" .. name .. " has unknown kind " .. tostring(kind), 2) end
      local key = string_gsub(name, "%-", "_")
      if kind == "flag" then
        if inline then return nil, "--" .. name .. " takes no value" end
        o[key] = true
      else
        local v = inline
        if v == nil then
          i = i + 1
          v = argv[i]
          if v == nil then return nil, "--" .. name .. " needs a value" end
        end
        local cv, err = convert(kind, "--" .. name, v)
        if cv == nil then return nil, err end
        if kind == "list" then
          local l = o[key] or {}
          l[#l + 1] = cv
          o[key] = l
        else
          o[key] = cv
        end
      end
    end
    i = i + 1
  end
  if o.help then return o end
  if not pos then
    if words[1] then return nil, "unexpected argument '" .. words[1] .. "'" end
    return o
  end
  local label = pos.label or string.upper(pos.name)
  local v
  if pos.join then
    v = words[1] and table_concat(words, " ") or nil
  else
    if words[2] then return nil, "one " .. label .. " only (quote it)" end
    v = words[1]
  end
  if pos.required and (v == nil or not string_find(v, "%S")) then
    return nil, "missing " .. label
  end
  o[pos.name] = v
  return o
end

-- usage_error(spec, message [, stderr]) -> 2: prints "name: message" and the usage.
function _M.usage_error(spec, message, out)
  out = out or io.stderr
  out:write(spec.name, ": ", message, "\n", spec.usage, "\n")
  return 2
end

-- help(spec [, stdout]) -> 0: prints the usage (and spec.help when given).
function _M.help(spec, out)
  out = out or io.stdout
  out:write(spec.usage, "\n")
  if spec.help then out:write("\n", spec.help, "\n") end
  return 0
end

return _M
