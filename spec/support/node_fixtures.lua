-- Loads recorded upstream responses from spec/fixtures/ (decoded or raw)
-- and builds node contexts that pin every adapter offline.
local cjson = require "cjson"

local _M = {}

function _M.raw(name)
  local f = assert(io.open("spec/fixtures/" .. name, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

function _M.load(name)
  return cjson.decode(_M.raw(name))
end

-- Every service explicitly without URL and key, so specs do not depend on
-- the caller's environment. extra: more config (llm, clock, services).
function _M.offline_ctx(extra)
  local cfg = {}
  for _, s in ipairs({ "kakao", "kma", "tavily", "image", "character", "bulk_waste",
                       "recyclable_price", "collection_point" }) do
    cfg[s] = { base_url = "", api_key = "" }
  end
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return { config = cfg }
end

return _M
