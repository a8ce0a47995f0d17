--[[
moongraph.jsonschema — validate decoded JSON values against a JSON Schema.

  local jsonschema = require "moongraph.jsonschema"
  local err = jsonschema.validate(schema, value)   -- nil when it matches,
                                                   -- else "$.path: what is wrong"

Covers what tool and response schemas use: type (a name or a list of
names: null, boolean, string, number, integer, array, object), enum, const,
properties, required, additionalProperties (false or a schema),
minProperties/maxProperties, items (a schema), minItems/maxItems,
uniqueItems, minLength/maxLength (in characters), minimum/maximum,
exclusiveMinimum/exclusiveMaximum (numbers), multipleOf, anyOf, oneOf,
allOf, not, and local $ref ("#/$defs/x", "#/definitions/x"). Keywords it
does not know (format, pattern, title, description, default, ...) are
ignored, as a validator that does not check a keyword must.

Values are as lua-cjson decodes them: objects and arrays are tables (an
empty table is both), JSON null is cjson.null, a float with an integral
value counts as an integer. The first problem found is reported, with the
path to it ($ is the value itself, $.a.b[0] a nested one; indices are
0-based as in JSON).
]]

local type, pairs, ipairs, next, tostring, math_type, math_floor, math_huge =
      type, pairs, ipairs, next, tostring, math.type, math.floor, math.huge
local string_format, table_concat, utf8_len = string.format, table.concat, utf8.len

local ok_cjson, cjson = pcall(require, "cjson.safe")
local null = ok_cjson and cjson.null or nil

local _M = {}

local function is_array(v)
  if type(v) ~= "table" then return false end
  local n = #v
  for k in pairs(v) do
    if math_type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end
_M.is_array = is_array

local function is_object(v)
  if type(v) ~= "table" then return false end
  if next(v) == nil then return true end   -- {} decodes the same as []
  for k in pairs(v) do
    if type(k) ~= "string" then return false end
  end
  return true
end
_M.is_object = is_object

local function is_integer(v)
  return type(v) == "number" and v == math_floor(v) and v > -math_huge and v < math_huge
end

local function type_name(v)
  if v == null or v == nil then return "null" end
  local t = type(v)
  if t == "table" then return is_array(v) and next(v) ~= nil and "array" or "object" end
  if t == "number" then return math_type(v) == "integer" and "integer" or "number" end
  return t
end
_M.type_name = type_name

local function matches_type(v, t)
  if t == "null" then return v == null or v == nil end
  if t == "boolean" then return type(v) == "boolean" end
  if t == "string" then return type(v) == "string" end
  if t == "number" then return type(v) == "number" and v == v end
  if t == "integer" then return is_integer(v) end
  if t == "array" then return is_array(v) end
  if t == "object" then return is_object(v) end
  return false
end

local function show(v)
  if type(v) == "string" then return string_format("%q", v) end
  local s = ok_cjson and cjson.encode(v)
  return s or tostring(v)
end

