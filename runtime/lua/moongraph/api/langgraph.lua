--[[
moongraph.api.langgraph — the LangGraph Agent Server REST API over a
service (moongraph.service: moongraph.api.embedded puts it together for
`serve`, moongraph.api.langgraph_distributed for `serve --redis --pg`), as
routes for moongraph.server.

  local langgraph = require "moongraph.api.langgraph"
  local routes = langgraph.routes(backend, { keys = keys, heartbeat = 15 })
  server.listen{ host = ..., port = ..., routes = routes }

The paths, bodies and SSE events are the ones @langchain/langgraph-sdk
sends and reads (docs/api.md lists them). Every answer is JSON; errors are
{"detail": message, "request_id": id} with the status that says what went
wrong (400 bad JSON, 401 no or bad key, 404 unknown id or another user's,
409 busy or existing, 422 a field the API does not accept, named, 429 too
many requests or failed authentications), never a traceback or a server's
internals: a handler that fails answers 500 {"detail": "internal error"},
a store that is down 503, and the detail goes to stderr under the request
id (moongraph.api.guard). Every field is checked, by the service, with
moongraph.api.langgraph_request.

Streams are SSE: `metadata` first, then one event per stream mode
(values, updates, messages, custom, debug, tasks, checkpoints; with
stream_subgraphs, "mode|namespace"), `error` when the run fails; the
response ends when the run does. Every event has an id: a client that
reconnects to the run's stream (the `Location` header of POST
.../runs/stream) with `Last-Event-ID` gets the events after that one;
without it, a join replays the run from its first event. Idle streams get
a comment every `heartbeat` seconds.
]]

local json = require "moongraph.json"
local guard = require "moongraph.api.guard"
local lgrequest = require "moongraph.api.langgraph_request"

local type, tostring, ipairs, pairs = type, tostring, ipairs, pairs

local _M = {}

local JSON_HEADERS = { ["Content-Type"] = "application/json" }

local problem = guard.problem
_M.problem = problem

local function answer(value, status, headers)
  local body, err = json.encode(value, { valid_utf8 = true })
  if not body then return problem(500, "the answer cannot be sent as JSON: " .. err) end
  local h = JSON_HEADERS
  if headers then
    h = { ["Content-Type"] = "application/json" }
    for k, v in pairs(headers) do h[k] = v end
  end
  return { status = status or 200, headers = h, body = body }
end

-- a backend result -> response (nil, status, msg -> an error answer)
local function reply(v, st, msg, status, headers)
  if v == nil then return problem(st or 500, msg or "internal error") end
  return answer(v, status, headers)
end

local function truthy(q)
  return q == "1" or q == "true" or q == "True"
end

-- query.stream_mode (one or many) -> set of event names | nil
local function mode_filter(q)
  if q == nil or q == "" then return nil end
  local set = { metadata = true, error = true }
  local list = type(q) == "table" and q or { q }
  for _, m in ipairs(list) do
    if m == "messages-tuple" then m = "messages" end
    set[m] = true
  end
  return set
end

local SSE_HEADERS = { ["Content-Type"] = "text/event-stream", ["Cache-Control"] = "no-cache",
  ["X-Accel-Buffering"] = "no" }

--[[ send the run's events after `after` until the run ends; false when the
client went away ]]
local function pump(res, run, after, filter, heartbeat, headers)
  local h = {}
  for k, v in pairs(SSE_HEADERS) do h[k] = v end
  for k, v in pairs(headers or {}) do h[k] = v end
  local ok = res:start(200, h)
  if not ok then return false end
  local seq = after
  while true do
    local evs, done = run:events_after(seq, heartbeat)
    if #evs == 0 and not done then
      if not res:sse { comment = "heartbeat" } then return false end
    end
    for _, ev in ipairs(evs) do
      seq = ev.seq
      local base = ev.event:match("^[^|]+")
      if not filter or filter[base] then
        if not res:sse { id = tostring(ev.seq), event = ev.event, data = ev.data } then return false end
      end
    end
    if done then return true end
  end
end

-- where a stream of the run starts: after the request's Last-Event-ID
local function cursor(run, req)
  return run:cursor(req and req.headers["last-event-id"])
end

