-- moongraph.worker.results — the Postgres table job_results: one row per
-- job, written once.
--
--   local results = require "moongraph.worker.results"
--   local row, err = results.get(db, job_id)        -- row | nil (none yet) | nil, err
--   local inserted, row = results.commit(db, row, function(tx) ... end [, fence [, cleanup]])
--
-- commit inserts the row unless the job already has one (job_id is the
-- primary key); what `also(tx)` writes (the script's record hook) is
-- committed in the same transaction, only with the row, so a job delivered
-- twice stores one answer and records it once. It returns false and the
-- stored row when the job already had a result. `cleanup(tx)` runs either
-- way (the job's checkpoints, useless once a result is stored, go with it).
--
-- Fences: a job runs holding its thread's lease (moongraph.multitask), whose
-- token grows with each holder. The table thread_fences keeps, per thread,
-- the largest token that claimed it; a worker that stalled past its lease
-- holds a smaller token than the run after it, and its commit is refused
-- ("stale"), so it cannot write over a later turn of the conversation. It
-- also counts the thread's results stored with a fence (`commits`): a job
-- that resumes a run an earlier delivery started compares the count that
-- run started under with its own claim's, and starts over when the thread
-- has moved on in between (its run read the thread's memory before that).
--
--   local ok, _, commits = results.claim(db, thread_id, token)   -- false: a later holder claimed it
--   local ok, stored, commits = results.claim(db, thread_id, token, job_id)
--                                       -- and the job's stored row, if any (one statement)
--   results.claim(db, thread_id, token, job_id, reads)
--                                       -- and a script's reads, in the same round trip
--   results.commit(db, row, also, { thread_id =, token = })

local errors = require "moongraph.errors"
local pg = require "moongraph.pg"
local json = require "moongraph.json"

local type, tostring, pcall, error = type, tostring, pcall, error

local _M = {}

local function nz(v)
  if v == pg.null then return nil end
  return v
end

local function row_of(r)
  local ok, state = pcall(json.decode, r.state or "{}")
  return {
    job_id = r.job_id, thread_id = r.thread_id, user_id = nz(r.user_id),
    status = r.status, answer = nz(r.answer), error = nz(r.error),
    state = ok and state or {}, worker = nz(r.worker), deliveries = nz(r.deliveries),
  }
end

local SELECT = [[
SELECT job_id, thread_id, user_id, status, answer, error, state::text AS state, worker, deliveries
FROM job_results WHERE job_id = $1]]

function _M.get(db, job_id)
  local rows, err = db:query(SELECT, { job_id })
  if not rows then return nil, err end
  if not rows[1] then return nil end
  return row_of(rows[1])
end

local function arg(v)
  if v == nil then return pg.null end
  return v
end

local FENCE = [[
INSERT INTO thread_fences (thread_id, token) VALUES ($1, $2::numeric)
ON CONFLICT (thread_id) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
  WHERE thread_fences.token <= EXCLUDED.token
RETURNING commits]]

_M.STALE = "stale lease: a later run of the thread holds it"

-- The error of a commit refused because a later run holds the thread
-- (code "stale": nothing to retry).
local function stale()
  return errors.new("stale", _M.STALE)
end

local CLAIM_AND_GET = [[
WITH f AS (]] .. FENCE .. [[)
SELECT (SELECT count(*) FROM f)::int AS claimed, (SELECT commits FROM f) AS commits,
  r.job_id, r.thread_id, r.user_id, r.status, r.answer, r.error, r.state::text AS state, r.worker, r.deliveries
FROM (SELECT 1) AS one LEFT JOIN job_results r ON r.job_id = $3]]

-- claim(db, thread_id, token [, job_id [, reads]]) -> true | false (a
-- later holder already claimed the thread), stored, commits | nil, err
-- [, "reads"]. With job_id, the job's stored row (or nil) is `stored`,
-- read in the same statement; `commits` is the thread's count of results
-- (when claimed). reads(tx) -> nil | after(): a script's reads that go with the
-- claim, in its transaction (the prefetch hook's), run after the claim is
-- sent: what it defers goes with the claim in one round trip, which also
-- carries the COMMIT (reads that query call tx:commit_with_next() before
-- their last query, which is then that round trip). after(), when given,
-- runs once the round trip is done. When reads or after raise, the claim
-- fails with their error and a third value, "reads".
local function claim_rows(db, sql, params, reads)
  if not reads then return db:query(sql, params) end
  local by_reads = false
  local rows, err = db:transaction(function(tx)
    local claimed, cerr = tx:defer(sql, params)
    if not claimed then error(cerr, 0) end
    local ok, after = pcall(reads, tx)
    if not ok then by_reads = true; error(after, 0) end
    if tx:is_open() then tx:commit_with_next() end
    local r, qerr = claimed()
    if not r then error(qerr, 0) end
    if after then
      local aok, aerr = pcall(after)
      if not aok then by_reads = true; error(aerr, 0) end
    end
    return r
  end)
  if rows == nil and by_reads then return nil, err, "reads" end
  return rows, err
end

function _M.claim(db, thread_id, token, job_id, reads)
  if job_id == nil then
    local rows, err, who = claim_rows(db, FENCE, { thread_id, tostring(token) }, reads)
    if not rows then return nil, err, who end
    local r = rows[1]
    return r ~= nil, nil, r and r.commits
  end
  local rows, err, who = claim_rows(db, CLAIM_AND_GET, { thread_id, tostring(token), job_id }, reads)
  if not rows then return nil, err, who end
  local r = rows[1]
  local stored = nil
  if r.job_id ~= pg.null and r.job_id ~= nil then stored = row_of(r) end
  return r.claimed == 1, stored, nz(r.commits)
end

local INSERT = [[
INSERT INTO job_results (job_id, thread_id, user_id, status, answer, error, state, worker, deliveries)
VALUES ($1, $2, $3, $4, $5, $6, $7::json, $8, $9)
ON CONFLICT (job_id) DO NOTHING
RETURNING job_id]]

-- The fence claim and the insert in one statement, refused (raised, so the
-- transaction rolls back) unless the claim holds and the row goes in: it
-- can then be sent with the COMMIT, after what the record hook wrote.
local FENCED_INSERT = [[
WITH f AS (
  INSERT INTO thread_fences (thread_id, token, commits) VALUES ($10, $11::numeric, 1)
  ON CONFLICT (thread_id) DO UPDATE
    SET token = EXCLUDED.token, updated_at = now(), commits = thread_fences.commits + 1
    WHERE thread_fences.token <= EXCLUDED.token
  RETURNING thread_id
), i AS (
  INSERT INTO job_results (job_id, thread_id, user_id, status, answer, error, state, worker, deliveries)
  SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::json, $8::text, $9::int
  WHERE EXISTS (SELECT 1 FROM f)
  ON CONFLICT (job_id) DO NOTHING
  RETURNING job_id
)
SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM f) THEN moongraph_result_refused('stale')
  WHEN NOT EXISTS (SELECT 1 FROM i) THEN moongraph_result_refused('stored')
  ELSE 1 END AS ok]]

-- the refusals' SQLSTATEs (moongraph_result_refused, worker migration 7)
local REFUSED_STALE = "pg:MGR01"
local REFUSED_STORED = "pg:MGR02"

local function stored_row(tx, job_id)
  local old, err = _M.get(tx, job_id)
  if not old then error(errors.wrap(err, nil, "job_results: " .. tostring(err)), 0) end
  return old
end

-- commit(db, row, also [, fence [, cleanup]]) -> inserted, stored_row | nil, err
-- row: job_id, thread_id, user_id, status ("done" | "failed" |
-- "interrupted"), answer, error, state (a table; or state_text, its JSON),
-- worker, deliveries.
--
-- With a fence the fenced insert goes with the COMMIT, after what cleanup
-- and also write: one round trip when those only send (tx:send). Should
-- the job have a result already (a race with another delivery), all of it
-- rolls back and a second transaction runs cleanup and reads the stored
-- row: also's writes are committed only with the row they go with.
function _M.commit(db, row, also, fence, cleanup)
  local state_text = row.state_text
  if not state_text then
    local err
    state_text, err = json.encode(row.state or {}, { name = "state" })
    if not state_text then return nil, "job_results: " .. err end
  end
  local values = { row.job_id, row.thread_id, arg(row.user_id), row.status or "done",
    arg(row.answer), arg(row.error), state_text, arg(row.worker), arg(row.deliveries) }
  local function clean(tx)
    if not cleanup then return end
    local ok, cerr = cleanup(tx)
    if not ok then error(errors.wrap(cerr, nil, "cleanup: " .. tostring(cerr)), 0) end
  end
  local function record(tx)
    if not also then return end
    local ok, aerr = also(tx)
    if not ok then error(tostring(aerr), 0) end
  end
  if fence then
    values[10], values[11] = fence.thread_id, tostring(fence.token)
    local ok, err = db:transaction(function(tx)
      clean(tx)
      record(tx)
      local sent, serr = tx:send(FENCED_INSERT, values)
      if not sent then error(errors.wrap(serr, nil, "job_results: " .. tostring(serr)), 0) end
      return true
    end)
    if ok then return true, row end
    if errors.has(err, REFUSED_STALE) then return nil, stale() end
    if not errors.has(err, REFUSED_STORED) then return nil, err end
    return db:transaction(function(tx)
      clean(tx)
      return false, stored_row(tx, row.job_id)
    end)
  end
  return db:transaction(function(tx)
    local rows, err = tx:query(INSERT, values)
    if not rows then error(errors.wrap(err, nil, "job_results: " .. tostring(err)), 0) end
    clean(tx)
    if rows[1] then
      record(tx)
      return true, row
    end
    return false, stored_row(tx, row.job_id)
  end)
end

return _M
