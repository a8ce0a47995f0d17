-- The Eco² chat pipeline's conversation memory, in two tiers (the worker
-- reaches it through the hooks in scripts/eco/worker.lua).
--
--   L1  Redis     PREFIX:memory:<thread_id>          hash: turn, intent, location, summary
--                 PREFIX:memory:<thread_id>:recent   list: the last messages (JSON)
--                 both expire `ttl` seconds (24 h) after the thread's last turn
--   L2  Postgres  conversations (turn, last intent, summary), messages (the
--                 full history)
--   the user's profile (last location, intent counts, turns) is an item of
--   the Store on the same database (scripts/eco/profile.lua)
--
-- (The third tier is the run's own state, checkpointed while a job runs.)
--
--   local mem = memory.new{ redis = r, db = pool, store = mg.store.postgres(pool),
--                           key = env.key, ttl = 86400, recent = 12 }
--     -- key(...) -> "PREFIX:a:b" (the worker's key helper; default prefix "moongraph")
--   local m, err = mem:load(thread_id, user_id)
--     -- m = { source = "redis"|"postgres"|"new", turn, intent, location, summary,
--     --       messages = { {role, content, turn, intent}, ... } }   oldest first
--   local reads = mem:prefetch(thread_id, user_id)   -- read with the worker's claim:
--     -- reads(tx) -> after(), after() -> m | nil (L1 is behind L2:
--     -- load(thread_id, user_id, true) reads L2)
--   mem:record(tx, turn_record)      -- inside the transaction that stores the result
--   mem:cache(thread_id, m)          -- write L1 (idempotent)
--   mem:warm(thread_id, m)           -- write L1 when m was read from L2
--   mem:invalidate(thread_id)
--
-- load reads L1, used when L2's conversation is at L1's turn, and falls
-- back to L2 (warming L1) when L1 has nothing, is behind L2 (a turn
-- committed that L1 did not get) or Redis is unreachable; a Postgres
-- failure is returned as nil, err.

local pg = require "moongraph.pg"
local store_mod = require "moongraph.store"
local profile = require "scripts.eco.profile"
local json = require "moongraph.json"
local cjson = require("cjson.safe").new()

local type, tostring, tonumber, ipairs, setmetatable, pcall =
  type, tostring, tonumber, ipairs, setmetatable, pcall

local _M = {}
local Mem = {}
Mem.__index = Mem

-- The L2 schema, versioned (applied by the worker in the scope "eco").
-- Version 1 is safe on a database that already has these tables: they were
-- created, identically, by the worker itself before the memory became this
-- application's. Its user_profiles table is no longer written: version 2
-- copies its rows into the Store, where profiles are kept since (the table
-- stays, with what it held).
_M.migrations = {
  {
    version = 1,
    name = "conversation memory and user profiles",
    sql = [[
CREATE TABLE IF NOT EXISTS conversations (
  thread_id   text PRIMARY KEY,
  user_id     text NOT NULL,
  turn        integer NOT NULL DEFAULT 0,
  last_intent text,
  summary     jsonb,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS messages (
  id         bigserial PRIMARY KEY,
  thread_id  text NOT NULL REFERENCES conversations (thread_id) ON DELETE CASCADE,
  turn       integer NOT NULL,
  role       text NOT NULL,
  content    text NOT NULL,
  intent     text,
  job_id     text,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS messages_thread ON messages (thread_id, id);
CREATE UNIQUE INDEX IF NOT EXISTS messages_job_role ON messages (job_id, role);
CREATE TABLE IF NOT EXISTS user_profiles (
  user_id     text PRIMARY KEY,
  location    text,
  turns       integer NOT NULL DEFAULT 0,
  last_intent text,
  intents     jsonb NOT NULL DEFAULT '{}'::jsonb,
  first_seen  timestamptz NOT NULL DEFAULT now(),
  last_seen   timestamptz NOT NULL DEFAULT now()
);
]],
  },
  {
    version = 2,
    name = "user profiles in the Store",
    run = function(tx)
      local n, err = profile.import(tx)
      if not n then return nil, err end
      return true
    end,
  },
  {
    -- a turn's messages go in with their conversation row, in one
    -- transaction, and erase deletes both: the key check (a lock on the
    -- conversation row per message) only made each turn's insert cost twice
    version = 3,
    name = "messages without a foreign key",
    sql = [[
DO $$
DECLARE c record;
BEGIN
  FOR c IN SELECT conname FROM pg_constraint
           WHERE conrelid = 'messages'::regclass AND contype = 'f' LOOP
    EXECUTE format('ALTER TABLE messages DROP CONSTRAINT %I', c.conname);
  END LOOP;
END $$;
]],
  },
}

local function default_key(...)
  return table.concat({ "moongraph", ... }, ":")
end

function _M.new(opts)
  return setmetatable({
    redis = opts.redis, db = opts.db, keyf = opts.key or default_key,
    store = opts.store or store_mod.postgres(opts.db),
    ttl = opts.ttl or 86400, recent = opts.recent or 12, log = opts.log,
  }, Mem)
end

function Mem:key(thread_id)
  return self.keyf("memory", thread_id)
end

local function nz(v)
  if v == nil or v == pg.null or v == cjson.null then return nil end
  return v
end

local function decode_json(text)
  if type(text) ~= "string" or text == "" then return nil end
  local ok, v = pcall(json.decode, text)
  if ok then return v end
  return nil
end

-- L1 only: m or nil (nothing cached) | nil, err
function Mem:load_l1(thread_id)
  local key = self:key(thread_id)
  local res, err = self.redis:pipeline {
    { "HGETALL", key },
    { "LRANGE", key .. ":recent", 0, -1 },
  }
  if not res then return nil, err end
  local h, list = res[1], res[2]
  if type(h) ~= "table" or h[1] == false then return nil, tostring(h and h[2]) end
  if h[1] == nil then return nil end
  local f = {}
  for i = 1, #h - 1, 2 do f[h[i]] = h[i + 1] end
  if not f.turn then return nil end
  local msgs = {}
  if type(list) == "table" and list[1] ~= false then
    for _, s in ipairs(list) do
      local m = decode_json(s)
      if type(m) == "table" then msgs[#msgs + 1] = m end
    end
  end
  return {
    source = "redis", turn = math.tointeger(tonumber(f.turn)) or 0,
    intent = f.intent ~= "" and f.intent or nil,
    location = f.location ~= "" and f.location or nil,
    summary = decode_json(f.summary), messages = msgs,
  }
end

-- The L2 reads on tx, which they end: the conversation with its recent
-- messages (one statement, sent ahead) and the user's profile (a Store
-- read: the round trip that carries what tx sent, and its COMMIT) -> m
-- (source "postgres", or "new" for an unknown thread) | raises.
local LOAD = [[
SELECT c.turn, c.last_intent, c.summary::text AS summary,
  (SELECT json_agg(json_build_array(m.role, m.content, m.turn, m.intent) ORDER BY m.id)::text
   FROM (SELECT id, role, content, turn, intent FROM messages WHERE thread_id = $1
         ORDER BY id DESC LIMIT $2) AS m) AS recent
FROM conversations c WHERE c.thread_id = $1]]

local NO_REFRESH = { refresh_ttl = false }

local function read_l2(self, tx, thread_id, user_id)
  local view, err = self.store:with(tx)   -- (its first use reads the Store's schema on tx: a round trip then)
  if not view then error(err, 0) end
  tx:commit_with_next()
  local conversation
  conversation, err = tx:defer(LOAD, { thread_id, self.recent })
  if not conversation then error(err, 0) end
  local p
  p, err = profile.get(view, user_id, NO_REFRESH)
  if err then error(err, 0) end
  local rows
  rows, err = conversation()
  if not rows then error(err, 0) end
  local r = rows[1] or {}
  local m = {
    source = nz(r.turn) and "postgres" or "new",
    turn = nz(r.turn) or 0, intent = nz(r.last_intent), location = p and p.last_location,
    summary = decode_json(nz(r.summary)), messages = {},
  }
  local recent = decode_json(nz(r.recent))
  if type(recent) == "table" then
    for i = 1, #recent do
      local x = recent[i]
      m.messages[i] = { role = x[1], content = x[2], turn = x[3], intent = nz(x[4]) }
    end
  end
  return m
end

-- L2 only: m | nil, err. One transaction, one round trip.
function Mem:load_l2(thread_id, user_id)
  return self.db:transaction(function(tx) return read_l2(self, tx, thread_id, user_id) end)
end

--[[ prefetch(thread_id, user_id) -> reads(tx) -> after() | nil: the memory
read along with the worker's claim of the thread (the script's prefetch
hook). L1 is read first, before the claim; then `reads`, in the claim's
transaction, after the claim, either checks that L2 is at L1's turn (L1
has the thread) or reads L2 (it has not), in the claim's round trip.
after() -> m, or nil when L1 is behind L2 (a turn committed by an earlier
holder of the thread that L1 did not get): the input hook then reads L2
itself. nil (nothing prefetched) when Redis is away. ]]
local CHECK_TURN = "SELECT turn FROM conversations WHERE thread_id = $1"

-- L2's turn of the thread from CHECK_TURN's rows (0: none)
local function turn_of(rows)
  return rows[1] and nz(rows[1].turn) or 0
end

function Mem:prefetch(thread_id, user_id)
  local l1, err = self:load_l1(thread_id)
  if err then return nil end
  if l1 then
    return function(tx)
      local check, derr = tx:defer(CHECK_TURN, { thread_id })
      if not check then error(derr, 0) end
      return function()
        local rows, cerr = check()
        if not rows then error(cerr, 0) end
        if turn_of(rows) ~= l1.turn then return nil end
        return l1
      end
    end
  end
  return function(tx)
    local m = read_l2(self, tx, thread_id, user_id)
    return function() return m end
  end
end

-- L2's turn of the thread (0: none) | nil, err
function Mem:l2_turn(thread_id)
  local rows, err = self.db:query(CHECK_TURN, { thread_id })
  if not rows then return nil, err end
  return turn_of(rows)
end

function Mem:load(thread_id, user_id, skip_l1)
  local m, err
  if not skip_l1 then
    m, err = self:load_l1(thread_id)
    if m then
      local turn, terr = self:l2_turn(thread_id)
      if not turn then return nil, terr end
      if turn == m.turn then return m end
    elseif err and self.log then
      self.log:warn("memory: Redis unavailable, reading Postgres", { thread_id = thread_id, error = tostring(err) })
    end
  end
  m, err = self:load_l2(thread_id, user_id)
  if not m then return nil, err end
  self:warm(thread_id, m)
  return m
end

-- warm(thread_id, m): L1 gets a memory read from L2 (a thread L2 does not
-- know stays out of it) -> true | nil, err
function Mem:warm(thread_id, m)
  if m.source ~= "postgres" then return true end
  return self:cache(thread_id, m)
end

-- cache(thread_id, m): replace L1 with m (turn, intent, location, summary,
-- messages; only the last `recent` messages are kept).
function Mem:cache(thread_id, m)
  local key = self:key(thread_id)
  local cmds = { { "MULTI" }, { "DEL", key, key .. ":recent" } }
  local msgs = m.messages or {}
  local first = math.max(1, #msgs - self.recent + 1)
  if #msgs >= first and self.recent > 0 then
    local push = { "RPUSH", key .. ":recent" }
    for i = first, #msgs do
      local x = msgs[i]
      push[#push + 1] = cjson.encode { role = x.role, content = x.content, turn = x.turn, intent = x.intent }
    end
    cmds[#cmds + 1] = push
    cmds[#cmds + 1] = { "EXPIRE", key .. ":recent", self.ttl }
  end
  local summary = m.summary and json.encode(m.summary) or ""
  cmds[#cmds + 1] = { "HSET", key, "turn", m.turn or 0, "intent", m.intent or "",
                      "location", m.location or "", "summary", summary }
  cmds[#cmds + 1] = { "EXPIRE", key, self.ttl }
  cmds[#cmds + 1] = { "EXEC" }
  local res, err = self.redis:pipeline(cmds)
  if not res then return nil, err end
  local exec = res[#res]
  if type(exec) ~= "table" or exec[1] == false then
    return nil, "memory cache failed: " .. tostring(exec and exec[2])
  end
  return true
end

function Mem:invalidate(thread_id)
  local key = self:key(thread_id)
  return self.redis:call("DEL", key, key .. ":recent")
end

-- erase(thread_id): the conversation's memory, its messages with it, gone
-- from both tiers -> true | nil, err
function Mem:erase(thread_id)
  local ok, err = self.db:transaction(function(tx)
    local sent, serr = tx:send("DELETE FROM messages WHERE thread_id = $1", { thread_id })
    if not sent then error(serr, 0) end
    local r, qerr = tx:query("DELETE FROM conversations WHERE thread_id = $1", { thread_id })
    if not r then error(qerr, 0) end
    return true
  end)
  if not ok then return nil, err end
  ok, err = self:invalidate(thread_id)
  if ok == nil and err ~= nil then return nil, err end
  return true
end

local function arg(v)
  if v == nil then return pg.null end
  return v
end

-- record(tx, t): the turn `t` into L2, inside the caller's transaction.
-- t = { thread_id, user_id, job_id, turn, intent, location, summary,
--       message, answer }
function Mem:record(tx, t)
  local summary = t.summary and json.encode(t.summary) or nil
  -- the conversation and the turn's two messages in one statement, sent
  -- with the transaction's next one (tx:send)
  local ok, err = tx:send([[
WITH c AS (
  INSERT INTO conversations (thread_id, user_id, turn, last_intent, summary)
  VALUES ($1, $2, $3, $4, $5::jsonb)
  ON CONFLICT (thread_id) DO UPDATE SET
    turn = GREATEST(conversations.turn, EXCLUDED.turn),
    last_intent = COALESCE(EXCLUDED.last_intent, conversations.last_intent),
    summary = COALESCE(EXCLUDED.summary, conversations.summary),
    updated_at = now()
)
INSERT INTO messages (thread_id, turn, role, content, intent, job_id)
VALUES ($1, $3, 'user', $6, $4, $7), ($1, $3, 'assistant', $8, $4, $7)
ON CONFLICT DO NOTHING]], { t.thread_id, t.user_id, t.turn, arg(t.intent), arg(summary), t.message, t.job_id,
    t.answer or "" })
  if not ok then return nil, err end
  -- the profile through the Store on tx: a patch (the turn's counts added
  -- where the profile is kept, no read), sent with tx's next statement;
  -- the Store's table stays the Store's
  local view
  view, err = self.store:with(tx)
  if not view then return nil, err end
  ok, err = profile.record(view, t.user_id, { location = t.location, intent = t.intent })
  if not ok then return nil, err end
  return true
end

-- The memory after turn t, given the memory m it started from.
function _M.after(m, t)
  local msgs = {}
  for _, x in ipairs(m.messages or {}) do msgs[#msgs + 1] = x end
  msgs[#msgs + 1] = { role = "user", content = t.message, turn = t.turn, intent = t.intent }
  msgs[#msgs + 1] = { role = "assistant", content = t.answer or "", turn = t.turn, intent = t.intent }
  return {
    turn = t.turn, intent = t.intent or m.intent, location = t.location or m.location,
    summary = t.summary or m.summary, messages = msgs,
  }
end

-- The user's profile (scripts/eco/profile.lua) | nil | nil, err
function Mem:profile(user_id)
  return profile.get(self.store, user_id)
end

return _M
