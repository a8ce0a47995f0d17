--[[
moongraph.mcp.session — one JSON-RPC conversation over a transport, the
part an MCP client and an MCP server share.

Outgoing requests get integer ids; the calling task waits (parked) until
the response with its id comes back, its time is up, or the connection
closes, so any number of tasks may have requests in flight on one session.
A task cancelled while it waits sends notifications/cancelled for its
request (from a new task: a cancelled task cannot do I/O). A timeout does
the same and returns nil, "... timed out after N s".

Incoming requests run each in its own task, through the handler registered
for the method; notifications/cancelled for one of them cancels that task
and no response is sent (as MCP asks). notifications/progress for a request
of ours calls the on_progress callback given with it.

A transport is a table with
  transport:send(msg) -> true | nil, err     (may yield)
  transport:start(session)                   begins delivering messages:
      it calls session:receive(msg, kind) for each and session:closed(err)
      once when the peer is gone
  transport:wake()                           optional: a request is waiting
  transport:close()                          (may yield)
]]

local core = require "moongraph.core"
local jsonrpc = require "moongraph.mcp.jsonrpc"

local loop = core.loop
local type, pairs, next, tostring, setmetatable, pcall, error =
      type, pairs, next, tostring, setmetatable, pcall, error
local string_format = string.format
local now = loop.now

local _M = {}

local Session = {}
Session.__index = Session
_M.Session = Session

--[[ new(transport, opts) -> session
opts: name (for messages, e.g. "mcp server 'x'"), timeout (default seconds
per request, default 60; false = none), handlers ({method = fn(params, ctx)
-> result | nil, err [, code]}), on_notification (fn(method, params)),
on_error (fn(message): messages that could not be used). ]]
function _M.new(transport, opts)
  opts = opts or {}
  local timeout = opts.timeout
  if timeout == nil then timeout = 60 end
  return setmetatable({
    transport = transport,
    name = opts.name or "mcp",
    timeout = timeout,
    handlers = opts.handlers or {},
    on_notification = opts.on_notification,
    on_error = opts.on_error,
    next_id = 1,
    pending = {},        -- id -> { task, response, on_progress, method }
    incoming = {},       -- id -> task running a handler
    npending = 0,
    closed_err = nil,
  }, Session)
end

function Session:report(msg)
  if self.on_error then
    local ok, err = pcall(self.on_error, msg)
    if not ok then io.stderr:write("moongraph mcp: on_error failed: ", tostring(err), "\n") end
  end
end

function Session:send(msg)
  if self.closed_err then return nil, self.closed_err end
  return self.transport:send(msg)
end

-- session:notify(method, params) -> true | nil, err
function Session:notify(method, params)
  return self:send(jsonrpc.notification(method, params))
end

local function cancel_later(self, id, reason)
  if self.transport.abandon then self.transport:abandon(id) end
  if self.closed_err then return end
  loop.spawn(function()
    self:send(jsonrpc.notification("notifications/cancelled", { requestId = id, reason = reason }))
  end)
end

local function forget(self, id)
  if self.pending[id] then
    self.pending[id] = nil
    self.npending = self.npending - 1
    if self.npending == 0 and self.transport.idle then self.transport:idle() end
  end
end

-- Closes over a request while its task waits: a task cancelled in the
-- middle leaves through __close with the entry unanswered.
local Guard = {}
Guard.__index = Guard
Guard.__close = function(g)
  local e = g.entry
  if e.finished then return end
  e.finished = true
  forget(g.session, g.id)
  if e.sent then cancel_later(g.session, g.id, "the calling task was cancelled") end
end

