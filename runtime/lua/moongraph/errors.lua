-- moongraph.errors — errors as values with a stable code.
--
--   local errors = require "moongraph.errors"
--   local rows, err = db:query(sql)
--   if not rows then
--     if errors.retryable(err) then ... end          -- waiting can heal it
--     if errors.has(err, "pg:23505") then ... end    -- a unique violation
--   end
--   return nil, errors.new("not_found", "no thread " .. id, { details = { thread_id = id } })
--
-- An error is a table { code, message, retryable, details } that reads like
-- its message (tostring, "..", "%s", err:find...), made where the fact is
-- known (runtime/errors.c). A plain string error (from a script, or Lua's
-- own) has no code: code() gives nil, retryable() false.

local core = require "moongraph.core"

local E = core.errors
local is = E.is
local type = type

local _M = {}

_M.is = is

-- new(code, message [, { retryable = bool, details = table }]) -> err
function _M.new(code, message, opts)
  if type(code) ~= "string" then error("bad argument #1 to 'new' (code string expected)", 2) end
  if type(message) ~= "string" then message = tostring(message) end
  local retryable, details
  if opts ~= nil then
    if type(opts) ~= "table" then error("bad argument #3 to 'new' (options table expected)", 2) end
    retryable, details = opts.retryable, opts.details
  end
  return E.new(code, message, retryable == true, details)
end

function _M.code(err)
  if is(err) then return err.code end
  return nil
end

function _M.retryable(err)
  return is(err) and err.retryable == true
end

-- has(err, code, ...) -> whether err's code is one of them; "pg" or "redis"
-- stands for every code from that server ("pg:40001" has "pg").
function _M.has(err, ...)
  if not is(err) then return false end
  local c = err.code
  for i = 1, select("#", ...) do
    local want = select(i, ...)
    if c == want or (c:sub(1, #want + 1) == want .. ":") then return true end
  end
  return false
end

function _M.details(err)
  return is(err) and err.details or nil
end

-- The message of any error value (a string stays itself).
function _M.message(err)
  if is(err) then return err.message end
  return tostring(err)
end

-- wrap(cause, code, message [, details]) -> err: a new error that keeps the
-- cause (details.cause) and its retryable; code nil: the cause's own code
-- (a plain string cause: "failed").
function _M.wrap(cause, code, message, details)
  details = details or {}
  details.cause = cause
  local c = is(cause)
  return E.new(code or (c and cause.code) or "failed", message, c and cause.retryable == true, details)
end

-- A checkpointer call that failed (returned nil, err or raised): code
-- "checkpointer", the cause kept.
function _M.saver_failed(op, cause)
  return _M.wrap(cause, "checkpointer", "checkpointer " .. op .. " failed: " .. tostring(cause),
    { op = op })
end

-- The first error in a chain of wraps with one of the codes, or nil.
function _M.find(err, ...)
  local seen = 0
  while is(err) and seen < 32 do
    if _M.has(err, ...) then return err end
    err = err.details and err.details.cause
    seen = seen + 1
  end
  return nil
end

return _M
