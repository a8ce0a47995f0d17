--[[
moongraph.api.guard — what every route of the HTTP APIs (the Chat API,
the LangGraph Agent API) does around its own work, written once:

  1. who calls: the API key (moongraph.api.auth) gives the user. A request
     without a good key is answered 401 and counts against its client's
     address (moongraph.api.client_addr); past the `auth_limiter` budget
     that address is answered 429 for every request, whatever key it
     sends, until the budget refills: keys cannot be guessed at speed.
  2. the rate limit (`limiter`): per user, or per client address when the
     server has no keys.
  3. the body, for routes that take one: JSON as RFC 8259 has it, with
     text every store takes (moongraph.api.fields.body); an object.
  4. the answer: an error a route returns as problem(status, message) is
     written {"<field>": message, "request_id": id}. An error of status
     500 or more, and any error the route raises, reaches the client only
     as a generic message and the request id; the detail (paths, SQL,
     upstream addresses) goes to stderr under that id.

  local guard = require "moongraph.api.guard"
  local wrap = guard.wrapper(opts, { field = "detail", body_status = 422 })
  --   opts: keys (moongraph.api.auth), limiter, auth_limiter
  --   (moongraph.api.ratelimit), trusted_proxies (client_addr.parse_list)
  --   api: field (the error message's key), body_status (a body that is
  --   not an object), anonymous (the user without keys; default nil)
  routes["POST /x"] = wrap(function(req, res, user, body)
    return guard.problem(404, "thread 't' not found")
  end, true)     -- true: the route takes a JSON object body (empty: {})
  guard.problem(status, message [, headers]) -> a response the wrapper writes
  guard.report(req, what)  -- a line on stderr under the request's id
]]

local json = require "moongraph.json"
local auth = require "moongraph.api.auth"
local fields = require "moongraph.api.fields"
local client_addr = require "moongraph.api.client_addr"

local type, tostring, pairs, xpcall = type, tostring, pairs, xpcall
local traceback = debug.traceback
local io_stderr = io.stderr

local _M = {}

_M.AUTH_FAILURES = 10          -- failed authentications an address may make at once
_M.AUTH_FAILURES_PER_MINUTE = 10

local GENERIC = { [503] = "the service is unavailable: retry later" }
local INTERNAL = "internal error"

-- problem(status, message [, headers]) -> response (written by the wrapper)
function _M.problem(status, message, headers)
  return { status = status, headers = headers, problem = tostring(message) }
end
local problem = _M.problem

function _M.report(req, what)
  io_stderr:write("moongraph serve: [", req.id or "-", "] ", req.method or "?", " ", req.path or "?", ": ",
    tostring(what), "\n")
  io_stderr:flush()
end
local report = _M.report

-- the response a problem becomes, for this request
local function render(req, out, field)
  local status, msg = out.status, out.problem
  if status >= 500 then
    if not out.reported then report(req, status .. ": " .. msg) end
    msg = GENERIC[status] or INTERNAL
  end
  local h = { ["Content-Type"] = "application/json" }
  for k, v in pairs(out.headers or {}) do h[k] = v end
  return { status = status, headers = h,
           body = json.encode({ [field] = msg, request_id = req.id }, { valid_utf8 = true }) }
end

-- wrapper(opts, api) -> wrap(fn, with_body) -> route handler
function _M.wrapper(opts, api)
  opts = opts or {}
  local keys, limiter, auth_limiter = opts.keys, opts.limiter, opts.auth_limiter
  local trusted = opts.trusted_proxies
  local field = api.field or "error"
  local body_status = api.body_status or 400
  local anonymous = api.anonymous

  local function who(req)
    if keys == nil then return anonymous end
    local addr = client_addr.of(req, trusted)
    if auth_limiter then
      local wait = auth_limiter:empty(addr)
      if wait then
        return nil, problem(429, "too many failed authentications from this address: retry in " .. wait .. " s",
          { ["Retry-After"] = tostring(wait) })
      end
    end
    local user, st, msg = auth.user(keys, req.headers)
    if user then return user end
    if auth_limiter then auth_limiter:take(addr) end
    return nil, problem(st, msg, { ["WWW-Authenticate"] = "Bearer" })
  end

  -- the answer to give before the route runs, or nil, and the body
  local function admit(req, with_body)
    local user, refused = who(req)
    if refused then return refused end
    if limiter then
      local ok, retry = limiter:take(keys and user or client_addr.of(req, trusted))
      if not ok then
        return problem(429, "rate limit exceeded: retry in " .. retry .. " s", { ["Retry-After"] = tostring(retry) })
      end
    end
    if not with_body then return nil, user end
    local raw = req.body
    if not (raw and raw:find("%S")) then return nil, user, {} end
    local v, err, malformed = fields.body(raw)
    if v == nil then return problem(malformed and 400 or body_status, err) end
    if type(v) ~= "table" or json.is_array(v) or v[1] ~= nil then
      return problem(body_status, "the request body must be a JSON object")
    end
    return nil, user, v
  end

  return function(fn, with_body)
    return function(req, res)
      local out, user, body = admit(req, with_body)
      if not out then
        local ok, r = xpcall(fn, traceback, req, res, user, body)
        if ok then
          out = r
        else
          report(req, r)
          if res:started() then return nil end
          out = { status = 500, problem = INTERNAL, reported = true }
        end
      end
      if type(out) == "table" and out.problem ~= nil then return render(req, out, field) end
      return out
    end
  end
end

return _M
