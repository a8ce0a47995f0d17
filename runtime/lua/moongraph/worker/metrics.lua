-- moongraph.worker.metrics — the worker's counters and latency histograms.
--
--   local m = require("moongraph.worker.metrics").new()
--   m:inc("jobs_done")                    m:observe("node", "fetch", 0.012)
--   m:snapshot()  -> plain table (for the heartbeat and `--metrics -`)
--   m:prometheus() -> text exposition format (for a node_exporter textfile
--                     collector or any scraper reading the file)
--
-- Counters: jobs_done (answered), jobs_failed (the pipeline failed; the
-- failure is the stored result), jobs_dead (bad jobs sent to the
-- dead-letter stream), jobs_reclaimed (claimed from a dead or stalled
-- worker), jobs_duplicate (a delivery of a job that already had its
-- result), jobs_released (left pending for another attempt: drain,
-- infrastructure error, lost lease), events_written, reloads.
-- Histograms (seconds): node latency per node name, job duration.

local setmetatable, pairs, ipairs, format, concat, sort =
  setmetatable, pairs, ipairs, string.format, table.concat, table.sort

local _M = {}
local M = {}
M.__index = M

_M.COUNTERS = {
  "jobs_done", "jobs_failed", "jobs_dead", "jobs_reclaimed", "jobs_duplicate",
  "jobs_released", "jobs_rejected", "jobs_preempted", "events_written", "reloads", "consumers_reaped",
}

_M.BUCKETS = { 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 }

local HELP = {
  jobs_done = "Jobs answered (result stored, acknowledged).",
  jobs_failed = "Jobs whose pipeline failed; the failure is stored as the result.",
  jobs_dead = "Bad jobs moved to the dead-letter stream.",
  jobs_reclaimed = "Jobs claimed from a dead or stalled worker.",
  jobs_duplicate = "Deliveries of jobs that already had a result.",
  jobs_released = "Jobs left pending for another attempt (drain, infrastructure error, lost lease).",
  events_written = "Events written to job event streams.",
  reloads = "Successful script reloads (SIGHUP).",
  jobs_rejected = "Jobs refused because their thread was busy (multitask_strategy reject).",
  jobs_preempted = "Jobs stopped by a later job of their thread (multitask_strategy interrupt or rollback).",
  consumers_reaped = "Consumers of dead workers removed from the consumer group.",
}

function _M.new()
  local c = {}
  for _, n in ipairs(_M.COUNTERS) do c[n] = 0 end
  return setmetatable({ counters = c, hist = { node = {}, job = {} }, gauges = { inflight = 0 } }, M)
end

function M:inc(name, n)
  self.counters[name] = (self.counters[name] or 0) + (n or 1)
end

function M:set(name, v)
  self.gauges[name] = v
end

-- observe(family, label, seconds): family "node" (label: node name) or "job"
-- (label: outcome).
function M:observe(family, label, sec)
  local fam = self.hist[family]
  local h = fam[label]
  if not h then
    h = { counts = {}, sum = 0, count = 0 }
    for i = 1, #_M.BUCKETS do h.counts[i] = 0 end
    fam[label] = h
  end
  -- counted in the first bucket that holds it; the cumulative counts are
  -- made when read (cumulative below)
  local b = _M.BUCKETS
  for i = 1, #b do
    if sec <= b[i] then
      h.counts[i] = h.counts[i] + 1
      break
    end
  end
  h.sum = h.sum + sec
  h.count = h.count + 1
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  sort(ks)
  return ks
end

-- The histogram's bucket counts as exposed: each bucket with all below it.
local function cumulative(h)
  local out, n = {}, 0
  for i = 1, #_M.BUCKETS do
    n = n + h.counts[i]
    out[i] = n
  end
  return out
end

-- A plain copy: counters, gauges, and per histogram count, sum, mean and
-- the cumulative bucket counts.
function M:snapshot()
  local out = { counters = {}, gauges = {}, node_latency = {}, job_duration = {} }
  for k, v in pairs(self.counters) do out.counters[k] = v end
  for k, v in pairs(self.gauges) do out.gauges[k] = v end
  for fam, dest in pairs { node = out.node_latency, job = out.job_duration } do
    for label, h in pairs(self.hist[fam]) do
      local buckets, cum = {}, cumulative(h)
      for i, le in ipairs(_M.BUCKETS) do buckets[format("%g", le)] = cum[i] end
      dest[label] = { count = h.count, sum = h.sum, mean = h.count > 0 and h.sum / h.count or 0,
                      buckets = buckets }
    end
  end
  return out
end

local function esc(s)
  return (s:gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub('"', '\\"'))
end

-- prometheus([labels]) -> text. labels: extra labels on every sample
-- (e.g. { worker = "w1" }).
function M:prometheus(labels)
  local base = {}
  for _, k in ipairs(sorted_keys(labels or {})) do
    base[#base + 1] = format('%s="%s"', k, esc(tostring(labels[k])))
  end
  local function lbl(extra)
    local l = {}
    for i = 1, #base do l[i] = base[i] end
    for i = 1, #(extra or {}) do l[#l + 1] = extra[i] end
    if #l == 0 then return "" end
    return "{" .. concat(l, ",") .. "}"
  end
  local lines = {}
  local function add(s) lines[#lines + 1] = s end
  for _, name in ipairs(_M.COUNTERS) do
    local full = "moongraph_worker_" .. name .. "_total"
    add("# HELP " .. full .. " " .. HELP[name])
    add("# TYPE " .. full .. " counter")
    add(format("%s%s %d", full, lbl(), self.counters[name] or 0))
  end
  add("# HELP moongraph_worker_inflight Jobs running now.")
  add("# TYPE moongraph_worker_inflight gauge")
  add(format("moongraph_worker_inflight%s %d", lbl(), self.gauges.inflight or 0))
  local fams = {
    { "node", "moongraph_worker_node_duration_seconds", "Node run time.", "node" },
    { "job", "moongraph_worker_job_duration_seconds", "Job run time from start to stored result.", "outcome" },
  }
  for _, f in ipairs(fams) do
    local fam, full, help, key = f[1], f[2], f[3], f[4]
    add("# HELP " .. full .. " " .. help)
    add("# TYPE " .. full .. " histogram")
    local hs = self.hist[fam]
    for _, label in ipairs(sorted_keys(hs)) do
      local h = hs[label]
      local l = format('%s="%s"', key, esc(label))
      local cum = cumulative(h)
      for i, le in ipairs(_M.BUCKETS) do
        add(format('%s_bucket%s %d', full, lbl { l, format('le="%g"', le) }, cum[i]))
      end
      add(format('%s_bucket%s %d', full, lbl { l, 'le="+Inf"' }, h.count))
      add(format('%s_sum%s %.6f', full, lbl { l }, h.sum))
      add(format('%s_count%s %d', full, lbl { l }, h.count))
    end
  end
  return concat(lines, "\n") .. "\n"
end

return _M
