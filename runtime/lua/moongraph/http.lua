-- moongraph.http: HTTP client for tasks.
--
--   local http = require "moongraph.http"
--   local res, err = http.request{ method = "POST", url = "https://api.example/x",
--     headers = { Authorization = "Bearer ..." }, query = { q = "seoul" },
--     json = { a = 1 }, timeout = 10 }
--   res.status, res.headers["content-type"] (any case), res.body, res:json()
--
-- Every call yields the calling task until the response is in; many tasks
-- issuing requests run concurrently on the one loop, over reused keep-alive
-- connections. Failures return nil, err with err naming what happened
-- ("timeout ...", "connection refused to host:port", "body exceeds max_body
-- ...", TLS errors); errors never contain the URL, so keys in query strings
-- stay out of logs. TLS peers are always verified; `ca_file` adds trust in a
-- private CA.
--
-- on_data = function(chunk, res) streams the body: it is called for each
-- piece as it arrives (res.status and res.headers are already set) and may
-- yield; returning false stops the transfer early. The returned res then has
-- body = "".

local core = require "moongraph.core"
local json = require "moongraph.json"
local cjson = json.wire()

local chttp = core.http
local type, pairs, ipairs, error, tostring, setmetatable, rawget =
      type, pairs, ipairs, error, tostring, setmetatable, rawget
local string_format, string_upper = string.format, string.upper
local table_concat, table_sort = table.concat, table.sort
local math_type = math.type

local _M = { _VERSION = core.version }

local OPTIONS = {
  method = "string", url = "string", headers = "table", query = "table",
  body = "string", json = "any", timeout = "number",
  connect_timeout = "number", max_body = "number",
  follow_redirects = "any", on_data = "function", ca_file = "string",
}

-- Header tables read case-insensitively: res.headers["Content-Type"] works.
local headers_mt = {
  __index = function(t, k)
    if type(k) == "string" then return rawget(t, k:lower()) end
  end,
}

local Response = {}
Response.__index = Response

-- res:json() -> value | nil, err
function Response:json()
  local v, err = cjson.decode(self.body)
  if v == nil and err then
    return nil, "response body is not JSON: " .. err
  end
  return v
end

local function new_response(status, headers, body)
  return setmetatable({
    status = status,
    headers = setmetatable(headers or {}, headers_mt),
    body = body,
  }, Response)
end

-- Percent-encoding of every byte outside the unreserved set (in C: a
-- query's few values cost more to escape with gsub than the rest of it).
local percent_encode = core.bytes.percent_encode

local function escape(s)
  if type(s) ~= "string" then s = tostring(s) end
  return percent_encode(s)
end

-- "a=1&b=x%20y", keys sorted; list values repeat the key.
local function encode_query(q)
  local keys = {}
  for k in pairs(q) do
    if type(k) ~= "string" then
      error("bad argument #1 to 'request': query keys must be strings", 4)
    end
    keys[#keys + 1] = k
  end
  table_sort(keys)
  local parts = {}
  for i = 1, #keys do
    local k = keys[i]
    local v, ek = q[k], percent_encode(k)
    local tv = type(v)
    if tv == "string" then
      parts[#parts + 1] = ek .. "=" .. percent_encode(v)
    elseif tv == "table" then
      for _, item in ipairs(v) do parts[#parts + 1] = ek .. "=" .. escape(item) end
    elseif tv == "boolean" then
      parts[#parts + 1] = ek .. "=" .. (v and "true" or "false")
    else
      parts[#parts + 1] = ek .. "=" .. escape(v)
    end
  end
  return table_concat(parts, "&")
end
_M.encode_query = encode_query
_M.escape = escape

local function has_header(headers, name)
  if not headers then return false end
  name = name:lower()
  for k, v in pairs(headers) do
    if type(k) == "string" and k:lower() == name then return true end
    if type(k) == "number" and type(v) == "string" and
       v:lower():sub(1, #name + 1) == name .. ":" then
      return true
    end
  end
  return false
end

-- Check the options and turn them into what core.http takes.
local function prepare(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'request': table expected, got " .. type(opts), 3)
  end
  for k, v in pairs(opts) do
    local want = OPTIONS[k]
    if not want then
      error("bad argument #1 to 'request': unknown option '" .. tostring(k) .. "'", 3)
    end
    if want ~= "any" and type(v) ~= want then
      error(string_format("bad argument #1 to 'request': %s must be a %s, got %s",
        k, want, type(v)), 3)
    end
  end
  if type(opts.url) ~= "string" then
    error("bad argument #1 to 'request': url is required", 3)
  end
  if opts.body ~= nil and opts.json ~= nil then
    error("bad argument #1 to 'request': give body or json, not both", 3)
  end
  if opts.max_body ~= nil and (math_type(opts.max_body) ~= "integer" or opts.max_body < 0) then
    error("bad argument #1 to 'request': max_body must be an integer >= 0", 3)
  end
  local fr = opts.follow_redirects
  if fr ~= nil and type(fr) ~= "boolean" and math_type(fr) ~= "integer" then
    error("bad argument #1 to 'request': follow_redirects must be a boolean or a count", 3)
  end

  local method = opts.method
  if opts.query == nil and opts.json == nil and (method == nil or method == string_upper(method)) then
    return opts   -- nothing to rewrite: core.http reads the same fields
  end
  local url = opts.url
  if opts.query then
    local qs = encode_query(opts.query)
    if qs ~= "" then
      url = url .. (url:find("?", 1, true) and "&" or "?") .. qs
    end
  end
  local headers, body = opts.headers, opts.body
  if opts.json ~= nil then
    local encoded, err = cjson.encode(opts.json)
    if not encoded then
      error("bad argument #1 to 'request': json cannot be encoded: " .. tostring(err), 3)
    end
    body = encoded
    if not has_header(headers, "content-type") then
      local h = {}
      if headers then for k, v in pairs(headers) do h[k] = v end end
      h["Content-Type"] = "application/json"
      headers = h
    end
  end
  return {
    url = url,
    method = opts.method and string_upper(opts.method) or nil,
    headers = headers,
    body = body,
    timeout = opts.timeout,
    connect_timeout = opts.connect_timeout,
    max_body = opts.max_body,
    follow_redirects = fr,
    ca_file = opts.ca_file,
  }
end

local function stream(copts, on_data)
  local t <close> = chttp.open(copts)
  local res = new_response(nil, nil, "")
  local first = true
  while true do
    local chunk, err = t:next()
    if not chunk then
      if err then return nil, err end
      break
    end
    if first then
      first = false
      res.status = t:status()
      res.headers = setmetatable(t:headers() or {}, headers_mt)
    end
    if on_data(chunk, res) == false then
      res.stopped = true
      break
    end
  end
  if first then
    res.status = t:status()
    res.headers = setmetatable(t:headers() or {}, headers_mt)
  end
  return res
end

-- http.request(opts) -> res | nil, err
function _M.request(opts)
  local copts = prepare(opts)
  if opts.on_data then return stream(copts, opts.on_data) end
  local status, headers, body = chttp.request(copts)
  if not status then return nil, headers end
  return new_response(status, headers, body)
end

local function with(opts, fields)
  if opts == nil then return fields end
  local o = {}
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("bad argument: options must be a table, got " .. type(opts), 3)
    end
    for k, v in pairs(opts) do o[k] = v end
  end
  for k, v in pairs(fields) do o[k] = v end
  return o
end

-- http.get(url, [opts]) -> res | nil, err
function _M.get(url, opts)
  if type(url) ~= "string" then
    error("bad argument #1 to 'get': url string expected, got " .. type(url), 2)
  end
  return _M.request(with(opts, { url = url, method = "GET" }))
end

-- http.post(url, body, [opts]) -> res | nil, err. A table body is sent as JSON.
function _M.post(url, body, opts)
  if type(url) ~= "string" then
    error("bad argument #1 to 'post': url string expected, got " .. type(url), 2)
  end
  local fields = { url = url, method = "POST" }
  if type(body) == "table" then fields.json = body
  elseif type(body) == "string" then fields.body = body
  elseif body ~= nil then
    error("bad argument #2 to 'post': string or table expected, got " .. type(body), 2)
  end
  return _M.request(with(opts, fields))
end

-- Transfers in flight and sockets watched (for diagnostics and specs).
function _M.stats()
  return chttp.stats()
end

_M.Response = Response
_M.headers_mt = headers_mt

return _M
