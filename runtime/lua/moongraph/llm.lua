-- moongraph.llm: OpenAI-compatible chat-completions client (OpenAI, vLLM,
-- Ollama, llama.cpp server, LiteLLM, ...).
--
--   local llm = require "moongraph.llm"
--   local client = assert(llm.new{ model = "gpt-4o-mini" })  -- base_url, api_key
--   local r, err = client:chat{                                -- from the environment
--     messages = { { role = "user", content = "hi" } },
--     stream = function(delta) io.write(delta) end,     -- tokens as they arrive
--     -- (without `stream`, a call made in a graph node streamed in `messages`
--     -- mode sends its tokens there; stream = false: never streamed)
--     json_schema = { type = "object", required = { "intent" },
--                     properties = { intent = { type = "string", enum = { "a", "b" } } } },
--   }
--   r.content, r.json, r.tool_calls, r.usage, r.model, r.finish_reason
--
-- Failures return nil, err. 429, 5xx, timeouts and dropped connections are
-- retried (max_retries, exponential backoff with jitter, honouring
-- Retry-After) unless tokens were already streamed; other 4xx never are. A
-- reply that does not match json_schema is sent back once with the
-- validation error, then fails clearly. The API key is sent only in the
-- Authorization header: it never appears in errors or log lines.
--
-- llm.routed{ models = {...}, router = fn } fails over between clients
-- before the first streamed token (see moongraph.failover).

local errors = require "moongraph.errors"
local http = require "moongraph.http"
local failover = require "moongraph.failover"
local json = require "moongraph.json"
local cjson = json.wire()
local core = require "moongraph.core"
local context = require "moongraph.engine.context"
local jsonschema = require "moongraph.jsonschema"

local type, pairs, ipairs, next, error, tostring, tonumber =
      type, pairs, ipairs, next, error, tostring, tonumber
local setmetatable, getmetatable, utf8, pcall = setmetatable, getmetatable, utf8, pcall
local math_type, math_floor, math_min, math_max, math_random, math_huge =
      math.type, math.floor, math.min, math.max, math.random, math.huge
local string_format, table_concat, os_getenv, os_time, os_date =
      string.format, table.concat, os.getenv, os.time, os.date

local null = cjson.null
local sleep = core.loop.sleep

local _M = { _VERSION = core.version }

local Client = {}
Client.__index = Client

local DEFAULTS = {
  timeout = 120,           -- seconds per attempt
  max_retries = 2,         -- retries after the first attempt
  initial_delay = 0.5,     -- first backoff (seconds), doubled each retry
  max_delay = 8,           -- backoff cap
  max_retry_after = 60,    -- a longer Retry-After fails at once
}

local NEW_OPTIONS = {
  base_url = "string", api_key = "string", model = "string", timeout = "number",
  connect_timeout = "number", max_retries = "number", headers = "table",
  initial_delay = "number", max_delay = "number", max_retry_after = "number",
  jitter = "boolean", name = "string", ca_file = "string", sleep = "function",
  max_body = "number",
  log = "function", random = "function",
}

local CHAT_OPTIONS = {
  messages = "table", model = "string", temperature = "number", max_tokens = "number",
  stream = "any", json_schema = "table", schema_name = "string", strict = "boolean",
  tools = "table", tool_choice = "any", extra = "table", timeout = "number",
}

local function check_options(opts, allowed, fname)
  for k, v in pairs(opts) do
    local want = allowed[k]
    if not want then
      error(string_format("bad argument #1 to '%s': unknown option '%s'", fname, tostring(k)), 3)
    end
    if want ~= "any" and type(v) ~= want then
      error(string_format("bad argument #1 to '%s': %s must be a %s, got %s",
        fname, k, want, type(v)), 3)
    end
  end
end

