-- hostile.lua — a bounded sweep of hostile input against a `moongraph
-- serve` (either backend): non-finite, huge, negative, fractional and
-- wrongly typed values in every field that pages, limits or counts, text
-- no store takes, then a burst of all of it at once, while a watcher asks
-- /ok over and over. Driven in this process with moongraph.http.
--
--   local hostile = require "hostile"
--   local report = hostile.sweep(url)   -- inside mg.run
--   report.requests  -- {route =, status =, took =, body =}...
--   report.ok_worst  -- the slowest /ok answer, in seconds
--   report.ok_count
local mg = require "moongraph"
local http = require "moongraph.http"
local cjson = require "cjson.safe"

local _M = {}

-- as JSON text: what a hostile client writes (1e999 is infinity to a decoder)
_M.NUMBERS = { "-1e300", "1e300", "1e999", "-1e999", "0.5", "-1", "-0.0", "2147483648",
  "9223372036854775807", "9223372036854775808", "1e308", '"abc"', '"12"', "true", "{}", "[]" }
-- as query strings
_M.QUERY = { "-1e300", "1e999", "0.5", "-1", "9223372036854775807", "99999999999999999999999", "abc",
  "%00", "1%00", "", "12" }
-- text PostgreSQL's text and jsonb refuse (so every backend must)
_M.TEXTS = { '"\\u0000"', '"a\\u0000b"', '"\\ud800"', '"\\udfff x"' }

local function enc(s)
  return (s:gsub("[^%w%-_.%%]", function(c) return string.format("%%%02X", c:byte()) end))
end

