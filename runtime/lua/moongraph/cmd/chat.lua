-- moongraph chat [--thread ID] [--location L] [--trace FILE] [--json] "message"
-- One turn of the Eco² chat pipeline (scripts/eco/chat.lua, run from the
-- repository root): the answer streams to stdout, the steps and their
-- timings go to stderr, turns are checkpointed per thread.
--
-- The LLM comes from MOONGRAPH_LLM_BASE_URL / _API_KEY / _MODEL; when they
-- are set but do not make a working client, the reason is printed and the
-- turn runs offline.
local function llm_from_env(errw)
  local function set(name)
    local v = os.getenv(name)
    return v ~= nil and v ~= ""
  end
  if not (set("MOONGRAPH_LLM_BASE_URL") or set("MOONGRAPH_LLM_API_KEY")) then return nil end
  local found, llm = pcall(require, "moongraph.llm")
  if not found then
    errw:write("moongraph chat: MOONGRAPH_LLM_* is set but moongraph.llm is not available; answering offline\n")
    return nil
  end
  local ok, client, err = pcall(llm.new, {})
  if not ok or not client then
    errw:write("moongraph chat: no LLM: ", tostring(ok and err or client), "; answering offline\n")
    return nil
  end
  return client
end

return {
  main = function(args)
    local found, command = pcall(require, "scripts.eco.chat_command")
    if not found then
      if tostring(command):find("module 'scripts.eco.chat_command' not found", 1, true) then
        io.stderr:write("moongraph chat: the Eco² pipeline (scripts/eco/) is not on the module path; ",
          "run from the repository root or set MOONGRAPH_PATH to it\n")
        return 1
      end
      error(command, 0)
    end
    return command.run(args, { llm = llm_from_env(io.stderr) })
  end,
}
