-- Shared by the application commands (route, eval, chat, worker): the LLM
-- client configured by the environment, and terminal detection.
local _M = {}

-- An LLM client when MOONGRAPH_LLM_BASE_URL or MOONGRAPH_LLM_API_KEY is set,
-- else nil (the offline paths are used).
function _M.llm_from_env()
  if not (os.getenv("MOONGRAPH_LLM_BASE_URL") or os.getenv("MOONGRAPH_LLM_API_KEY")) then
    return nil
  end
  local ok, llm = pcall(require, "moongraph.llm")
  if not ok then return nil end
  return llm.new{}
end

function _M.isatty(fd)
  local ok, rl = pcall(require, "moongraph.repl_core")
  return ok and rl.isatty(fd) or false
end

return _M
