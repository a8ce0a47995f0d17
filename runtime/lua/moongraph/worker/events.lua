-- moongraph.worker.events — a job's event stream, written and followed.
--
-- Each job has a Redis stream PREFIX:events:<job_id> with entries
-- {type = ..., data = <JSON>}; types are node_start, node_end, token,
-- answer, error and done, and done is always the last one. A LangGraph
-- run (moongraph.worker.langgraph) writes the LangGraph API's event names
-- instead (metadata, values, updates, ..., error), then done: its emitter
-- is opened with { any_type = true }.
--
-- Writing (the worker):
--
--   local em = events.emitter(redis, key, { maxlen = 10000, log = log, interval = 0.05 })
--   em:push("node_start", { node = "answer", task_id = id })   -- never waits
--   em:token("answer", "안")  -- a token event; pieces not yet sent join
--   em:flush()        -- waits until everything pushed so far is in Redis
--   events.finish(redis, key, { {"answer", {...}}, {"done", {...}} }, opts)
--
-- Events are written in push order by one task per job, many per round
-- trip. Each gets an explicit stream id when it is first sent
-- (milliseconds from the Redis server's clock, then a sequence), so a batch
-- sent again after a lost connection cannot add an entry twice: Redis
-- refuses an id it already has. While Redis is unreachable the events wait
-- in memory and are sent, in order, once it is back. `finish` adds the last
-- events and `done` atomically, only if the stream has no `done` yet, and
-- sets the stream to expire: a job finished twice (a duplicate delivery, a
-- retried acknowledgement) still ends with exactly one done.
--
-- opts.interval (seconds, default 0) spaces the writes: one starts at least
-- that long after the one before it, and what is pushed meanwhile waits
-- and goes with it (tokens a node streams with no other event between
-- them as one event). The first event after a quiet spell, a backlog of
-- BATCH events or more, flush and close do not wait for the interval.
--
-- Following (a client, a gateway):
--
--   local last, done = events.follow(redis, key, { last_id = "0-0",
--     on_event = function(ev) ... end })   -- ev = {id=, type=, data=}
--
-- follow catches up with XRANGE from the entry after last_id, then waits
-- with XREAD BLOCK; after a lost connection it starts again from the last
-- id it delivered, so every event arrives once and in order.

local mg = require "moongraph"
local json = require "moongraph.json"
local cjson = json.wire()

local type, tostring, tonumber, ipairs, setmetatable, pcall, select =
  type, tostring, tonumber, ipairs, setmetatable, pcall, select
local format, floor, min, max, concat = string.format, math.floor, math.min, math.max, table.concat

local _M = {}

_M.TYPES = { node_start = true, node_end = true, token = true, answer = true, error = true, done = true }

_M.BATCH = 256

---------------------------------------------------------------- writing

local Emitter = {}
Emitter.__index = Emitter

function _M.emitter(redis, key, opts)
  opts = opts or {}
  local self = setmetatable({
    redis = redis, key = key,
    maxlen = opts.maxlen or 10000,
    -- as every XADD sends it (a number would be formatted each time)
    maxlen_arg = tostring(opts.maxlen or 10000),
    running_ttl = opts.running_ttl or 86400,
    log = opts.log, metrics = opts.metrics, any_type = opts.any_type,
    interval = opts.interval or 0, last_write = -math.huge, holding = false,
    -- the queue, in three lists (no table per event): type, JSON text
    -- (false: a token's, made when it is sent), and the stream id once one
    -- is given; a token event's node and text pieces until it is sent
    types = {}, texts = {}, ids = {}, head = 1, tail = 0,
    token_node = {}, token_text = {},
    xadds = {},   -- XADD commands, reused from batch to batch
    wake = mg.queue(), idle = false,
    flushers = {}, closing = false,
    last_ms = 0, last_seq = -1, opened = false,
  }, Emitter)
  self.task = mg.spawn(Emitter.run, self)
  return self
end

-- The writer task, when it waits for work, goes on.
local function wake_writer(self)
  if self.idle then
    self.idle = false
    self.wake:put(true)
  end
end

-- The writer task, when it waits for work or for its interval, goes on.
local function wake_writer_now(self)
  if self.holding then
    self.holding = false
    self.wake:put(true)
  else
    wake_writer(self)
  end
end

-- push(type, data): queue one event (data: a table, encoded as JSON).
function Emitter:push(etype, data)
  if not _M.TYPES[etype] and not self.any_type then
    error("bad argument #1 to 'push' (unknown event type '" .. tostring(etype) .. "')", 2)
  end
  local text = cjson.encode(data or {})
  if not text then text = cjson.encode { unencodable = tostring(data) } end
  local tail = self.tail + 1
  self.tail = tail
  self.types[tail], self.texts[tail] = etype, text
  wake_writer(self)
end

-- token(node, text): a piece of streamed output. While the queue's last
-- event is a token of the same node that has not been sent yet, the text
-- joins it: a writer that falls behind sends fewer, longer pieces, and the
-- stream's text is the same.
function Emitter:token(node, text)
  local tail = self.tail
  if tail >= self.head and self.texts[tail] == false and self.token_node[tail] == node then
    local parts = self.token_text[tail]
    parts[#parts + 1] = text
    return
  end
  tail = tail + 1
  self.tail = tail
  self.types[tail], self.texts[tail] = "token", false
  self.token_node[tail], self.token_text[tail] = node, { text }
  wake_writer(self)
end

-- The JSON text of queued token event i, made once it is sent.
function Emitter:token_json(i)
  local text = cjson.encode { node = self.token_node[i], text = concat(self.token_text[i]) }
  self.texts[i], self.token_node[i], self.token_text[i] = text, nil, nil
  return text
end

function Emitter:pending()
  return self.tail - self.head + 1
end

-- Redis time and the stream's last id, so new ids come after both.
function Emitter:open()
  local res, err = self.redis:pipeline {
    { "TIME" },
    { "XREVRANGE", self.key, "+", "-", "COUNT", 1 },
  }
  if not res then return nil, err end
  local t, last = res[1], res[2]
  if type(t) ~= "table" or t[1] == false then return nil, "TIME failed: " .. tostring(t and t[2]) end
  if type(last) == "table" and last[1] == false then return nil, tostring(last[2]) end
  self.base_ms = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  self.base_mono = mg.now()
  if type(last) == "table" and last[1] then
    local ms, seq = last[1][1]:match("^(%d+)%-(%d+)$")
    self.last_ms, self.last_seq = tonumber(ms), tonumber(seq)
  end
  self.opened = true
  return true
end

-- an id is "<ms>-<seq>"; formatting numbers costs more than the rest of
-- an event, so the "<ms>-" part is made once per millisecond and small
-- sequence numbers are taken from a table
local SEQ = {}
for i = 0, 255 do SEQ[i] = tostring(i) end

function Emitter:next_id()
  local ms = self.base_ms + floor((mg.now() - self.base_mono) * 1000)
  local seq
  if ms <= self.last_ms then
    ms = self.last_ms
    seq = self.last_seq + 1
  else
    self.last_ms = ms
    seq = 0
  end
  self.last_seq = seq
  local prefix = self.id_prefix
  if self.id_ms ~= ms then
    prefix = format("%d-", ms)
    self.id_prefix, self.id_ms = prefix, ms
  end
  return prefix .. (SEQ[seq] or tostring(seq))
end

-- stream ids "ms-seq": a <= b
local function id_le(a, b)
  local am, as = a:match("^(%d+)-(%d+)$")
  local bm, bs = b:match("^(%d+)-(%d+)$")
  if not (am and bm) then return false end
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as <= bs)
end

-- The id of the stream's last entry, or false: an XADD refused while the
-- stream already reaches its id went through before (a retry after a lost
-- reply). Asked of the stream, once per batch.
local function stream_top(self)
  local top = self.redis:call("XREVRANGE", self.key, "+", "-", "COUNT", 1)
  local last = type(top) == "table" and type(top[1]) == "table" and top[1][1]
  return type(last) == "string" and last
end

-- The writer task: sends queued events in order until closed.
function Emitter:run()
  local backoff = 0.05
  local function failed(what, err)
    if self.log then self.log:warn("event write failed; retrying", { key = self.key, error = tostring(err), op = what }) end
    mg.sleep(backoff)
    backoff = min(backoff * 2, 2)
  end
  while true do
    if not self.opened then
      local ok, err = self:open()
      if not ok then failed("open", err) goto continue end
    end
    if self.head > self.tail then
      local fl = self.flushers
      if #fl > 0 then
        self.flushers = {}
        for i = 1, #fl do fl[i]:put(true) end
      end
      if self.closing then return end
      self.idle = true
      self.wake:get()
      goto continue
    end
    -- (a backlog of a batch or more goes at once: the interval spaces
    -- writes, it does not cap how fast a backlog drains)
    if self.interval > 0 and not self.closing and #self.flushers == 0
        and self.tail - self.head + 1 < _M.BATCH then
      local wait = self.last_write + self.interval - mg.now()
      if wait > 0 then
        self.holding = true
        self.wake:get(wait)
        self.holding = false
        goto continue
      end
    end
    do
      local types, texts, ids, xadds, cmds = self.types, self.texts, self.ids, self.xadds, {}
      local last = min(self.tail, self.head + _M.BATCH - 1)
      for i = self.head, last do
        local id = ids[i]
        if not id then id = self:next_id(); ids[i] = id end
        local text = texts[i]
        if text == false then text = self:token_json(i) end
        local n = #cmds + 1
        local c = xadds[n]
        if c then
          c[6], c[8], c[10] = id, types[i], text
        else
          c = { "XADD", self.key, "MAXLEN", "~", self.maxlen_arg, id, "type", types[i], "data", text }
          xadds[n] = c
        end
        cmds[n] = c
      end
      -- the stream's expiry is set with the first batch (and again after
      -- a failed one); finish sets the final one
      local expiring = not self.expiry_set
      if expiring then cmds[#cmds + 1] = { "EXPIRE", self.key, self.running_ttl } end
      self.last_write = mg.now()
      local res, err = self.redis:pipeline(cmds)
      if not res then failed("XADD", err) goto continue end
      local top = nil
      for i = 1, #res - (expiring and 1 or 0) do
        local r = res[i]
        if type(r) == "table" and r[1] == false then
          if top == nil then top = stream_top(self) end
          if not (top and id_le(cmds[i][6], top)) then
            failed("XADD", r[2])
            goto continue
          end
        end
      end
      if expiring then self.expiry_set = true end
      for i = self.head, last do types[i], texts[i], ids[i] = nil, nil, nil end
      if self.metrics then self.metrics:inc("events_written", last - self.head + 1) end
      self.head = last + 1
      backoff = 0.05
    end
    ::continue::
  end
end

-- flush(): wait until every event pushed so far is written.
function Emitter:flush()
  if self.head > self.tail then return true end
  if self.task:done() then return nil, "event writer stopped" end
  local q = mg.queue()
  self.flushers[#self.flushers + 1] = q
  wake_writer_now(self)
  q:get()
  return true
end

-- close(): let the writer finish what is queued, then stop.
function Emitter:close()
  self.closing = true
  wake_writer_now(self)
end

-- abandon(): stop now; what is not written yet is dropped.
function Emitter:abandon()
  if not self.task:done() then self.task:cancel() end
end

local FINISH = [[
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if last[1] then
  local f = last[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'type' and f[i + 1] == 'done' then return 0 end
  end
end
for i = 3, #ARGV, 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'type', ARGV[i], 'data', ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
]]

-- finish(redis, key, list, opts) -> true (written) | false (the stream
-- already had its done) | nil, err. list: { {type, data}, ... } ending with
-- done. opts: maxlen, ttl (seconds the stream lives on).
function _M.finish(redis, key, list, opts)
  opts = opts or {}
  local args = { "EVAL", FINISH, 1, key, opts.maxlen or 10000, opts.ttl or 3600 }
  for _, e in ipairs(list) do
    args[#args + 1] = e[1]
    args[#args + 1] = cjson.encode(e[2] or {}) or "{}"
  end
  local r, err = redis:call(table.unpack(args))
  if r == nil then return nil, err end
  return r == 1
end

---------------------------------------------------------------- following

local function to_event(entry)
  local id, f = entry[1], entry[2]
  local ev = { id = id }
  for i = 1, #f - 1, 2 do
    local k, v = f[i], f[i + 1]
    if k == "type" then ev.type = v
    elseif k == "data" then ev.raw = v end
  end
  ev.data = ev.raw and cjson.decode(ev.raw) or {}
  return ev
end
_M.to_event = to_event

-- follow(redis, key, opts) -> last_id, done_event | nil, err, last_id
-- opts: last_id (default "0-0": from the start), on_event(ev) (return false
-- to stop early), block (seconds per XREAD, default 5), idle_timeout (give
-- up after this long without an event; default none), on_retry(err, delay)
-- (a lost connection; default: retry quietly), count (entries per read).
function _M.follow(redis, key, opts)
  opts = opts or {}
  local last = opts.last_id or "0-0"
  local on_event = opts.on_event or function() end
  local block_ms = floor((opts.block or 5) * 1000)
  local count = opts.count or 500
  local idle_timeout = opts.idle_timeout
  local last_seen = mg.now()
  local backoff = 0.05
  local caught_up = false
  local function deliver(entries)
    for _, e in ipairs(entries) do
      local ev = to_event(e)
      last = ev.id
      last_seen = mg.now()
      if on_event(ev) == false then return "stopped" end
      if ev.type == "done" then return "done", ev end
    end
  end
  while true do
    local res, err
    if not caught_up then
      res, err = redis:call("XRANGE", key, "(" .. last, "+", "COUNT", count)
      if res then
        local how, ev = deliver(res)
        if how == "done" then return last, ev end
        if how == "stopped" then return last end
        if #res < count then caught_up = true end
      end
    else
      res, err = redis:call("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, last)
      if res then
        if type(res) == "table" and res[1] then
          local how, ev = deliver(res[1][2])
          if how == "done" then return last, ev end
          if how == "stopped" then return last end
        end
      end
    end
    if res then
      backoff = 0.05
      if idle_timeout and mg.now() - last_seen > idle_timeout then
        return nil, format("no event for %gs", idle_timeout), last
      end
    else
      caught_up = false
      if opts.on_retry then opts.on_retry(err, backoff) end
      if idle_timeout and mg.now() - last_seen > idle_timeout then
        return nil, tostring(err), last
      end
      mg.sleep(backoff)
      backoff = min(backoff * 2, 2)
    end
  end
end

return _M
