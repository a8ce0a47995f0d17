-- The Eco² chat pipeline's hooks for `moongraph worker` (docs/worker.md):
-- its conversation memory in three tiers and its own schema.
--
--   L1  Redis     PREFIX:memory:<thread_id> (+ :recent): the thread's turn, last
--                 intent, location, summary and recent messages
--   L2  Postgres  conversations, messages (scripts/eco/memory.lua), and the
--                 user's profile in the Store: namespace {"eco", "users",
--                 user_id}, key "profile" (scripts/eco/profile.lua)
--   L3  the run's state, checkpointed by the worker while the job runs
--
-- A job's input is { message = "...", context = { user_location = "..." } (optional) }
-- (jobs of earlier versions: { message, user_location })
-- and its user_id is required (the memory keeps a profile per user). A new
-- run gets the message, the location (the job's, else the user's last
-- known), and from memory: intent (the previous turn's, which feeds the
-- router's transition boost), turn, messages (recent turns) and summary.
-- An answered turn is written to L2 in the transaction that stores the
-- result, then to L1; the stored state leaves out messages and summary
-- (those are memory), and the answer event carries the turn's intent.
--
-- Settings (environment): MOONGRAPH_MEMORY_TTL (seconds L1 lives after a
-- thread's last turn, default 86400), MOONGRAPH_MEMORY_RECENT (messages kept
-- in L1 and given to the pipeline, default 12).
--
--   -- scripts/eco/chat.lua
--   _M.worker = require "scripts.eco.worker"
local memory = require "scripts.eco.memory"
local json = require "moongraph.json"
local store_mod = require "moongraph.store"

local type, tostring, tonumber, pairs, error = type, tostring, tonumber, pairs, error
local math_tointeger = math.tointeger

local _M = {
  scope = "eco",
  migrations = memory.migrations,
}

local MAX_MESSAGE = 64 * 1024

local function setting(name, default, min)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  local n = math_tointeger(tonumber(v))
  if not n or n < min then
    error(name .. ": a whole number of at least " .. min .. " expected, got '" .. v .. "'", 0)
  end
  return n
end

local TTL = setting("MOONGRAPH_MEMORY_TTL", 86400, 1)
local RECENT = setting("MOONGRAPH_MEMORY_RECENT", 12, 0)

local function absent(v) return v == nil or v == json.null end

-- One Store per database pool: a store checks its schema on first use only.
local stores = setmetatable({}, { __mode = "k" })

local function mem_of(env)
  local s = stores[env.db]
  if not s then
    s = store_mod.postgres(env.db)
    stores[env.db] = s
  end
  return memory.new { redis = env.redis, db = env.db, store = s, key = env.key, ttl = TTL, recent = RECENT,
                      log = env.log }
end

-- The memory, read along with the worker's claim of the thread (one round
-- trip): L1, checked against L2's turn, or L2 when L1 does not have the
-- thread. The input hook finds it in env.scratch.
function _M.prefetch(job, env)
  if job.user_id == nil or type(job.thread_id) ~= "string" then return nil end
  local reads = mem_of(env):prefetch(job.thread_id, job.user_id)
  if not reads then return nil end
  return function(tx)
    local after = reads(tx)
    return function()
      -- (nil: L1 is behind L2; the input hook reads L2 and replaces L1)
      env.scratch.prefetched = after() or false
    end
  end
end

-- The run's input: the message, the location and what memory knows. A job
-- the pipeline cannot answer is refused (raised); a memory that cannot be
-- read leaves the job for a later attempt (nil, err).
function _M.input(job, env)
  local inp = job.input
  local m = inp.message
  if absent(m) then error("input.message is missing (the user's message)", 0) end
  if type(m) ~= "string" then error("input.message must be a string", 0) end
  if not m:find("%S") then error("input.message is empty", 0) end
  if #m > MAX_MESSAGE then error("input.message is longer than " .. MAX_MESSAGE .. " bytes", 0) end
  -- the location comes in the message's context (the Chat API's
  -- `context`); jobs of earlier versions have it in the input itself
  local ctx = inp.context
  if not absent(ctx) and type(ctx) ~= "table" then error("input.context must be an object", 0) end
  local loc = type(ctx) == "table" and ctx.user_location
  if absent(loc) or loc == false then loc = inp.user_location end
  if absent(loc) or loc == "" then
    loc = nil
  elseif type(loc) ~= "string" then
    error("input.context.user_location must be a string", 0)
  end
  if job.user_id == nil then
    error("user_id is required (the conversation memory keeps a profile per user)", 0)
  end
  local memory_tiers = mem_of(env)
  local mem, err = env.scratch.prefetched, nil
  if mem then
    -- read with the claim from L2: L1 gets it, as after a load
    memory_tiers:warm(job.thread_id, mem)
  else
    mem, err = memory_tiers:load(job.thread_id, job.user_id, mem == false)
    if not mem then return nil, "memory: " .. tostring(err) end
  end
  env.scratch.memory = mem
  local input = { message = m, user_location = loc or mem.location }
  if mem.intent ~= nil then input.intent = mem.intent end
  if mem.turn and mem.turn > 0 then input.turn = mem.turn end
  if mem.messages and #mem.messages > 0 then input.messages = mem.messages end
  if mem.summary ~= nil then input.summary = mem.summary end
  return input
end

-- The answer, the state without the memory keys, the intent for the answer event.
function _M.result(state)
  local answer = state.answer
  if answer ~= nil and type(answer) ~= "string" then answer = tostring(answer) end
  local keep = {}
  for k, v in pairs(state) do
    if k ~= "messages" and k ~= "summary" then keep[k] = v end
  end
  return { answer = answer, state = keep,
           event = { intent = type(state.intent) == "string" and state.intent or nil } }
end

-- An answered turn into L2 and the user's profile, in the worker's
-- transaction (once per job: a redelivered job counts once).
function _M.record(tx, job, state, result, env)
  if result.status ~= "done" or job.user_id == nil then return true end
  local before = env.scratch.memory
  local input = job.input
  local t = {
    thread_id = job.thread_id, user_id = job.user_id, job_id = job.job_id,
    turn = math_tointeger(state.turn) or ((before and before.turn or 0) + 1),
    intent = type(state.intent) == "string" and state.intent or nil,
    location = type(state.user_location) == "string" and state.user_location
      or (type(input.user_location) == "string" and input.user_location ~= "" and input.user_location or nil),
    summary = type(state.summary) == "table" and state.summary or nil,
    message = type(state.message) == "string" and state.message or tostring(input.message),
    answer = result.answer,
  }
  env.scratch.turn = t
  return mem_of(env):record(tx, t)
end

-- After the commit: L1 becomes the memory after this turn when this
-- delivery read it; otherwise (a resumed run, a failed one) it is dropped
-- and the next turn reads L2.
function _M.committed(job, _, result, env)
  local mem = mem_of(env)
  local t, before = env.scratch.turn, env.scratch.memory
  if result.status == "done" and t and before then
    return mem:cache(job.thread_id, memory.after(before, t))
  end
  return mem:invalidate(job.thread_id)
end

-- A duplicate delivery: the turn was stored by an earlier one; drop L1.
function _M.forget(job, env)
  return mem_of(env):invalidate(job.thread_id)
end

-- A conversation deleted (the Chat API's distributed backend): its memory.
function _M.erase(thread_id, env)
  return mem_of(env):erase(thread_id)
end

return _M
