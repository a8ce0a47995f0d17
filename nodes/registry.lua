-- The Eco² nodes by name, for assembling the pipeline:
--   for name, node in pairs(require("nodes.registry").load_all()) do
--     g:add_node(name, node.run, { policy = node.policy, timeout = node.timeout })
--   end
local _M = {}

_M.names = {
  "waste_rag", "character", "location", "bulk_waste", "recyclable_price",
  "collection_point", "web_search", "image_generation", "general", "weather",
  "clarify",
}

-- The pipeline's own nodes around them (scripts/eco/chat.lua), in order.
_M.pipeline = { "intent", "aggregator", "answer", "feedback", "summarize" }

-- Intent -> node name (the router's INTENT_TO_NODE; weather is enrichment
-- only, clarify ends the fallback chain).
_M.intent_to_node = {
  waste = "waste_rag", character = "character", location = "location",
  bulk_waste = "bulk_waste", recyclable_price = "recyclable_price",
  collection_point = "collection_point", web_search = "web_search",
  image_generation = "image_generation", general = "general",
}

function _M.load(name)
  if type(name) ~= "string" then
    error("bad argument #1 to 'load': string expected, got " .. type(name), 2)
  end
  local known = false
  for _, n in ipairs(_M.names) do if n == name then known = true; break end end
  if not known then error(("bad argument #1 to 'load': unknown node '%s'"):format(name), 2) end
  return require("nodes." .. name)
end

function _M.load_all()
  local out = {}
  for _, n in ipairs(_M.names) do out[n] = _M.load(n) end
  return out
end

return _M