-- Replace every occurrence of the secret in s.
local function redact(s, secret)
  s = tostring(s)
  if not secret or secret == "" then return s end
  local out, i = {}, 1
  while true do
    local a, b = s:find(secret, i, true)
    if not a then break end
    out[#out + 1] = s:sub(i, a - 1)
    out[#out + 1] = "[redacted]"
    i = b + 1
  end
  out[#out + 1] = s:sub(i)
  return table_concat(out)
end
_M.redact = redact

local function host_of(url)
  return url:match("^%a+://([^/?#]+)") or "?"
end

-- llm.available() -> true when an endpoint is configured in the environment.
function _M.available()
  local v = os_getenv("MOONGRAPH_LLM_BASE_URL")
  return v ~= nil and v ~= ""
end

-- llm.new(opts) -> client | nil, err (nothing configured)
function _M.new(opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #1 to 'new': table expected, got " .. type(opts), 2)
  end
  check_options(opts, NEW_OPTIONS, "new")
  local function env(name)
    local v = os_getenv(name)
    if v == "" then return nil end
    return v
  end
  local base_url = opts.base_url or env("MOONGRAPH_LLM_BASE_URL")
  if not base_url then
    return nil, "llm: no endpoint configured (give base_url or set MOONGRAPH_LLM_BASE_URL)"
  end
  if not base_url:match("^https?://") then
    error("bad argument #1 to 'new': base_url must start with http:// or https://", 2)
  end
  local model = opts.model or env("MOONGRAPH_LLM_MODEL")
  if not model then
    return nil, "llm: no model configured (give model or set MOONGRAPH_LLM_MODEL)"
  end
  local max_retries = opts.max_retries or DEFAULTS.max_retries
  if math_type(max_retries) ~= "integer" or max_retries < 0 then
    error("bad argument #1 to 'new': max_retries must be an integer >= 0", 2)
  end
  for _, k in ipairs{ "timeout", "connect_timeout", "initial_delay", "max_delay", "max_retry_after" } do
    if opts[k] ~= nil and not (opts[k] >= 0) then
      error("bad argument #1 to 'new': " .. k .. " must be >= 0", 2)
    end
  end
  local self = setmetatable({
    base_url = base_url:gsub("/+$", ""),
    model = model,
    name = opts.name or model,
    timeout = opts.timeout or DEFAULTS.timeout,
    connect_timeout = opts.connect_timeout,
    max_retries = max_retries,
    initial_delay = opts.initial_delay or DEFAULTS.initial_delay,
    max_delay = opts.max_delay or DEFAULTS.max_delay,
    max_retry_after = opts.max_retry_after or DEFAULTS.max_retry_after,
    jitter = opts.jitter ~= false,
    ca_file = opts.ca_file,
    max_body = opts.max_body,
    extra_headers = opts.headers,
    sleep = opts.sleep or sleep,
    random = opts.random or math_random,
    log = opts.log,
  }, Client)
  -- the key lives in a closure, out of reach of pretty-printers and dumps
  local api_key = opts.api_key or env("MOONGRAPH_LLM_API_KEY")
  self.secret = function() return api_key end
  self.host = host_of(self.base_url)
  return self
end

--[[ from_env() -> client | nil (no LLM configured) | nil, err
The client the environment describes (MOONGRAPH_LLM_BASE_URL, _API_KEY,
_MODEL). Nothing set means no LLM: callers take their offline paths. Set but
unusable (no model, a malformed URL) is nil and the reason, for the caller to
report before going offline. ]]
function _M.from_env()
  local function set(name)
    local v = os_getenv(name)
    return v ~= nil and v ~= ""
  end
  if not (set("MOONGRAPH_LLM_BASE_URL") or set("MOONGRAPH_LLM_API_KEY")) then return nil end
  local ok, client, err = pcall(_M.new, {})
  if not ok then return nil, "llm: " .. (tostring(client):gsub("^bad argument #1 to 'new': ", "")) end
  if not client then return nil, err end
  return client
end

Client.__tostring = function(self)
  return string_format("llm client %s (model %s at %s)", self.name, self.model, self.host)
end

function Client:_log(fmt, ...)
  if self.log then self.log(redact(string_format(fmt, ...), self.secret())) end
end

function Client:_err(fmt, ...)
  return redact("llm: " .. string_format(fmt, ...), self.secret())
end

---------------------------------------------------------------- schemas

-- validate(schema, value) -> nil | "path: problem" (moongraph.jsonschema)
local validate = jsonschema.validate
_M.validate = validate

-- Decode a reply that should be JSON, tolerating a Markdown code fence.
local function decode_reply(content)
  if type(content) ~= "string" then return nil, "the reply has no text content" end
  local s = content:match("^%s*```[%w]*%s*\n(.-)\n?%s*```%s*$") or content
  local v, err = cjson.decode(s)
  if v == nil then return nil, "the reply is not valid JSON (" .. tostring(err) .. ")" end
  return v
end

---------------------------------------------------------------- requests

-- Seconds to wait from a Retry-After value (delta-seconds or an HTTP date).
local MONTHS = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6,
                 Jul = 7, Aug = 8, Sep = 9, Oct = 10, Nov = 11, Dec = 12 }
local function parse_retry_after(v)
  if not v then return nil end
  local n = tonumber(v)
  if n then return math_max(n, 0) end
  local d, mon, y, h, mi, s = v:match("%a+, (%d+) (%a+) (%d+) (%d+):(%d+):(%d+) GMT")
  if not d or not MONTHS[mon] then return nil end
  local t = { year = tonumber(y), month = MONTHS[mon], day = tonumber(d),
              hour = tonumber(h), min = tonumber(mi), sec = tonumber(s) }
  -- os.time reads a local time: shift by this zone's offset from UTC
  local now = os_time()
  local offset = os_time(os_date("*t", now)) - os_time(os_date("!*t", now))
  return math_max(os_time(t) + offset - now, 0)
end
_M.parse_retry_after = parse_retry_after

local net_retryable = errors.retryable

-- The message of an API error body, if it has one.
local function api_message(body)
  local v = cjson.decode(body or "")
  if type(v) == "table" then
    local e = v.error
    if type(e) == "table" and type(e.message) == "string" then return e.message end
    if type(e) == "string" then return e end
    if type(v.message) == "string" then return v.message end
    if type(v.detail) == "string" then return v.detail end
  end
  body = tostring(body or "")
  if #body > 200 then body = body:sub(1, 200) .. "..." end
  return body
end

local function nonnull(v)
  if v == null then return nil end
  return v
end

-- Turn tool calls into plain tables; `args` holds the decoded arguments.
local function finish_tool_calls(calls)
  if type(calls) ~= "table" or next(calls) == nil then return nil end
  local out = {}
  for i, c in ipairs(calls) do
    local fn = type(c["function"]) == "table" and c["function"] or {}
    local args = nonnull(fn.arguments)
    out[i] = {
      id = nonnull(c.id), type = nonnull(c.type) or "function",
      ["function"] = { name = nonnull(fn.name), arguments = args },
      name = nonnull(fn.name),
      args = type(args) == "string" and cjson.decode(args) or nil,
    }
  end
  return out
end

local function result_from_message(body)
  local choice = type(body.choices) == "table" and body.choices[1]
  if type(choice) ~= "table" then return nil, "the reply has no choices" end
  local msg = type(choice.message) == "table" and choice.message or {}
  return {
    content = nonnull(msg.content),
    tool_calls = finish_tool_calls(nonnull(msg.tool_calls)),
    usage = nonnull(body.usage),
    model = nonnull(body.model),
    finish_reason = nonnull(choice.finish_reason),
  }
end

-- One HTTP attempt. Returns result | nil, err, retryable, retry_after, emitted.
function Client:_attempt(body, params, on_token)
  local headers = { ["Content-Type"] = "application/json", Accept = params.stream
    and "text/event-stream" or "application/json" }
  local key = self.secret()
  if key then headers.Authorization = "Bearer " .. key end
  if self.extra_headers then
    for k, v in pairs(self.extra_headers) do headers[k] = v end
  end
  local req = {
    method = "POST", url = self.base_url .. "/chat/completions", headers = headers,
    body = body, timeout = params.timeout or self.timeout,
    connect_timeout = self.connect_timeout, ca_file = self.ca_file,
    max_body = self.max_body,
  }

  if not params.stream then
    local res, err = http.request(req)
    if not res then return nil, self:_err("%s", err), net_retryable(err) end
    return self:_handle_status(res, res.body)
  end

  -- streamed: parse SSE events as the body arrives
  local parser = core.sse.new()
  local acc = { content = {}, tools = {}, emitted = false }
  local raw, failure, done = {}, nil, false
  local status
  req.on_data = function(chunk, res)
    status = res.status
    if status ~= 200 then
      raw[#raw + 1] = chunk
      return
    end
    local events, perr = parser:feed(chunk)
    if not events then failure = perr return false end
    for _, ev in ipairs(events) do
      if ev.data == "[DONE]" then done = true return false end
      local data = cjson.decode(ev.data)
      if type(data) ~= "table" then
        failure = "malformed JSON in the stream: " .. ev.data:sub(1, 100)
        return false
      end
      if data.error ~= nil then
        failure = "the stream reported an error: " .. api_message(ev.data)
        return false
      end
      if nonnull(data.model) then acc.model = data.model end
      if type(data.usage) == "table" then acc.usage = data.usage end
      local choice = type(data.choices) == "table" and data.choices[1]
      if type(choice) == "table" then
        if nonnull(choice.finish_reason) then acc.finish_reason = choice.finish_reason end
        local delta = type(choice.delta) == "table" and choice.delta or {}
        local text = nonnull(delta.content)
        if type(text) == "string" and text ~= "" then
          acc.content[#acc.content + 1] = text
          acc.emitted = true
          on_token(text)
        end
        if type(delta.tool_calls) == "table" then
          for _, tc in ipairs(delta.tool_calls) do
            -- lua-cjson reads every number as a float: index 1 is 1.0
            local i = (type(tc.index) == "number" and math.tointeger(tc.index) or 0) + 1
            local slot = acc.tools[i] or { ["function"] = { arguments = {} } }
            acc.tools[i] = slot
            if nonnull(tc.id) then slot.id = tc.id end
            if nonnull(tc.type) then slot.type = tc.type end
            local fn = type(tc["function"]) == "table" and tc["function"] or {}
            if nonnull(fn.name) then slot["function"].name = fn.name end
            if type(fn.arguments) == "string" then
              local a = slot["function"].arguments
              a[#a + 1] = fn.arguments
            end
          end
        end
      end
    end
  end
  local res, err = http.request(req)
  if not res then
    return nil, self:_err("%s", err), net_retryable(err), nil, acc.emitted
  end
  if status ~= 200 then
    return self:_handle_status(res, table_concat(raw))
  end
  if failure then return nil, self:_err("%s", failure), false, nil, acc.emitted end
  if not done and not acc.finish_reason then
    return nil, self:_err("the stream from %s ended before the reply was complete", self.host),
      not acc.emitted, nil, acc.emitted
  end
  local calls
  if #acc.tools > 0 then
    calls = {}
    for i, slot in ipairs(acc.tools) do
      calls[i] = { id = slot.id, type = slot.type or "function",
                   ["function"] = { name = slot["function"].name,
                                    arguments = table_concat(slot["function"].arguments) } }
    end
  end
  local content = table_concat(acc.content)
  return {
    content = (content ~= "" or not calls) and content or nil,
    tool_calls = finish_tool_calls(calls),
    usage = acc.usage,
    model = acc.model,
    finish_reason = acc.finish_reason,
  }, nil, false, nil, acc.emitted
end

function Client:_handle_status(res, body)
  local s = res.status
  if s >= 200 and s < 300 then
    local v, derr = cjson.decode(body)
    if type(v) ~= "table" then
      return nil, self:_err("malformed JSON in the reply from %s: %s", self.host, tostring(derr))
    end
    local r, rerr = result_from_message(v)
    if not r then return nil, self:_err("%s (from %s)", rerr, self.host) end
    return r
  end
  local msg = api_message(body)
  if s == 429 or s >= 500 then
    return nil, self:_err("HTTP %d from %s: %s", s, self.host, msg), true,
      parse_retry_after(res.headers["retry-after"])
  end
  return nil, self:_err("HTTP %d from %s: %s", s, self.host, msg), false
end

-- Backoff before retry number n (1-based).
function Client:_delay(n, retry_after)
  if retry_after then return retry_after end
  local d = math_min(self.max_delay, self.initial_delay * 2 ^ (n - 1))
  if self.jitter then d = d * (0.5 + 0.5 * self.random()) end
  return d
end

-- Attempts with retries. Returns result | nil, err, emitted.
function Client:_call(body, params, on_token)
  local attempts = self.max_retries + 1
  for n = 1, attempts do
    local r, err, retryable, retry_after, emitted = self:_attempt(body, params, on_token)
    if r then return r end
    if not retryable or emitted or n == attempts then
      if retryable and n == attempts and n > 1 then
        err = err .. string_format(" (after %d attempts)", n)
      end
      return nil, err, emitted
    end
    if retry_after and retry_after > self.max_retry_after then
      return nil, err .. string_format(" (server asks to retry after %g s, more than max_retry_after)",
        retry_after), emitted
    end
    local d = self:_delay(n, retry_after)
    local budget = core.loop.budget()
    if budget and d >= budget then
      -- the caller's deadline comes before the retry could start
      return nil, err .. string_format(" (no time left for a retry before the caller's deadline)"), emitted
    end
    self:_log("llm: %s; retry %d/%d in %.2f s", err, n, self.max_retries, d)
    self.sleep(d)
  end
end

local function normalize_tools(tools)
  local out = {}
  for i, t in ipairs(tools) do
    if type(t) ~= "table" then
      error("bad argument #1 to 'chat': tools[" .. i .. "] must be a table", 4)
    end
    if t.type then
      out[i] = t
    else
      if type(t.name) ~= "string" then
        error("bad argument #1 to 'chat': tools[" .. i .. "] needs a name", 4)
      end
      out[i] = { type = "function", ["function"] = {
        name = t.name, description = t.description,
        parameters = t.parameters or { type = "object", properties = {} } } }
    end
  end
  return out
end

local function build_body(self, params, messages)
  local body = {
    model = params.model or self.model,
    messages = messages,
    temperature = params.temperature,
    max_tokens = params.max_tokens,
  }
  if params.stream then
    body.stream = true
    body.stream_options = { include_usage = true }
  end
  if params.json_schema then
    body.response_format = { type = "json_schema", json_schema = {
      name = params.schema_name or "response", schema = params.json_schema,
      strict = params.strict } }
  end
  if params.tools and #params.tools > 0 then
    body.tools = normalize_tools(params.tools)
    body.tool_choice = params.tool_choice
  end
  if params.extra then
    for k, v in pairs(params.extra) do body[k] = v end
  end
  local encoded, err = cjson.encode(body)
  if not encoded then
    error("bad argument #1 to 'chat': the request cannot be encoded as JSON: " .. tostring(err), 4)
  end
  return encoded
end

local function check_messages(messages)
  if type(messages) ~= "table" or #messages == 0 then
    error("bad argument #1 to 'chat': messages must be a non-empty list", 4)
  end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" then
      error("bad argument #1 to 'chat': messages[" .. i .. "] needs a role", 4)
    end
  end
end

-- Run a chat. on_emit(), when given, is called once before the first token
-- reaches params.stream (llm.routed uses it to stop failing over).
function Client:_chat(params, on_emit)
  check_messages(params.messages)
  local emitted = false
  local repairing = false
  local on_token = function(text)
    if not emitted then
      emitted = true
      if on_emit then on_emit() end
    end
    params.stream(text, { repair = repairing })
  end
  local r, err = self:_call(build_body(self, params, params.messages), params, on_token)
  if not r then return nil, err end
  if not params.json_schema then return r end

  local value, verr = decode_reply(r.content)
  if value ~= nil then verr = validate(params.json_schema, value) end
  if not verr then r.json = value return r end

  -- one repair round: show the model its reply and what was wrong with it
  self:_log("llm: reply does not match the JSON schema (%s); asking once more", verr)
  local messages = {}
  for i, m in ipairs(params.messages) do messages[i] = m end
  messages[#messages + 1] = { role = "assistant", content = r.content or "" }
  messages[#messages + 1] = { role = "user", content =
    "Your previous reply did not match the required JSON schema: " .. verr ..
    ". Reply again with only a JSON value that matches the schema." }
  repairing = true
  local r2, err2 = self:_call(build_body(self, params, messages), params, on_token)
  if not r2 then return nil, err2 end
  local value2, verr2 = decode_reply(r2.content)
  if value2 ~= nil then verr2 = validate(params.json_schema, value2) end
  if verr2 then
    return nil, self:_err("the reply does not match the JSON schema after one repair: %s", verr2)
  end
  r2.json = value2
  r2.repaired = true
  return r2
end

-- The `stream` of a call: the caller's function; false for none; nil for
-- the running graph node's token stream when the graph is being streamed in
-- `messages` mode (as LangGraph streams every LLM call of a node), else none.
local function stream_of(params)
  local s = params.stream
  if s ~= nil and s ~= false and type(s) ~= "function" then
    error("bad argument #1 to 'chat': stream must be a function or false, got " .. type(s), 3)
  end
  if s == nil then
    local sink = context.token_sink()
    if sink then
      local p = {}
      for k, v in pairs(params) do p[k] = v end
      p.stream = function(text) sink(text) end
      return p
    end
  end
  if s == false then
    local p = {}
    for k, v in pairs(params) do p[k] = v end
    p.stream = nil
    return p
  end
  return params
end

-- client:chat(params) -> result | nil, err
function Client:chat(params)
  if type(params) ~= "table" then
    error("bad argument #1 to 'chat': table expected, got " .. type(params), 2)
  end
  check_options(params, CHAT_OPTIONS, "chat")
  return self:_chat(stream_of(params))
end

---------------------------------------------------------------- routed

local Routed = {}
Routed.__index = Routed

-- llm.routed{ models = { client, ... } | { key = client, ... }, router = fn,
--             order = { key, ... } }
-- router(models, params, error_ctx) -> key | nil; without one, models are
-- tried in order (list order, or `order` for a map; a list's keys are the
-- clients' names). Failover happens only before the first streamed token.
function _M.routed(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'routed': table expected, got " .. type(opts), 2)
  end
  for k in pairs(opts) do
    if k ~= "models" and k ~= "router" and k ~= "name" and k ~= "order" then
      error("bad argument #1 to 'routed': unknown option '" .. tostring(k) .. "'", 2)
    end
  end
  if opts.router ~= nil and type(opts.router) ~= "function" then
    error("bad argument #1 to 'routed': router must be a function", 2)
  end
  local map, order = failover.normalize(opts.models, "models")
  if opts.order ~= nil then
    if type(opts.order) ~= "table" then
      error("bad argument #1 to 'routed': order must be a list of keys", 2)
    end
    for _, k in ipairs(opts.order) do
      if map[k] == nil then
        error("bad argument #1 to 'routed': order names unknown model '" .. tostring(k) .. "'", 2)
      end
    end
    order = opts.order
  elseif #opts.models == 0 and not opts.router then
    error("bad argument #1 to 'routed': models given as a map need a router or an order", 2)
  end
  for k, c in pairs(map) do
    if getmetatable(c) ~= Client and getmetatable(c) ~= Routed then
      error("bad argument #1 to 'routed': models['" .. k .. "'] is not an llm client", 2)
    end
  end
  return setmetatable({ name = opts.name or "routed", map = map, order = order,
                        router = opts.router }, Routed)
end

function Routed:_chat(params, on_emit)
  local res, key = failover.route{
    map = self.map, order = self.order, router = self.router, context = params,
    call = function(_, client, mark)
      return client:_chat(params, function()
        mark()
        if on_emit then on_emit() end
      end)
    end,
  }
  if res then
    res.route = key
    return res
  end
  return nil, key
end

-- routed:chat(params) -> result (with result.route = chosen key) | nil, err
function Routed:chat(params)
  if type(params) ~= "table" then
    error("bad argument #1 to 'chat': table expected, got " .. type(params), 2)
  end
  check_options(params, CHAT_OPTIONS, "chat")
  return self:_chat(stream_of(params))
end

Routed.__tostring = function(self)
  return "routed llm " .. self.name .. " (" .. table_concat(self.order, ", ") .. ")"
end

_M.Client = Client
_M.Routed = Routed

return _M
