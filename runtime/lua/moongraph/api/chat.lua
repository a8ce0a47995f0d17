--[[
moongraph.api.chat — the Chat API (a message in, its run's events out as
SSE, conversations), as routes for moongraph.server, over a backend
(moongraph.api.chat_embedded: runs in this process).

  local chat = require "moongraph.api.chat"
  local routes = chat.routes(backend, { keys = keys, heartbeat = 15,
                                        limiter = ratelimit.new{...}, max_message = 16384 })

  POST   /chat/messages                   {message, conversation_id?, context?, script?}
                                          -> 202 {job_id, conversation_id, stream_url}
  GET    /chat/messages/:job_id/stream    SSE: node_start, node_end, token, answer, error, done
  GET    /chat/conversations              ?limit=20&offset=0 (the caller's, newest first)
  GET    /chat/conversations/:id          the conversation with its messages
  DELETE /chat/conversations/:id          204 (again: 204)

Every event of a stream has an id; a client that reconnects with
`Last-Event-ID` (header, or ?last_event_id=) gets the events after it,
once and in order, then the live ones. An idle stream gets a comment
every `heartbeat` seconds. Errors are JSON {"error": message,
"request_id": id} with the status that says what went wrong: 400 bad JSON
or field (named), 401 no or bad API key, 404 an unknown id (or another
user's), 413 a message over max_message bytes, 429 over the rate limit or
too many failed authentications (with Retry-After), 503 the message could
not be stored. A handler that fails answers 500 {"error": "internal
error"}; the detail of a 5xx goes to stderr under the request id, never to
the client (moongraph.api.guard).
]]

local json = require "moongraph.json"
local guard = require "moongraph.api.guard"
local fields = require "moongraph.api.fields"
local ids = require "moongraph.ids"

local type, tostring, ipairs, error, next = type, tostring, ipairs, error, next

local _M = {}

_M.MAX_MESSAGE = 16 * 1024      -- bytes of a message
_M.MAX_CONTEXT = 4096           -- bytes of the context object, as JSON
_M.MAX_LOCATION = 200           -- bytes of the earlier top-level user_location
_M.HEARTBEAT = 15               -- seconds between comments on an idle stream
_M.PAGE = 20                    -- conversations per page by default
_M.MAX_PAGE = 100
_M.ANONYMOUS = "local"          -- the user of every request when no keys are set
_M.TITLE_CHARS = 60             -- characters of a conversation's title

-- A conversation's title (and a last message's preview) in every backend:
-- the first TITLE_CHARS characters of a message, whole UTF-8 characters,
-- its spacing made one line.
function _M.title(message)
  local t = message:gsub("%s+", " "):gsub("^ ", "")
  local n, cut = 0, #t
  for p in utf8.codes(t) do
    n = n + 1
    if n > _M.TITLE_CHARS then cut = p - 1 break end
  end
  if cut < #t then return t:sub(1, cut) .. "…" end
  return t
end

local SSE_HEADERS = {
  ["Content-Type"] = "text/event-stream",
  ["Cache-Control"] = "no-cache",
  ["X-Accel-Buffering"] = "no",
}

local problem = guard.problem

-- A JSON answer written by moongraph.json, so lists the backend marks with
-- json.array stay lists when empty ([] rather than {}).
local function answer(value)
  local body, err = json.encode(value, { valid_utf8 = true })
  if not body then return problem(500, "the answer cannot be sent as JSON: " .. tostring(err)) end
  return { status = 200, headers = { ["Content-Type"] = "application/json" }, body = body }
end

local function absent(v) return v == nil or v == json.null end

-- The message of a POST body | nil, status, error
local function parse_message(req, max_message)
  local body = req.body
  if body == nil or body == "" then return nil, 400, "the request body is empty: send a JSON object with \"message\"" end
  local v, err = fields.body(body)
  if v == nil then return nil, 400, err end
  if type(v) ~= "table" or json.is_array(v) or v[1] ~= nil then
    return nil, 400, "the request body must be a JSON object with \"message\""
  end
  local m = v.message
  if absent(m) then return nil, 400, "\"message\" is missing" end
  if type(m) ~= "string" then return nil, 400, "\"message\" must be a string" end
  if #m > max_message then
    return nil, 413, "\"message\" is longer than " .. max_message .. " bytes (" .. #m .. ")"
  end
  if not m:find("%S") then return nil, 400, "\"message\" is empty" end
  local out = { message = m }
  local c = v.conversation_id
  if not absent(c) then
    if type(c) ~= "string" or not ids.valid(c) then
      return nil, 400, "\"conversation_id\" must be an id from an earlier answer (1-200 letters, digits or - _ . : @)"
    end
    out.conversation_id = c
  end
  -- context: an object the script reads as it likes (the runtime looks
  -- no further into it than its size)
  local ctx = v.context
  if not absent(ctx) then
    if type(ctx) ~= "table" or json.is_array(ctx) or ctx[1] ~= nil then
      return nil, 400, "\"context\" must be an object"
    end
    local text = json.encode(ctx)
    if not text then return nil, 400, "\"context\" cannot be written as JSON" end
    if #text > _M.MAX_CONTEXT then
      return nil, 400, "\"context\" is longer than " .. _M.MAX_CONTEXT .. " bytes as JSON"
    end
    if next(ctx) ~= nil then out.context = ctx end
  end
  -- (the earlier format's top-level user_location becomes context.user_location)
  local loc = v.user_location
  if not absent(loc) and loc ~= "" then
    if type(loc) ~= "string" then return nil, 400, "\"user_location\" must be a string" end
    if #loc > _M.MAX_LOCATION then
      return nil, 400, "\"user_location\" is longer than " .. _M.MAX_LOCATION .. " bytes"
    end
    out.context = out.context or {}
    if out.context.user_location == nil then out.context.user_location = loc end
  end
  local s = v.script
  if not absent(s) then
    if type(s) ~= "string" or s == "" then return nil, 400, "\"script\" must be a script's name" end
    out.script = s
  end
  return out
end
_M.parse_message = parse_message

local function page_of(q)
  local function given(v) if v ~= "" then return v end end
  local p, err = fields.page({ limit = given(q.limit), offset = given(q.offset) },
    { limit = _M.PAGE, max_limit = _M.MAX_PAGE })
  if not p then return nil, "?" .. err end
  return p
end

-- Stream a job's events from after `sub`'s position until done (or the
-- client leaves).
local function pump(res, sub, heartbeat)
  local ok = res:start(200, SSE_HEADERS)
  if not ok then return end
  if not res:sse{ retry = 1000, comment = "moongraph" } then return end
  while true do
    local evs, err = sub:next(heartbeat)
    if not evs then
      res:sse{ event = "error", data = { error = "the job's events are gone: " .. tostring(err) } }
      return
    end
    if #evs == 0 then
      if sub.ended then return end
      if not res:sse{ comment = "heartbeat" } then return end
    end
    for _, e in ipairs(evs) do
      if not res:sse{ event = e.type, id = e.id, data = e.data } then return end
      if e.type == "done" then return end
    end
  end
end

-- routes(backend, opts) -> the routes table for moongraph.server
-- opts: keys, limiter, auth_limiter, trusted_proxies (moongraph.api.guard),
-- heartbeat (seconds), max_message (bytes).
function _M.routes(b, opts)
  if type(b) ~= "table" then error("bad argument #1 to 'routes': backend expected", 2) end
  opts = opts or {}
  local heartbeat = opts.heartbeat or _M.HEARTBEAT
  local max_message = opts.max_message or _M.MAX_MESSAGE

  -- Every handler: the caller's user (401 without a good key), the rate
  -- limit (429), and nothing of the server's internals reaches the client.
  local guarded = guard.wrapper(opts, { field = "error", body_status = 400, anonymous = _M.ANONYMOUS })

  local routes = {}

  routes["POST /chat/messages"] = guarded(function(req, _, user)
    local m, st, msg = parse_message(req, max_message)
    if not m then return problem(st, msg) end
    local j
    j, st, msg = b:submit(user, m)
    if not j then return problem(st, msg) end
    local url = "/chat/messages/" .. j.job_id .. "/stream"
    return { status = 202, headers = { Location = url },
             json = { job_id = j.job_id, conversation_id = j.conversation_id, stream_url = url,
                      status = j.status or "queued" } }
  end)

  routes["GET /chat/messages/:job_id/stream"] = guarded(function(req, res, user)
    local last = req.headers["last-event-id"]
    if last == nil or last == "" then last = req.query.last_event_id end
    if type(last) == "table" then return problem(400, "give one last_event_id") end
    local sub, st, msg = b:subscribe(user, req.params.job_id, last)
    if not sub then return problem(st, msg) end
    pump(res, sub, heartbeat)
  end)

  routes["GET /chat/conversations"] = guarded(function(req, _, user)
    local page, perr = page_of(req.query)
    if not page then return problem(400, perr) end
    local list, st, msg = b:conversations(user, page)
    if not list then return problem(st, msg) end
    return answer(list)
  end)

  routes["GET /chat/conversations/:id"] = guarded(function(req, _, user)
    local c, st, msg = b:conversation(user, req.params.id)
    if not c then return problem(st, msg) end
    return answer(c)
  end)

  routes["DELETE /chat/conversations/:id"] = guarded(function(req, _, user)
    local ok, st, msg = b:delete(user, req.params.id)
    if not ok then return problem(st, msg) end
    return { status = 204 }
  end)

  return routes
end

return _M
