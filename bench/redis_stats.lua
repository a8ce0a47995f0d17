-- Redis's own counters, for the benchmarks: commands run and request
-- batches read (INFO stats total_reads_processed: one per batch a client
-- sends, the round trips). INFO is itself one command and one read, and
-- its reply counts its read but not its command.
local _M = {}

-- counters(r) -> { cmds = total, reads = round trips, by = { name = calls } }
function _M.counters(r)
  local info = r:call("INFO", "all")
  local cmds, reads = 0, tonumber(info:match("total_reads_processed:(%d+)"))
  local by = {}
  for name, calls in info:gmatch("cmdstat_([%w|_]+):calls=(%d+)") do
    by[name] = tonumber(calls)
    cmds = cmds + tonumber(calls)
  end
  return { cmds = cmds, reads = reads, by = by }
end

return _M
