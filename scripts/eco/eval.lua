-- Routing evaluation (`moongraph eval FILE.jsonl`).
--
-- Each line is {"message", "prev_intent"?, "user_location"?, "intent",
-- "additional_intents"?, "nodes"?}. The message is classified (with the
-- line's prev_intent and user_location) and routed; the report gives the
-- accuracy of the intent, of the additional intents (as a set; a line
-- without the field expects none), and of the node set (lines with
-- "nodes"), per-intent precision and recall, the confusion matrix and the
-- failing cases.
--
-- eval(lines, opts) -> report | nil, err
--   lines   list of JSONL lines (blank lines are skipped)
--   opts.is_tty, opts.write   draw a progress bar with write(s) when is_tty
--   opts.llm, opts.cache, opts.model   passed to routing.classify
--   opts.router / opts.route  router options or a route function
-- text(report) -> string, json(report) -> one line of JSON

local routing = require "scripts.eco.routing"
local json = require "moongraph.json"

local cjson = require "cjson"

local format, rep, concat, sort = string.format, string.rep, table.concat, table.sort
local ipairs, pairs, type, pcall, tostring = ipairs, pairs, type, pcall, tostring

local _M = {}

local KNOWN = {}
for _, c in ipairs(routing.INTENTS) do KNOWN[c] = true end

local function is_set(v) return v ~= nil and v ~= cjson.null end

local function sorted_copy(list)
  local out = {}
  for i, v in ipairs(list or {}) do out[i] = v end
  sort(out)
  return out
end

local function same_set(a, b)
  local sa, sb = {}, {}
  for _, v in ipairs(a) do sa[v] = true end
  for _, v in ipairs(b) do sb[v] = true end
  for k in pairs(sa) do if not sb[k] then return false end end
  for k in pairs(sb) do if not sa[k] then return false end end
  return true
end

-- Read a file's lines. Returns the list or nil, err.
function _M.read_lines(path)
  local f, err = io.open(path, "r")
  if not f then return nil, err end
  local out = {}
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  return out
end

-- Decode and check one line; returns the case or nil, err.
local function parse(line, n)
  local ok, obj = pcall(cjson.decode, line)
  if not ok or type(obj) ~= "table" then
    return nil, format("line %d: not a JSON object", n)
  end
  if type(obj.message) ~= "string" or not obj.message:find("%S") then
    return nil, format("line %d: \"message\" must be a non-empty string", n)
  end
  if type(obj.intent) ~= "string" or not KNOWN[obj.intent] then
    return nil, format("line %d: \"intent\" must be one of the intents, got %s", n,
      tostring(obj.intent))
  end
  local prev = obj.prev_intent
  if is_set(prev) and (type(prev) ~= "string" or not KNOWN[prev]) then
    return nil, format("line %d: unknown \"prev_intent\" %s", n, tostring(prev))
  end
  local adds = obj.additional_intents
  if is_set(adds) then
    if type(adds) ~= "table" then
      return nil, format("line %d: \"additional_intents\" must be a list", n)
    end
    for _, a in ipairs(adds) do
      if not KNOWN[a] then
        return nil, format("line %d: unknown additional intent %s", n, tostring(a))
      end
    end
  else
    adds = {}
  end
  local nodes = obj.nodes
  if is_set(nodes) then
    if type(nodes) ~= "table" then
      return nil, format("line %d: \"nodes\" must be a list", n)
    end
  else
    nodes = nil
  end
  return {
    line = n, message = obj.message, prev_intent = is_set(prev) and prev or nil,
    user_location = is_set(obj.user_location) and obj.user_location or nil,
    intent = obj.intent, additional_intents = adds, nodes = nodes,
  }
end

local function progress(write, done, total)
  local width = 30
  local n = total > 0 and math.floor(done / total * width) or width
  write(format("\r[%s%s] %d/%d", rep("#", n), rep("-", width - n), done, total))
end

function _M.eval(lines, opts)
  if type(lines) ~= "table" then
    error("bad argument #1 to 'eval': expected a list of lines", 2)
  end
  opts = opts or {}
  local write = opts.write
  local show = opts.is_tty and type(write) == "function"

  local cases = {}
  for n, line in ipairs(lines) do
    if line:find("%S") then
      local c, err = parse(line, n)
      if not c then return nil, err end
      cases[#cases + 1] = c
    end
  end
  if #cases == 0 then return nil, "no cases to evaluate" end

  local route = opts.route or routing.new_router(opts.router)
  local counts = { intent = 0, additional = 0, nodes = 0, nodes_total = 0 }
  local confusion, per = {}, {}
  for _, c in ipairs(routing.INTENTS) do per[c] = { tp = 0, fp = 0, fn = 0 } end
  local failures = {}
  local sources = {}

  for i, c in ipairs(cases) do
    local res, err = routing.classify(c.message, {
      prev_intent = c.prev_intent, user_location = c.user_location,
      llm = opts.llm, cache = opts.cache, model = opts.model,
    })
    if not res then
      if show then write("\n") end
      return nil, format("line %d: %s", c.line, err)
    end
    sources[res.source] = (sources[res.source] or 0) + 1
    local decisions = route({
      message = c.message, intent = res.intent,
      additional_intents = res.additional_intents, user_location = c.user_location,
    })
    local nodes = routing.nodes(decisions)

    local ok_intent = res.intent == c.intent
    local ok_adds = same_set(res.additional_intents, c.additional_intents)
    local ok_nodes
    if c.nodes then
      counts.nodes_total = counts.nodes_total + 1
      ok_nodes = same_set(nodes, c.nodes)
      if ok_nodes then counts.nodes = counts.nodes + 1 end
    end
    if ok_intent then counts.intent = counts.intent + 1 end
    if ok_adds then counts.additional = counts.additional + 1 end

    confusion[c.intent] = confusion[c.intent] or {}
    confusion[c.intent][res.intent] = (confusion[c.intent][res.intent] or 0) + 1
    if ok_intent then
      per[c.intent].tp = per[c.intent].tp + 1
    else
      per[c.intent].fn = per[c.intent].fn + 1
      per[res.intent].fp = per[res.intent].fp + 1
    end

    if not ok_intent or not ok_adds or ok_nodes == false then
      local wrong = {}
      if not ok_intent then wrong[#wrong + 1] = "intent" end
      if not ok_adds then wrong[#wrong + 1] = "additional_intents" end
      if ok_nodes == false then wrong[#wrong + 1] = "nodes" end
      failures[#failures + 1] = {
        line = c.line, message = c.message, prev_intent = c.prev_intent,
        user_location = c.user_location, wrong = json.array(wrong),
        expected = { intent = c.intent, additional_intents = json.array(sorted_copy(c.additional_intents)),
                     nodes = c.nodes and json.array(sorted_copy(c.nodes)) or nil },
        got = { intent = res.intent, additional_intents = json.array(sorted_copy(res.additional_intents)),
                nodes = json.array(nodes), confidence = res.confidence,
                source = res.source, fallback_reason = res.explain.fallback_reason },
      }
    end
    if show then progress(write, i, #cases) end
  end
  if show then write("\n") end

  local total = #cases
  local per_intent = {}
  for _, c in ipairs(routing.INTENTS) do
    local p = per[c]
    local support = p.tp + p.fn
    local predicted = p.tp + p.fp
    if support > 0 or predicted > 0 then
      per_intent[c] = {
        support = support, predicted = predicted, correct = p.tp,
        precision = predicted > 0 and p.tp / predicted or cjson.null,
        recall = support > 0 and p.tp / support or cjson.null,
      }
    end
  end
  return {
    total = total,
    intent = { correct = counts.intent, total = total, accuracy = counts.intent / total },
    additional_intents = { correct = counts.additional, total = total,
                           accuracy = counts.additional / total },
    nodes = { correct = counts.nodes, total = counts.nodes_total,
              accuracy = counts.nodes_total > 0 and counts.nodes / counts.nodes_total or cjson.null },
    per_intent = per_intent,
    confusion = confusion,
    failures = json.array(failures),
    sources = sources,
  }
end

local function pct(x)
  if type(x) ~= "number" then return "   -  " end
  return format("%5.1f%%", x * 100)
end

-- The report as text for a person.
function _M.text(r)
  local out = {}
  local function say(...) out[#out + 1] = format(...) end
  local srcs = {}
  for s, n in pairs(r.sources) do srcs[#srcs + 1] = s .. " " .. n end
  sort(srcs)
  say("cases: %d (%s)", r.total, concat(srcs, ", "))
  say("intent accuracy:             %s  (%d/%d)", pct(r.intent.accuracy), r.intent.correct, r.intent.total)
  say("additional intents accuracy: %s  (%d/%d)", pct(r.additional_intents.accuracy),
    r.additional_intents.correct, r.additional_intents.total)
  say("node set exact match:        %s  (%d/%d)", pct(r.nodes.accuracy), r.nodes.correct, r.nodes.total)
  say("")
  say("%-17s %9s %9s %8s %10s", "intent", "precision", "recall", "support", "predicted")
  local labels = {}
  for _, c in ipairs(routing.INTENTS) do
    if r.per_intent[c] then labels[#labels + 1] = c end
  end
  for _, c in ipairs(labels) do
    local p = r.per_intent[c]
    say("%-17s %9s %9s %8d %10d", c, pct(p.precision), pct(p.recall), p.support, p.predicted)
  end
  say("")
  say("confusion matrix (rows: expected, columns: predicted)")
  local abbrev = {}
  for i, c in ipairs(labels) do abbrev[i] = c:sub(1, 6) end
  say("%-17s %s", "", concat((function()
    local t = {}
    for i, a in ipairs(abbrev) do t[i] = format("%6s", a) end
    return t
  end)(), " "))
  for _, g in ipairs(labels) do
    local row = {}
    for i, p in ipairs(labels) do
      local n = r.confusion[g] and r.confusion[g][p] or 0
      row[i] = format("%6s", n > 0 and tostring(n) or ".")
    end
    say("%-17s %s", g, concat(row, " "))
  end
  say("")
  if #r.failures == 0 then
    say("failing cases: none")
  else
    say("failing cases: %d", #r.failures)
    for _, f in ipairs(r.failures) do
      local ctx = {}
      if f.prev_intent then ctx[#ctx + 1] = "prev " .. f.prev_intent end
      if f.user_location then ctx[#ctx + 1] = "location " .. tostring(f.user_location) end
      say("  line %d: %s%s", f.line, f.message,
        #ctx > 0 and (" [" .. concat(ctx, ", ") .. "]") or "")
      say("    wrong: %s", concat(f.wrong, ", "))
      say("    expected: %s +[%s] nodes [%s]", f.expected.intent,
        concat(f.expected.additional_intents, ","), f.expected.nodes and concat(f.expected.nodes, ",") or "-")
      say("    got:      %s +[%s] nodes [%s] (confidence %.2f, %s)", f.got.intent,
        concat(f.got.additional_intents, ","), concat(f.got.nodes, ","), f.got.confidence, f.got.source)
    end
  end
  return concat(out, "\n") .. "\n"
end

-- The report as one line of JSON.
function _M.json(r)
  return json.encode_output(r)
end

setmetatable(_M, { __call = function(_, ...) return _M.eval(...) end })

return _M
