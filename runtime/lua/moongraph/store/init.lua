--[[
moongraph.store — long-term memory shared across threads: LangGraph's
BaseStore. Items (tables of fields) live under a namespace (a list of
strings) and a key; nodes reach the graph's store as ctx.store.

  local store = require "moongraph.store"        -- also mg.store
  local s = store.memory{ index =, ttl = }       -- this process only
  local s = store.postgres(url_or_pool, { pool_size =, index =, ttl = })

  s:put(namespace, key, value [, {ttl = minutes | false, index = false | {paths}}])
  s:get(namespace, key [, {refresh_ttl =}])  -> {namespace, key, value, created_at, updated_at} | nil
  s:delete(namespace, key)
  s:search(prefix [, {filter =, query =, limit = 10, offset = 0, refresh_ttl =}]) -> items
  s:list_namespaces{prefix =, suffix =, max_depth =, limit = 100, offset = 0} -> namespaces
  s:update(namespace, key, fn [, {ttl =, index =}]) -> new value | false (fn returned nil)
  s:with(tx) -> the PostgreSQL store on the caller's transaction
  s:batch{ {op = "get", namespace =, key =}, {op = "put", ...}, ... } -> results
  s:sweep() -> number of expired items removed

Runtime failures return nil, err; misuse raises "bad argument ...". See
docs/store.md.
]]

local _M = {}

function _M.memory(opts)
  return require("moongraph.store.memory").new(opts)
end

function _M.postgres(target, opts)
  return require("moongraph.store.postgres").new(target, opts)
end

return _M
