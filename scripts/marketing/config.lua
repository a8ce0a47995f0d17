-- Settings of the store-marketing pipeline, from the environment (the
-- seed's names), read when the pipeline is built:
--
--   CONFIRM_ON_MULTI         1 (default): ask which store when several match; 0: take the best
--   ENABLE_RELEVANCE_CHECK   1 (default): check each draft and retry; 0: accept the first draft
--   MAX_RETRIES              redrafts after a failed check (default 2)
--   LLM_MODEL                model of the strategy nodes (default: the client's)
--   LLM_TEMPERATURE          sampling temperature (default 0.4)
--   GOOGLE_API_KEY           a Gemini key: used through Gemini's OpenAI-compatible
--                            endpoint when MOONGRAPH_LLM_BASE_URL / _API_KEY are unset
--   MARKETING_DATA_DIR       the sample dataset (default data/marketing/)
--   MARKETING_PG_URL         read the data from PostgreSQL instead (tables of
--                            scripts/marketing/tools.lua PG_SCHEMA)
--   MARKETING_CHECKPOINT_DIR conversation threads of the CLI (default .moongraph/marketing)
--   MARKETING_TOOLS          mcp (default): call the data tools over MCP, served by
--                            `moongraph mcp serve scripts/marketing/tools.lua`;
--                            local: call them in-process

local _M = {}

local function flag(name, default)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  v = v:lower()
  if v == "1" or v == "true" or v == "yes" or v == "on" then return true end
  if v == "0" or v == "false" or v == "no" or v == "off" then return false end
  error(name .. " must be 1 or 0 (got '" .. v .. "')", 0)
end

local function int(name, default, min, max)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  local n = math.tointeger(tonumber(v))
  if not n or n < min or n > max then
    error(name .. " must be an integer from " .. min .. " to " .. max .. " (got '" .. v .. "')", 0)
  end
  return n
end

local function num(name, default, min, max)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  local n = tonumber(v)
  if not n or n < min or n > max then
    error(name .. " must be a number from " .. min .. " to " .. max .. " (got '" .. v .. "')", 0)
  end
  return n
end

local function choice(name, allowed, default)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  for _, a in ipairs(allowed) do if v == a then return v end end
  error(name .. " must be " .. table.concat(allowed, " or ") .. " (got '" .. v .. "')", 0)
end

local function str(name)
  local v = os.getenv(name)
  if v == nil or v == "" then return nil end
  return v
end

local function choice(name, allowed, default)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  for _, a in ipairs(allowed) do if v == a then return v end end
  error(name .. " must be " .. table.concat(allowed, " or ") .. " (got '" .. v .. "')", 0)
end

_M.GEMINI_BASE_URL = "https://generativelanguage.googleapis.com/v1beta/openai"
_M.GEMINI_DEFAULT_MODEL = "gemini-2.0-flash"

--[[ from_env() -> settings table (raises naming a malformed variable) ]]
function _M.from_env()
  return {
    confirm_on_multi = flag("CONFIRM_ON_MULTI", true),
    enable_relevance_check = flag("ENABLE_RELEVANCE_CHECK", true),
    max_retries = int("MAX_RETRIES", 2, 0, 10),
    llm_model = str("LLM_MODEL"),
    llm_temperature = num("LLM_TEMPERATURE", 0.4, 0, 2),
    google_api_key = str("GOOGLE_API_KEY"),
    data_dir = str("MARKETING_DATA_DIR"),
    pg_url = str("MARKETING_PG_URL"),
    checkpoint_dir = str("MARKETING_CHECKPOINT_DIR") or ".moongraph/marketing",
    tools = choice("MARKETING_TOOLS", { "mcp", "local" }, "mcp"),
  }
end

--[[ llm(settings) -> client | nil
MOONGRAPH_LLM_BASE_URL / MOONGRAPH_LLM_API_KEY first (moongraph's own
configuration), else GOOGLE_API_KEY through Gemini's OpenAI-compatible
endpoint, else nil (offline templates). ]]
function _M.llm(settings)
  local own = (require("moongraph.llm").from_env())
  if own then return own end
  if settings.google_api_key then
    local llm = require "moongraph.llm"
    return llm.new { base_url = _M.GEMINI_BASE_URL, api_key = settings.google_api_key,
      model = settings.llm_model or _M.GEMINI_DEFAULT_MODEL }
  end
  return nil
end

return _M
