-- Per-branch workspaces of the GCRI workflow: one directory per hypothesis
-- branch under the run directory (the seed's containers), reused by the
-- verification branches as the seed's table says:
--
--   single source branch      reuse that branch's workspace
--   merged from several       the first source's workspace
--
-- Layout: <run_dir>/iter-<count>/branch-<index>/ holding strategy.json,
-- hypothesis.txt, reasoning.txt (hypothesis branch) and candidate.txt,
-- verification.json (verification branch). File operations go through the
-- runtime's file store: the calling task yields while they run.

local json = require "cjson.safe"

local _M = {}

local function store() return require("moongraph.core").store end

local function must(ok, err, what)
  if not ok then error("workspace: " .. what .. ": " .. tostring(err), 0) end
  return ok
end

-- setup_branch(run_dir, count, index) -> workspace path (created)
function _M.setup_branch(run_dir, count, index)
  local dir = string.format("%s/iter-%d/branch-%d", run_dir, count, index)
  local ok, err = store().mkdir(dir)
  must(ok, err, "cannot create " .. dir)
  return dir
end

--[[ setup_verification_branches(branches, source_containers) -> map
branches: AggregatedBranch list; source_containers: raw hypothesis index ->
workspace. Returns a list: aggregated branch index -> workspace, the first
source's (the only one's, for a single source). ]]
function _M.setup_verification_branches(branches, source_containers)
  local map = {}
  for _, b in ipairs(branches) do
    local first = b.source_indices[1]
    local dir = source_containers[first]
    if not dir then
      error("workspace: aggregated branch " .. b.index .. " names source " .. tostring(first) ..
        ", which has no workspace", 0)
    end
    map[b.index] = dir
  end
  return map
end

function _M.write(dir, name, text)
  local ok, err = store().write(dir .. "/" .. name, text)
  must(ok, err, "cannot write " .. dir .. "/" .. name)
end

function _M.write_json(dir, name, value)
  _M.write(dir, name, json.encode(value) .. "\n")
end

-- read(dir, name) -> text | nil, err
function _M.read(dir, name)
  return store().read(dir .. "/" .. name)
end

return _M
