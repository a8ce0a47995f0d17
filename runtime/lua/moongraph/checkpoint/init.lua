--[[
moongraph.checkpoint — checkpoint savers (mg.checkpoint).

  mg.checkpoint.memory()                  in-process, for tests and short-lived runs
  mg.checkpoint.file(dir)                 durable JSON files, the embedded default
  mg.checkpoint.redis(url|conn, {ttl})    Redis (docs/databases.md)
  mg.checkpoint.postgres(url|pool, opts)  PostgreSQL, versioned schema
  mg.checkpoint.cached(redis, postgres)   Redis read cache over Postgres

A saver is any table with the five methods of the saver interface
(docs/checkpoints.md): put, put_writes, get, list, delete_thread. The Redis
and Postgres savers implement the same interface.

  mg.checkpoint.settle(saver, thread_id)  wait until the writes of runs of
                                          that thread that were cancelled
                                          with writes on their way have
                                          landed (before deleting or
                                          rewriting the thread by hand)
]]

local _M = {}

function _M.settle(saver, thread_id)
  if type(saver) ~= "table" then
    error("bad argument #1 to 'settle': saver expected, got " .. type(saver), 2)
  end
  if thread_id == nil then
    error("bad argument #2 to 'settle': thread id expected", 2)
  end
  require("moongraph.engine.writer").settle(saver, tostring(thread_id))
end

function _M.memory()
  return require("moongraph.checkpoint.memory").new()
end

function _M.file(dir)
  if type(dir) ~= "string" or dir == "" then
    error("bad argument #1 to 'file': directory path expected, got " .. type(dir), 2)
  end
  return require("moongraph.checkpoint.file").new(dir)
end

-- Tail calls, so an argument error points at the caller's line.
function _M.redis(target, opts)
  return require("moongraph.checkpoint.redis").new(target, opts)
end

function _M.postgres(target, opts)
  return require("moongraph.checkpoint.postgres").new(target, opts)
end

function _M.cached(l1, durable, opts)
  return require("moongraph.checkpoint.cached").new(l1, durable, opts)
end

-- the JSON codec savers use for state (exact numbers, sorted keys)
_M.json = require "moongraph.json"

return _M
