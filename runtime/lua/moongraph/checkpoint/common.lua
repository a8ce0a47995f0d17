--[[
moongraph.checkpoint.common — argument checks shared by the savers.
]]

local type, error, tostring = type, error, tostring

local _M = {}

function _M.check_cfg(cfg, fname)
  if type(cfg) ~= "table" then
    error("bad argument #1 to '" .. fname .. "': config table expected, got " .. type(cfg), 3)
  end
  if cfg.thread_id == nil then
    error("bad argument #1 to '" .. fname .. "': config.thread_id is required", 3)
  end
  if type(cfg.thread_id) ~= "string" then cfg.thread_id = tostring(cfg.thread_id) end
  if cfg.checkpoint_ns ~= nil and type(cfg.checkpoint_ns) ~= "string" then
    error("bad argument #1 to '" .. fname .. "': config.checkpoint_ns must be a string", 3)
  end
  if cfg.checkpoint_id ~= nil and type(cfg.checkpoint_id) ~= "string" then
    error("bad argument #1 to '" .. fname .. "': config.checkpoint_id must be a string", 3)
  end
end

-- list options -> limit, before (a checkpoint id)
function _M.list_opts(opts)
  if opts == nil then return nil, nil end
  if type(opts) ~= "table" then
    error("bad argument #2 to 'list': options table expected, got " .. type(opts), 3)
  end
  local limit, before = opts.limit, opts.before
  if limit ~= nil and (type(limit) ~= "number" or limit < 1) then
    error("bad argument #2 to 'list': limit must be a positive number", 3)
  end
  if type(before) == "table" then before = before.checkpoint_id end
  if before ~= nil and type(before) ~= "string" then
    error("bad argument #2 to 'list': before must be a checkpoint id or a config", 3)
  end
  return limit, before
end

return _M
