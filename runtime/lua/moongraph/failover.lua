-- moongraph.failover: pick one candidate per call with a router function, and
-- fail over to another when the chosen one fails before producing output.
-- Routed LLMs (llm.routed) and routed agents share it.
--
--   local failover = require "moongraph.failover"
--   local res, key = failover.route{
--     candidates = { primary = a, fallback = b },   -- or a list (keys: item.name)
--     router = function(candidates, context, error_ctx) return "primary" end,
--     context = ctx,
--     call = function(key, candidate, emitted) ... return result | nil, err end,
--   }
--
-- Rules:
--   * the router is first called as router(candidates, context), without
--     error_ctx; it returns a key, or nil to route nowhere. Without a router,
--     keys are tried in order (the list order, or sorted keys for a map);
--   * when the chosen candidate fails (returns nil, err or raises) before it
--     calls emitted(), the router is called again with
--     error_ctx = { failed_keys = {key = true, ...}, last_error = err }
--     (failed_keys is a fresh copy on every call: the router may keep or
--     change it);
--   * a failure after emitted() was called propagates at once: output already
--     went out, so no other candidate may run;
--   * a key that already failed cannot be chosen again: choosing one ends
--     routing with the last error, and so does a router returning nil;
--   * a key that is not a candidate raises an error listing the valid keys;
--   * the routing's result is the candidate's result and the key that
--     produced it; a final failure is returned as nil, err, or raised again
--     when the candidate raised it.
-- The router may yield (e.g. call a classifier model).
--
-- Options besides candidates (or map + order), router, context and call:
--   ok_flag = true       call returns true, ... on success and false, err on
--                        failure, so a candidate may succeed with nil; route
--                        then returns true, key, ... or false, err
--   pass_through = true  graph interrupts (ctx.interrupt) raised by a
--                        candidate are raised again at once, untouched: they
--                        are control flow, not failures; a function(err) ->
--                        boolean picks the errors to let through instead
--   name, what           how error messages name the routing and its
--                        candidates ("routed agent 'desk'", "agents")

local type, pairs, ipairs, error, pcall, tostring, select, getmetatable =
      type, pairs, ipairs, error, pcall, tostring, select, getmetatable
local table_sort, table_pack, table_unpack, table_concat =
      table.sort, table.pack, table.unpack, table.concat

local control = require "moongraph.control"

local _M = {}

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

-- Turn a list (keyed by each item's `name`) or a map into (map, ordered keys).
function _M.normalize(candidates, what)
  what = what or "candidates"
  if type(candidates) ~= "table" then
    error("bad argument: " .. what .. " must be a table", 3)
  end
  local map, order = {}, {}
  if #candidates > 0 then
    for i, item in ipairs(candidates) do
      local name = type(item) == "table" and item.name
      if type(name) ~= "string" or name == "" then
        error("bad argument: " .. what .. "[" .. i .. "] has no name to use as its key", 3)
      end
      if map[name] then
        error("bad argument: " .. what .. " has two items named '" .. name .. "'", 3)
      end
      map[name] = item
      order[#order + 1] = name
    end
  else
    for k, v in pairs(candidates) do
      if type(k) ~= "string" then
        error("bad argument: " .. what .. " keys must be strings", 3)
      end
      map[k] = v
      order[#order + 1] = k
    end
    table_sort(order)
  end
  if #order == 0 then error("bad argument: " .. what .. " is empty", 3) end
  return map, order
end

-- The router used when none is given: the first key (in order) not failed.
function _M.in_order(order)
  return function(_, _, error_ctx)
    local failed = error_ctx and error_ctx.failed_keys or {}
    for _, k in ipairs(order) do
      if not failed[k] then return k end
    end
    return nil
  end
end

local function finish(failure, ok_flag)
  if failure.raised then error(failure.err, 0) end
  if ok_flag then return false, failure.err end
  return nil, failure.err
end

local function unknown_key(opts, map, key)
  local keys = {}
  for k in pairs(map) do keys[#keys + 1] = tostring(k) end
  table_sort(keys)
  error((opts.name and (opts.name .. ": ") or "") .. "the router returned '" .. tostring(key) ..
    "', which is not one of its " .. (opts.what or "candidates") ..
    " (" .. table_concat(keys, ", ") .. ")", 0)
end

function _M.route(opts)
  local map, order = opts.map, opts.order
  if not map then map, order = _M.normalize(opts.candidates, opts.what) end
  local router = opts.router or _M.in_order(order)
  local call = opts.call
  if not is_callable(router) then error("bad argument: router must be a function", 2) end
  if not is_callable(call) then error("bad argument: call must be a function", 2) end
  local ok_flag = opts.ok_flag
  local pass = opts.pass_through
  if pass == true then
    pass = control.is_interrupt
  elseif pass ~= nil and pass ~= false and not is_callable(pass) then
    error("bad argument: pass_through must be true or a function", 2)
  end

  local failed_keys, failure = {}, nil
  while true do
    local key
    if failure then
      local copy = {}
      for k in pairs(failed_keys) do copy[k] = true end
      key = router(map, opts.context, { failed_keys = copy, last_error = failure.err })
    else
      key = router(map, opts.context)
    end
    if key == nil then
      if not failure then
        if ok_flag then return false, "router chose no candidate" end
        return nil, "router chose no candidate"
      end
      return finish(failure, ok_flag)
    end
    if failed_keys[key] then
      return finish(failure, ok_flag)
    end
    local candidate = map[key]
    if candidate == nil then unknown_key(opts, map, key) end
    local emitted = false
    local function mark() emitted = true end
    local res = table_pack(pcall(call, key, candidate, mark))
    if res[1] then
      if ok_flag then
        if res[2] then return true, key, table_unpack(res, 3, res.n) end
      elseif res[2] ~= nil then
        return res[2], key, select(3, table_unpack(res, 1, res.n))
      end
      failure = { err = res[3] or "candidate '" .. key .. "' failed", raised = false }
    else
      if pass and pass(res[2]) then error(res[2], 0) end
      failure = { err = res[2], raised = true }
    end
    if emitted then return finish(failure, ok_flag) end
    failed_keys[key] = true
  end
end

return _M
