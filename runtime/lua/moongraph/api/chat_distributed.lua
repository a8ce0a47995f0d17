--[[
moongraph.api.chat_distributed — the distributed backend of the Chat API:
each message becomes a job for `moongraph worker` processes on the Redis
stream `moongraph submit` writes to, its events are relayed from the job's
Redis event stream, and conversations live in PostgreSQL. A serve process
keeps no state of its own, so any number of them can stand behind a load
balancer, beside any number of workers.

  local distributed = require "moongraph.api.chat_distributed"
  local b = assert(distributed.new{
    redis = "redis://127.0.0.1:6379/0", pg = "postgresql://...",
    prefix = "moongraph",                 -- the workers' --prefix
    scripts = { {name = "chat", path = "chat.lua"}, ... },   -- as the workers run them
  })
  -- the methods moongraph.api.chat calls: submit, subscribe, conversations,
  -- conversation, delete (see moongraph.api.chat_embedded)

Tables (the scope "chat" of moongraph.migrations, applied at start):

  chat_conversations  id, user_id, title, created_at, updated_at
  chat_messages       job_id, conversation_id, content, context (the
                      message's context object; rows of earlier versions
                      also have user_location, moved into context by
                      migration 2), script, created_at: the users' messages
  (the answers are the workers' job_results rows, by job id)

A message is accepted once its row is committed and its job is on the
stream; a job that cannot be queued takes its row back and the client gets
503. The conversation id is the job's thread id: the workers run one
conversation's messages one after another. Deleting a conversation removes
its rows, its jobs' results, its checkpoints and (through the script's
`erase` hook) what the application keeps of the thread.
]]

local migrations = require "moongraph.migrations"
local pg = require "moongraph.pg"
local redis = require "moongraph.redis"
local json = require "moongraph.json"
local ids = require "moongraph.ids"
local job_ids = require "moongraph.worker.job"
local client_mod = require "moongraph.worker.client"
local events = require "moongraph.worker.events"
local wconfig = require "moongraph.worker.config"
local checkpointer = require "moongraph.worker.checkpointer"
local scripts_mod = require "moongraph.worker.scripts"
local text = require "moongraph.text"
local public_error = require "moongraph.public_error"

local type, tostring, ipairs, setmetatable, pcall, error =
  type, tostring, ipairs, setmetatable, pcall, error
local math_floor, math_max = math.floor, math.max
local error_message = text.error_message

local _M = {}
local B = {}
B.__index = B

local SCHEMA = [[
CREATE TABLE IF NOT EXISTS chat_conversations (
  id          text PRIMARY KEY,
  user_id     text NOT NULL,
  title       text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS chat_conversations_user ON chat_conversations (user_id, updated_at DESC, id DESC);
CREATE TABLE IF NOT EXISTS chat_messages (
  job_id          text PRIMARY KEY,
  conversation_id text NOT NULL REFERENCES chat_conversations (id) ON DELETE CASCADE,
  content         text NOT NULL,
  user_location   text,
  script          text NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS chat_messages_conversation ON chat_messages (conversation_id, created_at);
]]

-- The Chat API's tables: the scope "chat" of moongraph.migrations (its
-- first step creates only what is missing: earlier versions made the same
-- tables without recording it).
_M.migrations = {
  { version = 1, name = "conversations and messages", sql = SCHEMA },
  { version = 2, name = "a message's context object (the earlier user_location moves into it)", sql = [[
ALTER TABLE chat_messages ADD COLUMN IF NOT EXISTS context jsonb;
UPDATE chat_messages SET context = jsonb_build_object('user_location', user_location)
 WHERE context IS NULL AND user_location IS NOT NULL;
]] },
}

local title_of = require("moongraph.api.chat").title

local function null_to_nil(v)
  if v == pg.null then return nil end
  return v
end

-- new{redis, pg, prefix, scripts} -> backend | nil, err
function _M.new(opts)
  if type(opts) ~= "table" then error("bad argument #1 to 'new' (options table expected)", 2) end
  if type(opts.redis) ~= "string" or type(opts.pg) ~= "string" then
    error("bad argument #1 to 'new' (redis and pg URLs expected)", 2)
  end
  local scripts = scripts_mod.new(opts.scripts or {}, nil)
  local lok, serr = scripts:load()
  if not lok then return nil, serr end
  local names = scripts:names()
  if #names == 0 then return nil, "no script: give --script [NAME=]PATH as the workers run it" end
  local conn, rerr = redis.connect(opts.redis)
  if not conn then return nil, "redis: " .. tostring(rerr) end
  local db, perr = pg.pool(opts.pg, { size = opts.pool_size or 32 })
  if not db then conn:close(); return nil, "postgres: " .. tostring(perr) end
  local ok, merr = migrations.migrate(db, { { scope = "chat", list = _M.migrations } })
  if not ok then conn:close(); db:close(); return nil, "postgres: " .. tostring(merr) end
  local prefix = opts.prefix or "moongraph"
  local self = setmetatable({
    redis = conn, db = db, prefix = prefix, scripts = scripts, names = names,
    urls = { redis_url = opts.redis, pg_url = opts.pg },
    -- behind Sentinel a job counts as queued once a replica has it too (a
    -- failover loses what only the old master had)
    client = assert(client_mod.connect({ redis = conn }, { prefix = prefix,
      replicas = opts.redis:lower():find("^redis%-sentinel://") and 1 or 0 })),
    saver = nil,
  }, B)
  return self
end

function B:close()
  self.redis:close()
  self.db:close()
end

function B:script_names()
  return self.names
end

-- The saver the workers keep their runs' checkpoints in (the default kind;
-- opened on the first delete).
function B:_saver()
  if not self.saver then
    local s, err = checkpointer.open(wconfig.defaults.checkpoint or "cached", self.urls)
    if not s then return nil, err end
    self.saver = s
  end
  return self.saver
