-- The Eco² user profile, kept in the Store (docs/store.md): one item per
-- user, read when a turn starts and updated when it is answered.
--
--   namespace { "eco", "users", <user_id> }, key "profile"
--   value     { last_location = "서울특별시 강남구",  -- the last location a turn had
--               last_intent = "waste",               -- the last intent a turn had
--               intents = { waste = 3, location = 1 },  -- turns per intent
--               turns = 4 }                          -- answered turns
--
--   local profile = require "scripts.eco.profile"
--   local p, err = profile.get(store, user_id)          -- value | nil | nil, err
--   profile.record(store, user_id, { location =, intent = })   -- one answered turn
--   profile.patch(turn)                                 -- that turn as a Store patch (pure)
--   profile.import(db)                                  -- user_profiles rows into the Store
--
-- record is one s:patch (docs/store.md): the counts are added where the
-- profile is kept, without reading it first, so concurrent turns of one
-- user all count. Given the store on a transaction (s:with(tx)), it is sent
-- with that transaction's next statement and commits or rolls back with it.
-- A count the patch cannot add to (a profile changed by hand or by another
-- tool: a string, a float) is counted again from this turn (the patch's
-- repair option): a damaged profile must not stop its user's turns.

local store_mod = require "moongraph.store"
local pg = require "moongraph.pg"

local type, tostring, pairs, ipairs, math_tointeger = type, tostring, pairs, ipairs, math.tointeger

local _M = {}

_M.KEY = "profile"

function _M.namespace(user_id)
  local id = tostring(user_id)
  if id == "" then error("bad argument #1 to 'namespace' (user id must not be empty)", 2) end
  return { "eco", "users", id }
end

-- get(store, user_id [, opts]) -> profile | nil (an unknown user) | nil, err
-- (opts as the Store's get takes them: refresh_ttl)
function _M.get(store, user_id, opts)
  local item, err = store:get(_M.namespace(user_id), _M.KEY, opts)
  if item then return item.value end
  if err then return nil, err end
  return nil
end

-- One answered turn {location =, intent =} as a patch of the profile
-- (either may be nil: what a turn does not know, the profile keeps).
function _M.patch(turn)
  local set = {}
  if turn.location ~= nil then set.last_location = turn.location end
  local add = { turns = 1 }
  local intent = turn.intent
  if type(intent) == "string" then
    set.last_intent = intent
    add.intents = { [intent] = 1 }
  end
  return { set = set, add = add }
end

-- record(store, user_id, turn) -> true | nil, err
local REPAIR = { repair = true }
function _M.record(store, user_id, turn)
  return store:patch(_M.namespace(user_id), _M.KEY, _M.patch(turn), REPAIR)
end

local function nz(v)
  if v == pg.null then return nil end
  return v
end

-- The profile of a row of the user_profiles table (the schema's first version).
function _M.from_row(r)
  local intents = {}
  if type(nz(r.intents)) == "table" then
    for k, v in pairs(r.intents) do
      local n = math_tointeger(v)
      if n then intents[k] = n end
    end
  end
  return { last_location = nz(r.location), last_intent = nz(r.last_intent), intents = intents,
           turns = math_tointeger(r.turns) or 0 }
end

_M.IMPORT_PAGE = 500

-- import(db) -> number of profiles copied | nil, err: every user_profiles
-- row whose user has no profile in the Store yet, copied into it (on db,
-- a connection or transaction; a profile already in the Store is newer and
-- kept, so running it again copies nothing).
function _M.import(db)
  local store = store_mod.postgres(db)
  local copied, after = 0, ""
  while true do
    local rows, err = db:query([[
SELECT user_id, location, turns, last_intent, intents FROM user_profiles
WHERE user_id > $1 ORDER BY user_id LIMIT $2]], { after, _M.IMPORT_PAGE })
    if not rows then return nil, err end
    if #rows == 0 then return copied end
    local gets = {}
    for i, r in ipairs(rows) do
      if r.user_id ~= "" then
        gets[#gets + 1] = { op = "get", namespace = _M.namespace(r.user_id), key = _M.KEY, refresh_ttl = false }
      end
      after = rows[i].user_id
    end
    local have
    have, err = store:batch(gets)
    if not have then return nil, err end
    local puts, k = {}, 0
    for _, r in ipairs(rows) do
      if r.user_id ~= "" then
        k = k + 1
        if have[k] == nil then
          puts[#puts + 1] = { op = "put", namespace = _M.namespace(r.user_id), key = _M.KEY, value = _M.from_row(r) }
        end
      end
    end
    if #puts > 0 then
      local ok
      ok, err = store:batch(puts)
      if not ok then return nil, err end
      copied = copied + #puts
    end
  end
end

return _M