local function equal(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do if not equal(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
_M.equal = equal

local validate

local function resolve(root, ref)
  if ref == "#" then return root end
  if type(ref) ~= "string" or ref:sub(1, 2) ~= "#/" then return nil end
  local node = root
  for part in ref:sub(3):gmatch("[^/]+") do
    part = part:gsub("~1", "/"):gsub("~0", "~")
    if type(node) ~= "table" then return nil end
    node = node[part]
  end
  return node
end

local function check_number(schema, v, path)
  local min, max = schema.minimum, schema.maximum
  if type(min) == "number" and v < min then
    return string_format("%s: %s is below the minimum %s", path, show(v), show(min))
  end
  if type(max) == "number" and v > max then
    return string_format("%s: %s is above the maximum %s", path, show(v), show(max))
  end
  local emin, emax = schema.exclusiveMinimum, schema.exclusiveMaximum
  if type(emin) == "number" and v <= emin then
    return string_format("%s: %s must be greater than %s", path, show(v), show(emin))
  end
  if type(emax) == "number" and v >= emax then
    return string_format("%s: %s must be less than %s", path, show(v), show(emax))
  end
  local m = schema.multipleOf
  if type(m) == "number" and m > 0 then
    local q = v / m
    if q ~= math_floor(q) then
      return string_format("%s: %s is not a multiple of %s", path, show(v), show(m))
    end
  end
end

local function check_array(schema, v, path, root, depth)
  local n = #v
  if type(schema.minItems) == "number" and n < schema.minItems then
    return string_format("%s: fewer than %d items", path, schema.minItems)
  end
  if type(schema.maxItems) == "number" and n > schema.maxItems then
    return string_format("%s: more than %d items", path, schema.maxItems)
  end
  if type(schema.items) == "table" and not is_array(schema.items) then
    for i = 1, n do
      local err = validate(schema.items, v[i], string_format("%s[%d]", path, i - 1), root, depth + 1)
      if err then return err end
    end
  end
  if schema.uniqueItems == true then
    for i = 1, n do
      for j = i + 1, n do
        if equal(v[i], v[j]) then
          return string_format("%s: items %d and %d are equal", path, i - 1, j - 1)
        end
      end
    end
  end
end

local function check_object(schema, v, path, root, depth)
  if type(schema.required) == "table" then
    for _, name in ipairs(schema.required) do
      if v[name] == nil then
        return string_format("%s: missing required property %q", path, tostring(name))
      end
    end
  end
  local props = type(schema.properties) == "table" and schema.properties or {}
  for name, sub in pairs(props) do
    if v[name] ~= nil then
      local err = validate(sub, v[name], path .. "." .. name, root, depth + 1)
      if err then return err end
    end
  end
  local ap = schema.additionalProperties
  if ap == false or type(ap) == "table" then
    for name, x in pairs(v) do
      if props[name] == nil then
        if ap == false then
          return string_format("%s: unexpected property %q", path, tostring(name))
        end
        local err = validate(ap, x, path .. "." .. tostring(name), root, depth + 1)
        if err then return err end
      end
    end
  end
  local count
  if schema.minProperties or schema.maxProperties then
    count = 0
    for _ in pairs(v) do count = count + 1 end
  end
  if type(schema.minProperties) == "number" and count < schema.minProperties then
    return string_format("%s: fewer than %d properties", path, schema.minProperties)
  end
  if type(schema.maxProperties) == "number" and count > schema.maxProperties then
    return string_format("%s: more than %d properties", path, schema.maxProperties)
  end
end

function validate(schema, v, path, root, depth)
  path = path or "$"
  root = root or schema
  depth = depth or 0
  if type(schema) ~= "table" then
    if schema == false then return path .. ": no value is allowed here" end
    return nil
  end
  if depth > 100 then return path .. ": the schema nests too deep (a $ref loop?)" end
  if schema["$ref"] ~= nil then
    local target = resolve(root, schema["$ref"])
    if target == nil then return path .. ": cannot resolve $ref " .. show(schema["$ref"]) end
    local err = validate(target, v, path, root, depth + 1)
    if err then return err end
  end
  local t = schema.type
  if t ~= nil then
    local types = type(t) == "table" and t or { t }
    local ok = false
    for _, name in ipairs(types) do
      if matches_type(v, name) then ok = true break end
    end
    if not ok then
      return string_format("%s: expected %s, got %s", path, table_concat(types, " or "), type_name(v))
    end
  end
  if schema.enum ~= nil and type(schema.enum) == "table" then
    local found = false
    for _, e in ipairs(schema.enum) do
      if equal(e, v) then found = true break end
    end
    if not found then
      local opts = {}
      for i, e in ipairs(schema.enum) do opts[i] = show(e) end
      return string_format("%s: %s is not one of %s", path, show(v), table_concat(opts, ", "))
    end
  end
  if schema.const ~= nil and not equal(schema.const, v) then
    return string_format("%s: must be %s", path, show(schema.const))
  end
  local tv = type(v)
  if tv == "string" then
    local len = utf8_len(v) or #v
    if type(schema.minLength) == "number" and len < schema.minLength then
      return string_format("%s: shorter than %d characters", path, schema.minLength)
    end
    if type(schema.maxLength) == "number" and len > schema.maxLength then
      return string_format("%s: longer than %d characters", path, schema.maxLength)
    end
  elseif tv == "number" then
    local err = check_number(schema, v, path)
    if err then return err end
  elseif tv == "table" then
    if is_array(v) and next(v) ~= nil then
      local err = check_array(schema, v, path, root, depth)
      if err then return err end
    elseif next(v) == nil then
      -- {} is an empty array or an empty object: check what applies to either
      if type(schema.minItems) == "number" and schema.minItems > 0 and t ~= "object" then
        return string_format("%s: fewer than %d items", path, schema.minItems)
      end
    end
    if is_object(v) then
      local err = check_object(schema, v, path, root, depth)
      if err then return err end
    end
  end
  if type(schema.allOf) == "table" then
    for _, sub in ipairs(schema.allOf) do
      local err = validate(sub, v, path, root, depth + 1)
      if err then return err end
    end
  end
  if type(schema.anyOf) == "table" then
    local errs = {}
    for i, sub in ipairs(schema.anyOf) do
      local err = validate(sub, v, path, root, depth + 1)
      if not err then errs = nil break end
      errs[i] = err
    end
    if errs then
      return string_format("%s: matches none of anyOf (%s)", path, table_concat(errs, "; "))
    end
  end
  if type(schema.oneOf) == "table" then
    local matched, errs = 0, {}
    for i, sub in ipairs(schema.oneOf) do
      local err = validate(sub, v, path, root, depth + 1)
      if err then errs[#errs + 1] = err else matched = matched + 1 end
      if matched > 1 then
        return string_format("%s: matches more than one of oneOf (%d and another)", path, i)
      end
    end
    if matched == 0 then
      return string_format("%s: matches none of oneOf (%s)", path, table_concat(errs, "; "))
    end
  end
  if type(schema["not"]) == "table" and not validate(schema["not"], v, path, root, depth + 1) then
    return path .. ": must not match the schema in \"not\""
  end
  return nil
end

--[[ validate(schema, value) -> nil | "path: problem" ]]
function _M.validate(schema, value)
  return validate(schema, value, "$", schema, 0)
end

--[[ check_schema(schema) -> true | nil, err
A light check that a schema is usable: a table whose type names, when
given, are known. ]]
local TYPES = { null = true, boolean = true, string = true, number = true, integer = true,
  array = true, object = true }
function _M.check_schema(schema)
  if type(schema) ~= "table" then return nil, "a schema must be a table" end
  local t = schema.type
  local list = type(t) == "table" and t or (t ~= nil and { t } or {})
  for _, name in ipairs(list) do
    if not TYPES[name] then return nil, "unknown type " .. show(name) end
  end
  return true
end

return _M