end

-- The conversation `id` of `user` (locked for the rest of tx), or nil.
local function owned(tx, user, id)
  if type(id) ~= "string" or not ids.valid(id) then return nil end
  local rows = assert(tx:query("SELECT id, title FROM chat_conversations WHERE id = $1 AND user_id = $2 FOR UPDATE",
    { id, user }))
  return rows[1]
end

--[[ submit(user, {message, conversation_id?, context?, script?})
-> {job_id, conversation_id, status} | nil, status, message ]]
function B:submit(user, m)
  local script = m.script or self.names[1]
  if not self.scripts:get(script) then
    return nil, 400, "unknown script '" .. tostring(script) .. "' (known: " .. table.concat(self.names, ", ") .. ")"
  end
  local job_id = job_ids.new_id("j")
  local conv_id = m.conversation_id
  local missing = false
  local ok, err = self.db:transaction(function(tx)
    if conv_id ~= nil then
      if not owned(tx, user, conv_id) then missing = true; return true end
      assert(tx:query("UPDATE chat_conversations SET updated_at = now() WHERE id = $1", { conv_id }))
    else
      conv_id = job_ids.new_id("c")
      assert(tx:query("INSERT INTO chat_conversations (id, user_id, title) VALUES ($1, $2, $3)",
        { conv_id, user, title_of(m.message) }))
    end
    assert(tx:query([[INSERT INTO chat_messages (job_id, conversation_id, content, context, script)
                      VALUES ($1, $2, $3, $4::jsonb, $5)]],
      { job_id, conv_id, m.message, m.context and json.encode(m.context) or pg.null, script }))
    return true
  end)
  if missing then return nil, 404, "conversation '" .. tostring(m.conversation_id) .. "' not found" end
  if ok == nil then return nil, 503, "the message could not be stored: " .. error_message(err) end
  local input = { message = m.message, context = m.context }
  local jid, qerr = self.client:submit { job_id = job_id, thread_id = conv_id, user_id = user,
                                         script = script, input = input }
  if not jid then
    self.db:query("DELETE FROM chat_messages WHERE job_id = $1", { job_id })
    return nil, 503, "the job queue is unreachable: " .. error_message(qerr)
  end
  return { job_id = job_id, conversation_id = conv_id, status = "queued" }
end

---------------------------------------------------------------- streams

local Sub = {}
Sub.__index = Sub

