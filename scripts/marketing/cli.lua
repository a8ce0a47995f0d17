-- The `marketing` command: one conversation turn of the store-marketing
-- pipeline. Shared by `moongraph marketing` and scripts/marketing/run.lua.
--
--   marketing [--store NAME] [--thread ID] [--json] [QUERY]
--
-- Without --thread a new thread is started and its id printed. When the
-- turn ends in a question (several stores match), answer it with the same
-- --thread and --store NAME (or the number as QUERY). Threads live in
-- MARKETING_CHECKPOINT_DIR (default .moongraph/marketing), so the answer
-- may come from another process.

local json = require "cjson.safe"

local _M = {}

_M.USAGE = "usage: marketing [--store NAME] [--thread ID] [--json] QUERY"

local function parse(args)
  local o, words = {}, {}
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--store" or a == "--thread" then
      local v = args[i + 1]
      if not v then return nil, a .. " needs a value" end
      o[a:sub(3)] = v
      i = i + 2
    elseif a == "--json" then
      o.json = true
      i = i + 1
    elseif a == "-h" or a == "--help" then
      o.help = true
      i = i + 1
    elseif a:sub(1, 2) == "--" then
      return nil, "unknown option " .. a
    else
      words[#words + 1] = a
      i = i + 1
    end
  end
  o.query = table.concat(words, " ")
  if o.query == "" then o.query = nil end
  return o
end

function _M.main(args, opts)
  opts = opts or {}
  local out, err = opts.stdout or io.stdout, opts.stderr or io.stderr
  local o, perr = parse(args)
  if not o then
    err:write("marketing: ", perr, "\n", _M.USAGE, "\n")
    return 2
  end
  if o.help then out:write(_M.USAGE, "\n") return 0 end
  if not o.query and not (o.store and o.thread) then
    err:write("marketing: missing QUERY (or --thread ID --store NAME to answer a question)\n", _M.USAGE, "\n")
    return 2
  end
  local adapter = require "scripts.marketing.adapter"
  local ok, pipeline = pcall(adapter.new, opts.pipeline_opts)
  if not ok then
    err:write("marketing: ", tostring(pipeline), "\n")
    return 1
  end
  local r = pipeline:run_one_turn(o.query, o.store, o.thread)
  if o.json then
    out:write(json.encode {
      status = r.status, final_response = r.final_response or json.null, actions = r.actions,
      store_candidates = r.store_candidates, error = r.error or json.null, thread_id = r.thread_id,
    }, "\n")
  else
    out:write("[", r.status, "] thread ", r.thread_id, "\n")
    if r.final_response then out:write(r.final_response, "\n") end
    if r.status == "need_clarify" then
      out:write("\nanswer with: moongraph marketing --thread ", r.thread_id, " --store \"",
        r.store_candidates[1] and r.store_candidates[1].name or "NAME", "\"\n")
    elseif r.status == "error" and r.error and r.error ~= r.final_response then
      err:write("marketing: ", r.error, "\n")
    end
  end
  return r.status == "error" and 1 or 0
end

return _M
