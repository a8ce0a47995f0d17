--[[
moongraph.api.auth — API keys for the HTTP APIs of `moongraph serve`.

Keys map to users: MOONGRAPH_API_KEYS="key1=user1,key2=user2", or a file
named by MOONGRAPH_API_KEYS_FILE with one `key=user` a line (blank lines and
lines starting with # are skipped). A request names its key as
`Authorization: Bearer KEY` or `x-api-key: KEY` (what the LangGraph SDK
sends). Without keys every request is anonymous (user nil) and the server
must listen on loopback only (the serve command refuses anything else).

  local auth = require "moongraph.api.auth"
  local keys, err = auth.from_env()           -- nil when none are configured
  local keys, err = auth.parse("k1=alice,k2=bob")
  local user, status, msg = auth.user(keys, req.headers)   -- keys nil: user nil
]]

local type, pairs, tostring = type, pairs, tostring

local _M = {}

-- parse(text [, sep]) -> {key = user} | nil, err
function _M.parse(text, sep)
  if type(text) ~= "string" then
    error("bad argument #1 to 'parse': string expected, got " .. type(text), 2)
  end
  local keys, n = {}, 0
  local pattern = sep == "\n" and "[^\n]+" or "[^,]+"
  for item in text:gmatch(pattern) do
    item = item:match("^%s*(.-)%s*$")
    if item ~= "" and not item:find("^#") then
      local key, user = item:match("^([^=]+)=(.+)$")
      if not key then
        return nil, "an API key entry must look like key=user, got '" .. item .. "'"
      end
      key, user = key:match("^%s*(.-)%s*$"), user:match("^%s*(.-)%s*$")
      if #key < 8 then return nil, "API key for user '" .. user .. "' is shorter than 8 characters" end
      if keys[key] and keys[key] ~= user then
        return nil, "one API key is given to two users ('" .. keys[key] .. "' and '" .. user .. "')"
      end
      keys[key] = user
      n = n + 1
    end
  end
  if n == 0 then return nil, "no API keys in the list" end
  return keys
end

-- from_env([getenv]) -> keys | nil (none configured) | nil, err
function _M.from_env(getenv)
  getenv = getenv or os.getenv
  local text = getenv("MOONGRAPH_API_KEYS")
  if text and text ~= "" then return _M.parse(text, ",") end
  local path = getenv("MOONGRAPH_API_KEYS_FILE")
  if path and path ~= "" then
    local f, ferr = io.open(path, "r")
    if not f then return nil, "MOONGRAPH_API_KEYS_FILE: " .. tostring(ferr) end
    local body = f:read("a")
    f:close()
    local keys, err = _M.parse(body, "\n")
    if not keys then return nil, path .. ": " .. err end
    return keys
  end
  return nil
end

-- Constant-time comparison, so a wrong key's answer time says nothing of
-- how much of it matched.
local function same(a, b)
  if #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = diff | (a:byte(i) ~ b:byte(i)) end
  return diff == 0
end

-- user(keys, headers) -> user | nil, 401, message. keys nil: no auth (nil).
function _M.user(keys, headers)
  if keys == nil then return nil end
  local given = headers["x-api-key"]
  if not given or given == "" then
    local a = headers["authorization"]
    if a then given = a:match("^[Bb]earer%s+(%S+)%s*$") end
  end
  if not given or given == "" then
    return nil, 401, "missing API key: send Authorization: Bearer KEY or x-api-key: KEY"
  end
  for key, user in pairs(keys) do
    if same(key, given) then return user end
  end
  return nil, 401, "invalid API key"
end

return _M