-- next(timeout) -> events after the last one given ({id, type, data =
-- JSON text}), {} after `timeout` seconds without one | nil, err
-- A finished job whose events have expired (the workers' --events-ttl):
-- nil, why | false (it may still come). A result stored less than
-- EVENTS_GRACE seconds ago does not count: a worker writes the last events
-- after the result, and may not have written the first ones yet either.
_M.EVENTS_GRACE = 10

function Sub:_expired()
  if self.redis:call("EXISTS", self.key) ~= 0 then return false end
  local rows = self.db:query([[SELECT 1 FROM job_results
                               WHERE job_id = $1 AND created_at < now() - make_interval(secs => $2)]],
    { self.job_id, _M.EVENTS_GRACE })
  if rows and rows[1] then
    return "expired; the answer is in the conversation (GET /chat/conversations/" .. self.conversation_id .. ")"
  end
  return false
end

function Sub:next(timeout)
  if not self.checked then
    self.checked = true
    local why = self:_expired()
    if why then return nil, why end
  end
  local block = math_max(1, math_floor((timeout or 15) * 1000))
  local res, err = self.redis:call("XREAD", "COUNT", 256, "BLOCK", block, "STREAMS", self.key, self.last)
  if res == nil and err ~= nil then return nil, err end
  local out = {}
  if type(res) == "table" and res[1] then
    for _, e in ipairs(res[1][2]) do
      local ev = events.to_event(e)
      self.last = ev.id
      out[#out + 1] = { id = ev.id, type = ev.type, data = ev.raw or "{}" }
      if ev.type == "done" then break end
    end
    return out
  end
  -- nothing for a while: the events may have expired meanwhile
  local why = self:_expired()
  if why then return nil, why end
  return out
end

-- subscribe(user, job_id, last_id) -> sub | nil, status, message.
-- Event ids are the Redis stream's entry ids ("1718429400000-3").
function B:subscribe(user, job_id, last_id)
  local last = "0-0"
  if last_id ~= nil and last_id ~= "" then
    if not last_id:find("^%d+%-%d+$") then
      return nil, 400, "Last-Event-ID must be the id of an event of this stream (like 1718429400000-3)"
    end
    last = last_id
  end
  if type(job_id) ~= "string" or not ids.valid(job_id) then
    return nil, 404, "job '" .. tostring(job_id) .. "' not found"
  end
  local rows, err = self.db:query([[SELECT m.conversation_id FROM chat_messages m
                                    JOIN chat_conversations c ON c.id = m.conversation_id
                                    WHERE m.job_id = $1 AND c.user_id = $2]], { job_id, user })
  if not rows then return nil, 503, "the job could not be looked up: " .. error_message(err) end
  if not rows[1] then return nil, 404, "job '" .. job_id .. "' not found" end
  return setmetatable({ redis = self.redis, db = self.db, key = self.client:events_key(job_id), last = last,
                        job_id = job_id, conversation_id = rows[1].conversation_id }, Sub)
end

---------------------------------------------------------------- conversations

local function iso(v)
  return type(v) == "string" and v or json.null
end

-- conversations(user, {limit, offset}) -> { items, total, limit, offset, next_offset }
function B:conversations(user, page)
  local rows, err = self.db:query([[
    SELECT c.id, c.title, to_json(c.created_at)#>>'{}' AS created_at,
           to_json(c.updated_at)#>>'{}' AS updated_at,
           (SELECT count(*) + count(r.job_id) FROM chat_messages m LEFT JOIN job_results r ON r.job_id = m.job_id
             WHERE m.conversation_id = c.id)::int AS messages,
           (SELECT coalesce(r.answer, m.content) FROM chat_messages m LEFT JOIN job_results r ON r.job_id = m.job_id
             WHERE m.conversation_id = c.id ORDER BY m.created_at DESC, m.job_id DESC LIMIT 1) AS last_message,
           count(*) OVER ()::int AS total
      FROM chat_conversations c WHERE c.user_id = $1
     ORDER BY c.updated_at DESC, c.id DESC LIMIT $2 OFFSET $3]], { user, page.limit, page.offset })
  if not rows then return nil, 503, "the conversations could not be read: " .. error_message(err) end
  local total = rows[1] and rows[1].total
  if not total then
    local c = self.db:query("SELECT count(*)::int AS n FROM chat_conversations WHERE user_id = $1", { user })
    total = c and c[1] and c[1].n or 0
  end
  local items = json.array()
  for i, r in ipairs(rows) do
    local last = null_to_nil(r.last_message)
    items[i] = { id = r.id, title = r.title, created_at = iso(r.created_at), updated_at = iso(r.updated_at),
                 messages = r.messages, last_message = last and title_of(last) or json.null }
  end
  local off, lim = page.offset, page.limit
  return { items = items, total = total, limit = lim, offset = off,
           next_offset = off + lim < total and off + lim or json.null }
end

-- conversation(user, id) -> the conversation with its messages: each user
-- message, then its answer once a worker has stored one
function B:conversation(user, id)
  if type(id) ~= "string" or not ids.valid(id) then return nil, 404, "conversation '" .. tostring(id) .. "' not found" end
  local c, err = self.db:query([[SELECT id, title, to_json(created_at)#>>'{}' AS created_at,
                                   to_json(updated_at)#>>'{}' AS updated_at
                                   FROM chat_conversations WHERE id = $1 AND user_id = $2]], { id, user })
  if not c then return nil, 503, "the conversation could not be read: " .. error_message(err) end
  if not c[1] then return nil, 404, "conversation '" .. id .. "' not found" end
  local rows
  rows, err = self.db:query([[
    SELECT m.job_id, m.content, m.context::text AS context, to_json(m.created_at)#>>'{}' AS created_at,
           r.status, r.answer, r.error, to_json(r.created_at)#>>'{}' AS answered_at
      FROM chat_messages m LEFT JOIN job_results r ON r.job_id = m.job_id
     WHERE m.conversation_id = $1 ORDER BY m.created_at, m.job_id]], { id })
  if not rows then return nil, 503, "the messages could not be read: " .. error_message(err) end
  local messages = json.array()
  for _, r in ipairs(rows) do
    messages[#messages + 1] = { role = "user", content = r.content, job_id = r.job_id,
                                context = null_to_nil(r.context) and json.decode(r.context) or nil,
                                created_at = iso(r.created_at) }
    local status = null_to_nil(r.status)
    if status then
      messages[#messages + 1] = { role = "assistant", content = null_to_nil(r.answer) or json.null,
                                  job_id = r.job_id, status = status,
                                  error = status == "failed" and public_error.message(null_to_nil(r.error),
                                    "job " .. r.job_id) or nil,
                                  created_at = iso(r.answered_at) }
    end
  end
  local out = c[1]
  local last = messages[#messages]
  out.created_at, out.updated_at = iso(out.created_at), iso(out.updated_at)
  out.messages = messages
  out.message_count = #messages
  out.last_message = last and type(last.content) == "string" and title_of(last.content) or json.null
  return out
end

-- delete(user, id) -> true | nil, status, message (idempotent for the owner
-- of a conversation once deleted: an unknown id answers 404 either way)
function B:delete(user, id)
  if type(id) ~= "string" or not ids.valid(id) then return nil, 404, "conversation '" .. tostring(id) .. "' not found" end
  local found, jobs = false, {}
  local ok, err = self.db:transaction(function(tx)
    if not owned(tx, user, id) then return true end
    found = true
    for _, r in ipairs(assert(tx:query("SELECT job_id FROM chat_messages WHERE conversation_id = $1", { id }))) do
      jobs[#jobs + 1] = r.job_id
    end
    assert(tx:query("DELETE FROM job_results WHERE thread_id = $1", { id }))
    assert(tx:query("DELETE FROM chat_conversations WHERE id = $1", { id }))
    return true
  end)
  if ok == nil then return nil, 503, "the conversation could not be deleted: " .. error_message(err) end
  if not found then return nil, 404, "conversation '" .. id .. "' not found" end
  for _, j in ipairs(jobs) do self.redis:call("DEL", self.client:events_key(j)) end
  -- a run's checkpoints are kept under its job's thread until its result
  -- is stored: only a job still running or stopped has any left
  local saver, serr = self:_saver()
  for _, j in ipairs(jobs) do
    if saver then pcall(saver.delete_thread, saver, checkpointer.thread(j)) end
  end
  if not saver then io.stderr:write("moongraph serve: checkpoints of ", id, " kept: ", tostring(serr), "\n") end
  local env = { redis = self.redis, db = self.db, key = wconfig.key_helper(self.prefix), prefix = self.prefix,
                scratch = {} }
  for _, name in ipairs(self.names) do
    local s = self.scripts:get(name)
    local erase = s and s.hooks.erase
    if erase then
      local eok, eerr = pcall(erase, id, env)
      if not eok then io.stderr:write("moongraph serve: ", name, " erase hook: ", tostring(eerr), "\n") end
    end
  end
  return true
end

return _M