--[[ session:request(method, params, opts) -> result | nil, err, error_object
opts: timeout (seconds; false = none), on_progress (fn(progress, total,
message)): asks the peer for progress notifications. err names the method
and what happened; error_object is the peer's {code, message, data}. ]]
function Session:request(method, params, opts)
  opts = opts or {}
  if self.closed_err then return nil, self.closed_err end
  local me = loop.current()
  if not me then
    error("mcp: " .. method .. ": not inside a moongraph task (use mg.run or mg.spawn)", 3)
  end
  local id = self.next_id
  self.next_id = id + 1
  local entry = { task = me, method = method, on_progress = opts.on_progress }
  if opts.on_progress then
    params = params or {}
    local copy = {}
    for k, v in pairs(params) do copy[k] = v end
    local meta = {}
    if type(copy._meta) == "table" then for k, v in pairs(copy._meta) do meta[k] = v end end
    meta.progressToken = id
    copy._meta = meta
    params = copy
  end
  self.pending[id] = entry
  self.npending = self.npending + 1
  local guard <close> = setmetatable({ session = self, id = id, entry = entry }, Guard)
  local timeout = opts.timeout
  if timeout == nil then timeout = self.timeout end
  -- the caller's deadline (mg.timeout, a node's limit) bounds the wait
  local at_deadline = ""
  local budget = loop.budget()
  if budget and (not timeout or budget < timeout) then
    timeout, at_deadline = budget, ", at the caller's deadline"
  end
  local due = timeout and now() + timeout or nil
  if self.transport.wake then self.transport:wake() end
  entry.sent = true
  local ok, serr = self.transport:send(jsonrpc.request(id, method, params))
  if not ok then
    entry.finished = true
    forget(self, id)
    return nil, string_format("%s: %s: %s", self.name, method, tostring(serr))
  end
  while not entry.response and not entry.failed do
    local left = nil
    if due then
      left = due - now()
      if left <= 0 then break end
    end
    loop.suspend(left)
  end
  entry.finished = true
  forget(self, id)
  if entry.failed then
    return nil, string_format("%s: %s: %s", self.name, method, entry.failed)
  end
  local res = entry.response
  if not res then
    cancel_later(self, id, "timed out")
    return nil, string_format("%s: %s timed out after %g s%s", self.name, method, timeout, at_deadline)
  end
  if res.error ~= nil then
    return nil, string_format("%s: %s failed: %s", self.name, method, jsonrpc.describe_error(res.error)),
      res.error
  end
  return res.result
end

local function wake(entry)
  if entry.task then loop.wake(entry.task) end
end

-- Handle an incoming request in its own task.
local function serve(self, msg)
  local id, method = msg.id, msg.method
  local handler = self.handlers[method]
  if not handler then
    loop.spawn(function()
      self:send(jsonrpc.error(id, jsonrpc.METHOD_NOT_FOUND, "Method not found: " .. method))
    end)
    return
  end
  if self.incoming[id] then
    loop.spawn(function()
      self:send(jsonrpc.error(id, jsonrpc.INVALID_REQUEST, "a request with id " .. tostring(id) .. " is already running"))
    end)
    return
  end
  local params = msg.params or {}
  local meta = type(params._meta) == "table" and params._meta or {}
  local token = meta.progressToken
  local ctx = {
    id = id, method = method, session = self,
    -- ctx.progress(progress, [total], [message]): a progress notification
    -- for this request, when the peer asked for them
    progress = function(progress, total, message)
      if token == nil then return false end
      return self:notify("notifications/progress",
        { progressToken = token, progress = progress, total = total, message = message })
    end,
  }
  local t
  t = loop.spawn(function()
    local ok, res, err, code = pcall(handler, params, ctx)
    if self.incoming[id] == t then self.incoming[id] = nil end
    local reply
    if not ok then
      reply = jsonrpc.error(id, jsonrpc.INTERNAL_ERROR, tostring(res))
    elseif res == nil then
      reply = jsonrpc.error(id, code or jsonrpc.INTERNAL_ERROR, tostring(err or "no result"))
    else
      reply = jsonrpc.result(id, res)
    end
    local sok, serr = self:send(reply)
    if not sok and not self.closed_err then
      -- a result that cannot be encoded still gets an answer
      self:send(jsonrpc.error(id, jsonrpc.INTERNAL_ERROR, tostring(serr)))
    end
  end)
  if not t:done() then self.incoming[id] = t end
end

-- Called by the transport for each well-formed message.
function Session:receive(msg, kind)
  if kind == "response" then
    local entry = self.pending[msg.id]
    if not entry then
      self:report(string_format("%s: a response to unknown request id %s", self.name, jsonrpc.show(msg.id)))
      return
    end
    entry.response = msg
    wake(entry)
  elseif kind == "request" then
    serve(self, msg)
  else
    local method, params = msg.method, msg.params or {}
    if method == "notifications/progress" then
      local entry = self.pending[params.progressToken]
      if entry and entry.on_progress then
        local ok, err = pcall(entry.on_progress, params.progress, params.total, params.message)
        if not ok then self:report(self.name .. ": on_progress failed: " .. tostring(err)) end
      end
    elseif method == "notifications/cancelled" then
      local t = self.incoming[params.requestId]
      if t then
        self.incoming[params.requestId] = nil
        if not t:done() then t:cancel() end
      end
    end
    if self.on_notification then
      local ok, err = pcall(self.on_notification, method, params)
      if not ok then self:report(self.name .. ": on_notification failed: " .. tostring(err)) end
    end
  end
end

-- Called by the transport when request id cannot get an answer (its
-- exchange failed).
function Session:fail(id, err)
  local entry = self.pending[id]
  if not entry then return end
  entry.failed = err
  wake(entry)
end

-- Called by the transport once the peer is gone: every waiting request
-- fails with err, later ones at once.
function Session:closed(err)
  if self.closed_err then return end
  self.closed_err = err or "connection closed"
  for id, entry in pairs(self.pending) do
    entry.failed = self.closed_err
    wake(entry)
    self.pending[id] = nil
  end
  self.npending = 0
  for id, t in pairs(self.incoming) do
    self.incoming[id] = nil
    if not t:done() and t ~= loop.current() then t:cancel() end
  end
end

function Session:busy()
  return self.npending > 0
end

return _M