--[[ routes(service [, opts]) -> routes table for server.listen
The service (moongraph.service) gives runs with run_id, events_after(cursor, timeout) -> {seq, event,
data}..., done (seq: the event's id and the cursor after it),
cursor(last_event_id) and stop(action).
opts: keys, limiter, auth_limiter, trusted_proxies (moongraph.api.guard;
the limiters shared with the other routes of the server), heartbeat
(seconds between comments on idle streams, 15). ]]
function _M.routes(b, opts)
  if type(b) ~= "table" then error("bad argument #1 to 'routes': backend expected", 2) end
  opts = opts or {}
  local heartbeat = opts.heartbeat or 15

  -- handler(fn, with_body): authenticates, decodes the body, guards errors
  local handler = guard.wrapper(opts, { field = "detail", body_status = 422 })

  local function stream_new_run(req, res, user, body, thread_id)
    local run, st, msg = b:run_create(user, thread_id, body)
    if not run then return problem(st, msg) end
    local base = thread_id and ("/threads/" .. thread_id .. "/runs/" .. run.run_id) or ("/runs/" .. run.run_id)
    local gone = not pump(res, run, cursor(run, nil), nil, heartbeat,
      { ["Content-Location"] = base, ["Location"] = base .. "/stream" })
    if gone and body.on_disconnect == "cancel" then run:stop("interrupt") end
    return nil
  end

  local function wait_new_run(user, body, thread_id)
    local run, st, msg = b:run_create(user, thread_id, body)
    if not run then return problem(st, msg) end
    local base = thread_id and ("/threads/" .. thread_id .. "/runs/" .. run.run_id) or ("/runs/" .. run.run_id)
    return answer(b:run_output(run), 200, { ["Content-Location"] = base })
  end

  local function join_stream(req, res, user, thread_id, run_id)
    local run, st, msg = b:run(user, thread_id, run_id)
    if not run then return problem(st, msg) end
    local gone = not pump(res, run, cursor(run, req), mode_filter(req.query.stream_mode), heartbeat)
    if gone and truthy(req.query.cancel_on_disconnect) then run:stop("interrupt") end
    return nil
  end

  local r = {}

  r["GET /ok"] = function() return answer { ok = true } end
  r["GET /info"] = function()
    return answer { version = "moongraph", flags = { assistants = true, crons = false } }
  end

  -- assistants
  r["POST /assistants/search"] = handler(function(_, _, _, body)
    local list, total, msg = b:assistants_search(body)
    if not list then return problem(total, msg) end
    return answer(list, 200, { ["X-Pagination-Total"] = tostring(total) })
  end, true)
  r["POST /assistants/count"] = handler(function(_, _, _, body) return reply(b:assistants_count(body)) end, true)
  r["GET /assistants/:id"] = handler(function(req) return reply(b:assistant(req.params.id)) end)
  r["GET /assistants/:id/graph"] = handler(function(req) return reply(b:assistant_graph(req.params.id)) end)
  r["GET /assistants/:id/schemas"] = handler(function(req) return reply(b:assistant_schemas(req.params.id)) end)
  r["GET /assistants/:id/subgraphs"] = handler(function(req)
    local a, st, msg = b:assistant(req.params.id)
    if not a then return problem(st, msg) end
    return answer({})
  end)

  -- threads
  r["POST /threads"] = handler(function(_, _, user, body) return reply(b:thread_create(user, body)) end, true)
  r["POST /threads/search"] = handler(function(_, _, user, body)
    local list, total, msg = b:thread_search(user, body)
    if not list then return problem(total, msg) end
    return answer(list, 200, { ["X-Pagination-Total"] = tostring(total) })
  end, true)
  r["POST /threads/count"] = handler(function(_, _, user, body) return reply(b:thread_count(user, body)) end, true)
  r["GET /threads/:tid"] = handler(function(req, _, user) return reply(b:thread_get(user, req.params.tid)) end)
  r["PATCH /threads/:tid"] = handler(function(req, _, user, body)
    return reply(b:thread_patch(user, req.params.tid, body))
  end, true)
  r["DELETE /threads/:tid"] = handler(function(req, _, user)
    local ok, st, msg = b:thread_delete(user, req.params.tid)
    if not ok then return problem(st, msg) end
    return { status = 204 }
  end)
  r["GET /threads/:tid/state"] = handler(function(req, _, user)
    return reply(b:thread_state(user, req.params.tid))
  end)
  r["GET /threads/:tid/state/:cid"] = handler(function(req, _, user)
    return reply(b:thread_state(user, req.params.tid, req.params.cid))
  end)
  r["POST /threads/:tid/state/checkpoint"] = handler(function(req, _, user, body)
    local cp, st, msg = lgrequest.checkpoint_id { checkpoint = body.checkpoint }
    if st then return problem(st, msg) end
    return reply(b:thread_state(user, req.params.tid, cp))
  end, true)
  r["POST /threads/:tid/state"] = handler(function(req, _, user, body)
    return reply(b:thread_update_state(user, req.params.tid, body))
  end, true)
  r["POST /threads/:tid/history"] = handler(function(req, _, user, body)
    return reply(b:thread_history(user, req.params.tid, body))
  end, true)
  r["GET /threads/:tid/history"] = handler(function(req, _, user)
    return reply(b:thread_history(user, req.params.tid, { limit = req.query.limit, before = req.query.before }))
  end)
  r["GET /threads/:tid/stream"] = handler(function(req, res, user)
    local run, st, msg = b:thread_active_run(user, req.params.tid)
    if run == nil then return problem(st, msg) end
    if not run then
      res:start(200, SSE_HEADERS)
      return nil
    end
    pump(res, run, cursor(run, req), mode_filter(req.query.stream_mode), heartbeat)
    return nil
  end)

  -- runs on a thread
  r["POST /threads/:tid/runs"] = handler(function(req, _, user, body)
    local run, st, msg = b:run_create(user, req.params.tid, body)
    if not run then return problem(st, msg) end
    return answer(b:run_json(run), 200,
      { ["Content-Location"] = "/threads/" .. req.params.tid .. "/runs/" .. run.run_id })
  end, true)
  r["GET /threads/:tid/runs"] = handler(function(req, _, user)
    return reply(b:run_list(user, req.params.tid, req.query))
  end)
  r["POST /threads/:tid/runs/stream"] = handler(function(req, res, user, body)
    return stream_new_run(req, res, user, body, req.params.tid)
  end, true)
  r["POST /threads/:tid/runs/wait"] = handler(function(req, _, user, body)
    return wait_new_run(user, body, req.params.tid)
  end, true)
  r["GET /threads/:tid/runs/:rid"] = handler(function(req, _, user)
    local run, st, msg = b:run(user, req.params.tid, req.params.rid)
    if not run then return problem(st, msg) end
    return answer(b:run_json(run))
  end)
  r["DELETE /threads/:tid/runs/:rid"] = handler(function(req, _, user)
    local ok, st, msg = b:run_delete(user, req.params.tid, req.params.rid)
    if not ok then return problem(st, msg) end
    return { status = 204 }
  end)
  r["GET /threads/:tid/runs/:rid/join"] = handler(function(req, _, user)
    local run, st, msg = b:run(user, req.params.tid, req.params.rid)
    if not run then return problem(st, msg) end
    return answer(b:run_output(run))
  end)
  r["GET /threads/:tid/runs/:rid/stream"] = handler(function(req, res, user)
    return join_stream(req, res, user, req.params.tid, req.params.rid)
  end)
  r["POST /threads/:tid/runs/:rid/cancel"] = handler(function(req, _, user)
    local q, st, msg = lgrequest.cancel(req.query)
    if not q then return problem(st, msg) end
    local ok
    ok, st, msg = b:run_cancel(user, req.params.tid, req.params.rid, q.action, q.wait)
    if not ok then return problem(st, msg) end
    return { status = q.wait and 204 or 202 }
  end)

  -- stateless runs
  r["POST /runs"] = handler(function(_, _, user, body)
    local run, st, msg = b:run_create(user, nil, body)
    if not run then return problem(st, msg) end
    return answer(b:run_json(run), 200,
      { ["Content-Location"] = "/runs/" .. run.run_id })
  end, true)
  r["POST /runs/stream"] = handler(function(req, res, user, body)
    return stream_new_run(req, res, user, body, nil)
  end, true)
  r["POST /runs/wait"] = handler(function(_, _, user, body) return wait_new_run(user, body, nil) end, true)
  r["GET /runs/:rid/stream"] = handler(function(req, res, user)
    return join_stream(req, res, user, nil, req.params.rid)
  end)

  return r
end

return _M
