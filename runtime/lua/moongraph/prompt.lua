--[[
moongraph.prompt — prompt templates: text files under prompts/ (found
beside the modules, see moongraph.paths) with {{name}} placeholders.

  local prompt = require "moongraph.prompt"
  local text, err = prompt.file("answer.txt", { question = q })
  local tpl = assert(prompt.load("gcri/hypothesis.txt"))
  local text, err = prompt.render(tpl, vars, "gcri/hypothesis.txt")

Every placeholder must have a value: a template that names a variable the
code does not give is an error naming it, never a silent empty string (pass
"" for an empty value). Values are strings, numbers or booleans. Templates
are read once and kept; prompt.forget() drops them (the worker's reload does).
]]

local type, tostring, pairs, error = type, tostring, pairs, error
local string_gsub, table_concat, table_sort = string.gsub, table.concat, table.sort

local paths = require "moongraph.paths"

local _M = {}

local cache = {}

-- load(name) -> template | nil, err (name relative to prompts/)
function _M.load(name)
  if type(name) ~= "string" or name == "" then
    error("bad argument #1 to 'load': prompt file name expected, got " .. type(name), 2)
  end
  local t = cache[name]
  if t then return t end
  local text, err = paths.read("prompts/" .. name)
  if not text then return nil, "prompt " .. name .. ": " .. err end
  cache[name] = text
  return text
end

function _M.forget()
  cache = {}
end

local PLACEHOLDER = "{{%s*([%w_]+)%s*}}"

-- render(template, vars [, name]) -> text | nil, err
function _M.render(template, vars, name)
  if type(template) ~= "string" then
    error("bad argument #1 to 'render': template string expected, got " .. type(template), 2)
  end
  if type(vars) ~= "table" then
    error("bad argument #2 to 'render': table of values expected, got " .. type(vars), 2)
  end
  local missing, bad = nil, nil
  local text = string_gsub(template, PLACEHOLDER, function(k)
    local v = vars[k]
    local tv = type(v)
    if tv == "string" then return v end
    if tv == "number" or tv == "boolean" then return tostring(v) end
    if v == nil then missing = missing or k else bad = bad or k end
    return ""
  end)
  local where = "prompt" .. (name and (" " .. name) or "")
  if missing then
    local known = {}
    for k in pairs(vars) do known[#known + 1] = k end
    table_sort(known)
    return nil, where .. ": no value for {{" .. missing .. "}} (given: " ..
      (known[1] and table_concat(known, ", ") or "nothing") .. ")"
  end
  if bad then
    return nil, where .. ": {{" .. bad .. "}} has a " .. type(vars[bad]) ..
      " value; strings, numbers or booleans expected"
  end
  return text
end

-- file(name, vars) -> text | nil, err: load and render.
function _M.file(name, vars)
  local template, err = _M.load(name)
  if not template then return nil, err end
  return _M.render(template, vars, name)
end

return _M
