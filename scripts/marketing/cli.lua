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
local args = require "moongraph.args"

local _M = {}

_M.SPEC = {
  name = "marketing",
  usage = "usage: marketing [--store NAME] [--thread ID] [--json] QUERY",
  options = { store = "string", thread = "string", json = "flag" },
  positional = { name = "query", label = "QUERY", join = true },
}

function _M.main(argv, opts)
  opts = opts or {}
  local out, err = opts.stdout or io.stdout, opts.stderr or io.stderr
  local o, perr = args.parse(_M.SPEC, argv)
  if not o then return args.usage_error(_M.SPEC, perr, err) end
  if o.help then return args.help(_M.SPEC, out) end
  if o.query and not o.query:find("%S") then o.query = nil end
  if not o.query and not (o.store and o.thread) then
    return args.usage_error(_M.SPEC, "missing QUERY (or --thread ID --store NAME to answer a question)", err)
  end
  local adapter = require "scripts.marketing.adapter"
  local ok, pipeline = pcall(adapter.new, opts.pipeline_opts)
  if not ok then
    err:write("marketing: ", tostring(pipeline), "\n")
    return 1
  end
  local r = pipeline:run_one_turn(o.query, o.store, o.thread)
  pipeline:close()
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
