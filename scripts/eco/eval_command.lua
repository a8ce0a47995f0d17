-- moongraph eval [--json] FILE.jsonl
--
-- Scores the Eco² router on labelled lines ({"message", "intent",
-- "additional_intents", "nodes"}; data/eval_example.jsonl is one):
-- accuracy, per-intent precision and recall, the confusion matrix and the
-- failing cases. A progress bar goes to stderr when stdout is a terminal.
--
-- main(args [, opts]) -> 0 done, 1 the file cannot be scored, 2 bad usage.
-- opts: stdout, stderr (file-like), llm (default: from the environment),
-- is_tty (default: stdout is a terminal).
local args = require "moongraph.args"
local llm = require "moongraph.llm"
local eval = require "scripts.eco.eval"

local _M = {}

_M.SPEC = {
  name = "eval",
  usage = "usage: eval [--json] FILE.jsonl",
  options = { json = "flag" },
  positional = { name = "file", label = "FILE", required = true },
}

local function stdout_is_tty()
  local ok, rl = pcall(require, "moongraph.repl_core")
  return ok and rl.isatty(1) or false
end

function _M.main(argv, opts)
  opts = opts or {}
  local out, err = opts.stdout or io.stdout, opts.stderr or io.stderr
  local o, perr = args.parse(_M.SPEC, argv)
  if not o then return args.usage_error(_M.SPEC, perr, err) end
  if o.help then return args.help(_M.SPEC, out) end
  local lines, rerr = eval.read_lines(o.file)
  if not lines then
    err:write("eval: ", rerr, "\n")
    return 1
  end
  local client = opts.llm
  if client == nil then
    local lerr
    client, lerr = llm.from_env()
    if lerr then err:write("eval: no LLM: ", lerr, "; classifying offline\n") end
  end
  local is_tty = opts.is_tty
  if is_tty == nil then is_tty = stdout_is_tty() end
  local report, e = eval.eval(lines, {
    is_tty = is_tty, llm = client or nil,
    write = function(s) err:write(s) end,
  })
  if not report then
    err:write("eval: ", o.file, ": ", e, "\n")
    return 1
  end
  out:write(o.json and (eval.json(report) .. "\n") or eval.text(report))
  return 0
end

return _M
