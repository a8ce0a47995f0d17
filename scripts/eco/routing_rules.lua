-- Dynamic routing rules (Eco² chat worker): data for the dynamic router
-- (nodes/lib/dynamic_router.lua), read on every call: change a table here
-- (or at the REPL) and the next route uses it.

local _M = {}

-- Intent -> node that serves it. weather is not an intent a user asks for;
-- it is added by the enrichment rules below.
_M.INTENT_TO_NODE = {
  waste = "waste_rag",                    -- local JSON disposal rules
  character = "character",                -- character service
  location = "location",                  -- place search (zero-waste shops, centres)
  bulk_waste = "bulk_waste",              -- bulk waste (행정안전부)
  recyclable_price = "recyclable_price",  -- recyclable prices (한국환경공단)
  collection_point = "collection_point",  -- collection bins (KECO)
  web_search = "web_search",              -- live web search
  image_generation = "image_generation",  -- image generation
  general = "general",                    -- LLM only
  weather = "weather",                    -- weather (enrichment)
}

-- Intent -> helper nodes added whenever that intent is the primary one.
_M.ENRICHMENT_RULES = {
  waste = {
    intent = "waste",
    enrichments = { "weather" },
    description = "분리배출 질문 시 날씨 팁 추가",
  },
  bulk_waste = {
    intent = "bulk_waste",
    enrichments = { "weather" },
    description = "대형폐기물 질문 시 날씨 팁 추가",
  },
}

-- Nodes added when the state meets a condition. A rule fires when its node
-- is not already chosen, the primary intent is not in exclude_intents, and
-- its condition holds. The condition is either a function(state) -> bool,
-- or the data form used here: every key in `requires` is set in the state
-- (not nil, not JSON null) and the primary intent is not in `unless_intents`.
_M.CONDITIONAL_ENRICHMENTS = {
  {
    name = "user_location->weather",
    node = "weather",
    requires = { "user_location" },
    unless_intents = { "weather", "general", "character" },
    exclude_intents = { "weather", "image_generation" },
    description = "위치 정보가 있고 관련 intent면 날씨 추가",
  },
}

return _M
