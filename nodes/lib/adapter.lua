-- Shared plumbing of the node adapters: configuration from the environment
-- (MOONGRAPH_<SERVICE>_BASE_URL / _API_KEY, overridable per run through
-- ctx.config[service]), issuing a request through moongraph.http and turning
-- the response into a decoded JSON table or a clear error.
local cjson = require "cjson.safe"
local os = os

local _M = {}

-- service: lower-case name ("kakao", "bulk_waste"); default_base: public
-- endpoint or nil when the service has none. The adapter is online when a
-- base URL or an API key is configured (a key alone uses default_base);
-- otherwise the node falls back to its offline default.
function _M.config(service, ctx, default_base)
  if type(service) ~= "string" then
    error("bad argument #1 to 'config': string expected, got " .. type(service), 2)
  end
  local prefix = "MOONGRAPH_" .. service:upper() .. "_"
  local over = ctx and ctx.config and ctx.config[service] or {}
  -- an override of "" means "unset" (it does not fall back to the environment)
  local function pick(key, env)
    local v = over[key]
    if v == nil then v = os.getenv(prefix .. env) end
    if v == "" then v = nil end
    return v
  end
  local base, key = pick("base_url", "BASE_URL"), pick("api_key", "API_KEY")
  local cfg = {
    service = service,
    api_key = key,
    base_url = base or default_base,
    online = (base ~= nil or key ~= nil),
    timeout = tonumber(pick("timeout", "TIMEOUT")),
    model = pick("model", "MODEL"),
    env_prefix = prefix,
  }
  if cfg.online and not cfg.base_url then
    error(("%s: %sAPI_KEY is set but %sBASE_URL is not (this service has no public default)")
      :format(service, prefix, prefix), 0)
  end
  if cfg.base_url then cfg.base_url = cfg.base_url:gsub("/+$", "") end
  return cfg
end

local function snippet(body)
  if type(body) ~= "string" then return "" end
  body = body:gsub("%s+", " ")
  if #body > 200 then body = body:sub(1, 200) .. "..." end
  return body
end

-- Turns an HTTP response into a decoded JSON table; raises a message that
-- names the service and the problem (status, transport error, bad body).
function _M.decode(service, res, err)
  if not res then
    error(("%s: request failed: %s"):format(service, tostring(err)), 0)
  end
  local status = tonumber(res.status)
  if not status or status < 200 or status > 299 then
    error(("%s: HTTP %s: %s"):format(service, tostring(res.status), snippet(res.body)), 0)
  end
  local value, derr = cjson.decode(res.body or "")
  if type(value) ~= "table" then
    error(("%s: malformed response body (%s): %s"):format(service,
      derr or "not a JSON object", snippet(res.body)), 0)
  end
  return value
end

-- Issues req (the table http.request takes) and returns the decoded body.
function _M.fetch(service, req)
  local http = require "moongraph.http"
  local res, err = http.request(req)
  return _M.decode(service, res, err)
end

-- JSON null (cjson.null) and non-strings become nil; numbers become strings.
-- The GET request of the JSON contracts defined in docs/adapters.md
-- (character, bulk_waste, recyclable_price, collection_point): bearer key
-- when configured, the node's timeout unless the service sets one.
function _M.json_get(cfg, path, query, timeout)
  local headers = { Accept = "application/json" }
  if cfg.api_key then headers.Authorization = "Bearer " .. cfg.api_key end
  return {
    method = "GET",
    url = cfg.base_url .. path,
    headers = headers,
    query = query,
    timeout = cfg.timeout or timeout,
  }
end

function _M.str(v)
  if type(v) == "string" then return v end
  if type(v) == "number" then return tostring(v) end
  return nil
end

function _M.num(v)
  if type(v) == "number" then return v end
  if type(v) == "string" then return tonumber(v) end
  return nil
end

_M.null = cjson.null
return _M