-- the requests of the sweep: {method, path, body}
function _M.requests(t, run_id)
  local list = {}
  local function post(path, body) list[#list + 1] = { "POST", path, body } end
  local function get(path) list[#list + 1] = { "GET", path } end
  for _, v in ipairs(_M.NUMBERS) do
    for _, path in ipairs { "/assistants/search", "/threads/search" } do
      post(path, '{"limit": ' .. v .. '}')
      post(path, '{"offset": ' .. v .. '}')
      post(path, '{"limit": ' .. v .. ', "offset": ' .. v .. '}')
    end
    post("/assistants/count", '{"graph_id": ' .. v .. '}')
    post("/threads/count", '{"status": ' .. v .. '}')
    post("/threads/" .. t .. "/history", '{"limit": ' .. v .. '}')
    post("/threads/" .. t .. "/history", '{"before": ' .. v .. '}')
    post("/threads/" .. t .. "/runs/wait", '{"assistant_id": "agent", "input": {}, ' ..
      '"config": {"recursion_limit": ' .. v .. '}}')
    post("/runs", '{"assistant_id": "agent", "input": {}, "after_seconds": ' .. v .. '}')
    post("/runs", '{"assistant_id": ' .. v .. ', "input": {}}')
    post("/threads", '{"metadata": {"n": ' .. v .. '}, "if_exists": ' .. v .. '}')
    post("/chat/messages", '{"message": "hi", "context": {"n": ' .. v .. '}}')
  end
  for _, v in ipairs(_M.TEXTS) do
    post("/threads", '{"metadata": {"k": ' .. v .. '}}')
    post("/threads/search", '{"metadata": {"k": ' .. v .. '}}')
    post("/threads/search", '{"ids": [' .. v .. ']}')
    post("/threads", '{"thread_id": ' .. v .. '}')
    post("/chat/messages", '{"message": ' .. v .. '}')
    post("/chat/messages", '{"message": "hi", "user_location": ' .. v .. '}')
    post("/chat/messages", '{"message": "hi", "context": ' .. v .. '}')
    post("/chat/messages", '{"message": "hi", "context": {"user_location": ' .. v .. '}}')
  end
  for _, v in ipairs(_M.QUERY) do
    get("/threads/" .. t .. "/history?limit=" .. v)
    get("/threads/" .. t .. "/runs?limit=" .. v .. "&offset=" .. v)
    get("/threads/" .. t .. "/runs?status=" .. v)
    get("/chat/conversations?limit=" .. v .. "&offset=" .. v)
    get("/chat/conversations?offset=" .. v)
    list[#list + 1] = { "POST", "/threads/" .. t .. "/runs/" .. run_id .. "/cancel?action=" .. v .. "&wait=" .. v }
    list[#list + 1] = { "GET", "/threads/" .. t .. "/runs/" .. run_id .. "/join?x=" .. enc(v) }
  end
  -- raw bytes a JSON text may not hold
  post("/threads/search", '{"metadata": {"k": "raw\0nul"}}')
  post("/threads/search", '{"metadata": {"k": "raw\ttab"}}')
  post("/threads", '{"metadata": {"k": "\255\254"}}')
  post("/chat/messages", '{"message": "raw\0nul"}')
  return list
end

local function one(base, r)
  local t0 = mg.now()
  local res, err = http.request { method = r[1], url = base .. r[2], body = r[3],
    headers = r[3] and { ["Content-Type"] = "application/json" } or nil, timeout = 10 }
  return { route = r[1] .. " " .. r[2] .. (r[3] and (" " .. r[3]) or ""), took = mg.now() - t0,
    status = res and res.status or 0, body = res and res.body or tostring(err),
    request_id = res and res.headers["x-request-id"] or nil }
end

-- sweep(base, {thread_id, run_id}) -> report
function _M.sweep(base, ids)
  local list = _M.requests(ids.thread_id, ids.run_id)
  local report = { requests = {}, ok_worst = 0, ok_count = 0 }
  local done = false
  local watcher = mg.spawn(function()
    while not done do
      local t0 = mg.now()
      local res = http.request { url = base .. "/ok", timeout = 5 }
      local took = mg.now() - t0
      if not res or res.status ~= 200 then took = math.huge end
      report.ok_worst = math.max(report.ok_worst, took)
      report.ok_count = report.ok_count + 1
      mg.sleep(0.005)
    end
  end)
  -- one after another, eight at a time
  local next_i = 0
  local workers = {}
  for w = 1, 8 do
    workers[w] = mg.spawn(function()
      while true do
        next_i = next_i + 1
        local r = list[next_i]
        if not r then return end
        local rec = one(base, r)   -- (it waits: the slot is taken after)
        report.requests[#report.requests + 1] = rec
      end
    end)
  end
  for _, w in ipairs(workers) do assert(w:join()) end
  -- then every request at once
  local burst = {}
  for i, r in ipairs(list) do burst[i] = mg.spawn(one, base, r) end
  for _, b in ipairs(burst) do
    local ok, rec = b:join()
    assert(ok, rec)
    report.requests[#report.requests + 1] = rec
  end
  done = true
  assert(watcher:join())
  report.sent = #list * 2
  return report
end

-- check(report): every request answered below 500 within 2 s, with a
-- JSON error that names its request; /ok within 0.5 s throughout
function _M.check(report)
  assert(#report.requests == report.sent, "answers missing: " .. #report.requests .. " of " .. report.sent)
  for _, r in ipairs(report.requests) do
    assert(r.status >= 200 and r.status < 500, r.route .. " answered " .. r.status .. ": " .. r.body)
    assert(r.took < 2, r.route .. " took " .. r.took .. " s")
    if r.status >= 400 then
      local v = cjson.decode(r.body)
      assert(type(v) == "table" and type(v.detail or v.error) == "string", r.route .. ": " .. r.body)
      assert(v.request_id == r.request_id, r.route .. ": the error names another request id")
    end
  end
  assert(report.ok_count >= 5, "the /ok watcher barely ran (" .. report.ok_count .. " answers)")
  assert(report.ok_worst < 0.5, "/ok took " .. report.ok_worst .. " s")
end

return _M
