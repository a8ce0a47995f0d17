--[[
The adapter of the store-marketing pipeline: one conversation turn in, a
summary for a UI or the command line out.

  local marketing = require "scripts.marketing.adapter"
  local r = marketing.run_one_turn("본죽 문제점이 뭐야?", nil, "thread-1")
  -- r.status == "need_clarify", r.store_candidates = {...}
  r = marketing.run_one_turn("본죽 강남역점", "본죽 강남역점", "thread-1")
  -- r.status == "ok", r.final_response, r.actions

run_one_turn(user_query, store_name, thread_id) -> {
  status = "ok" | "need_clarify" | "error",
  final_response,      -- the answer (need_clarify: the question; error: the message or the last draft)
  actions,             -- action seeds {title, detail, kpi}
  store_candidates,    -- ranked candidates (need_clarify)
  error,               -- nil | message
  thread_id,           -- the thread (a new one when none was given)
  state,               -- the whole final state, for debugging
}

When the thread has a clarification pending, the turn answers it: the
store name (or, without one, the query) resumes the interrupted run. Every
other turn starts a new run on the thread; the conversation messages of the
thread are kept across turns by the checkpointer.

new(opts) makes a pipeline with its own settings; the module-level
run_one_turn uses one built from the environment on first use (file
checkpoints under MARKETING_CHECKPOINT_DIR, so two processes share threads).
]]

local mg = require "moongraph"
local config = require "scripts.marketing.config"
local tools_mod = require "scripts.marketing.tools"
local graph = require "scripts.marketing.graph"

local _M = {}

local Pipeline = {}
Pipeline.__index = Pipeline

--[[ new(opts) -> pipeline
opts (all optional): settings (default config.from_env()), llm (default
config.llm(settings); false: none), tools (default: the data tools over
MCP, served by `moongraph mcp serve scripts/marketing/tools.lua`, or in
process when settings.tools is "local"; either way over PostgreSQL at
settings.pg_url when set, else the sample data of settings.data_dir), checkpointer (default the file saver in
settings.checkpoint_dir), drafter (see scripts/marketing/graph.lua). ]]
function _M.new(opts)
  opts = opts or {}
  local settings = opts.settings or config.from_env()
  local llm = opts.llm
  if llm == nil then llm = config.llm(settings) end
  if llm == false then llm = nil end
  local tools = opts.tools
  if not tools then
    if settings.tools == "local" then
      local backend = settings.pg_url and tools_mod.pg_backend(settings.pg_url) or tools_mod.local_backend(settings.data_dir)
      tools = tools_mod.new(backend)
    else
      tools = require("scripts.marketing.mcp_tools").new { data_dir = settings.data_dir, pg_url = settings.pg_url }
    end
  end
  local cp = opts.checkpointer or mg.checkpoint.file(settings.checkpoint_dir)
  local app = graph.build { settings = settings, llm = llm, tools = tools, drafter = opts.drafter, checkpointer = cp }
  return setmetatable({ app = app, settings = settings, llm = llm, tools = tools }, Pipeline)
end

local function new_thread_id()
  return string.format("t-%s-%06d", os.date("!%Y%m%d%H%M%S"), math.random(0, 999999))
end

-- the state keys of one turn, reset at its start
local function init_state(user_query, store_name)
  return {
    user_query = user_query, store_name_input = store_name or false, intent = false,
    store_candidates = {}, store_id = false, store = false, need_clarify = false,
    card_data = false, admin_dong_code = false, area_data = false, region_data = false,
    signals = {}, persona = false, channel_hints = {}, raw_response = false, final_response = false,
    actions = {}, drafts = {}, mode = false, relevance_passed = false, relevance_report = false,
    retry_count = 0, error = false, notes = false,
  }
end

local function summarise(out, thread_id)
  local pending = out.__interrupt__
  if pending then
    local v = pending[1].value or {}
    return { status = "need_clarify", final_response = v.question, actions = {},
      store_candidates = v.candidates or {}, thread_id = thread_id, state = out }
  end
  local r = {
    final_response = out.final_response or nil, actions = out.actions or {},
    store_candidates = out.store_candidates or {}, thread_id = thread_id, state = out,
  }
  if out.error then
    r.status, r.error = "error", out.error
    r.final_response = r.final_response or out.error
  else
    r.status = "ok"
  end
  return r
end

local function turn(self, user_query, store_name, thread_id)
  thread_id = thread_id or new_thread_id()
  local cfg = { thread_id = thread_id }
  local st, serr = self.app:get_state(cfg)
  if not st then
    return { status = "error", error = serr, actions = {}, store_candidates = {}, thread_id = thread_id }
  end
  local out, err
  if st.interrupts and st.interrupts[1] then
    out, err = self.app:invoke(mg.Command { resume = store_name or user_query }, cfg)
  else
    if type(user_query) ~= "string" or not user_query:find("%S") then
      return { status = "error", error = "질문이 비어 있습니다.", actions = {}, store_candidates = {},
        thread_id = thread_id }
    end
    out, err = self.app:invoke(init_state(user_query, store_name), cfg)
  end
  if not out then
    return { status = "error", error = tostring(err):match("^[^\n]*"), actions = {}, store_candidates = {},
      thread_id = thread_id }
  end
  return summarise(out, thread_id)
end

--[[ pipeline:run_one_turn(user_query, store_name, thread_id) -> result ]]
function Pipeline:run_one_turn(user_query, store_name, thread_id)
  if user_query ~= nil and type(user_query) ~= "string" then
    error("bad argument #1 to 'run_one_turn': string expected, got " .. type(user_query), 2)
  end
  if store_name ~= nil and type(store_name) ~= "string" then
    error("bad argument #2 to 'run_one_turn': string or nil expected, got " .. type(store_name), 2)
  end
  if thread_id ~= nil and type(thread_id) ~= "string" then
    error("bad argument #3 to 'run_one_turn': string or nil expected, got " .. type(thread_id), 2)
  end
  if store_name == "" then store_name = nil end
  if mg.current() then return turn(self, user_query, store_name, thread_id) end
  return mg.run(turn, self, user_query, store_name, thread_id)
end

-- Stop what the pipeline started (the MCP data server).
function Pipeline:close()
  if self.tools and self.tools.close then self.tools.close() end
end

-- the conversation messages of a thread
function Pipeline:messages(thread_id)
  local function get()
    local st = self.app:get_state { thread_id = thread_id }
    return st and st.values.messages or {}
  end
  if mg.current() then return get() end
  return mg.run(get)
end

local default = nil

--[[ run_one_turn(user_query, store_name, thread_id) with the pipeline built
from the environment (made once, like the seed's cached create_graph). ]]
function _M.run_one_turn(user_query, store_name, thread_id)
  default = default or _M.new()
  return default:run_one_turn(user_query, store_name, thread_id)
end

return _M
