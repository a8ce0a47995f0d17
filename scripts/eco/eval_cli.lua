-- Evaluate routing on a labelled JSONL file.
--
--   lua5.4 scripts/eco/eval_cli.lua [--json] FILE.jsonl
--
-- Prints accuracy of intents, additional intents and node sets, per-intent
-- precision and recall, the confusion matrix and the failing cases (or the
-- whole report as one JSON line with --json). A progress bar is drawn on
-- stderr while stdout is a terminal.

local root = (arg and arg[0] or ""):match("^(.-)scripts[/\\]eco[/\\]eval_cli%.lua$") or ""
package.path = (root ~= "" and root or "./") .. "?.lua;" .. package.path

local eval = require "scripts.eco.eval"

local usage = "usage: eval_cli.lua [--json] FILE.jsonl"
local as_json, path = false, nil
for _, a in ipairs(arg) do
  if a == "--json" then
    as_json = true
  elseif a == "-h" or a == "--help" then
    print(usage)
    os.exit(0)
  elseif a:sub(1, 2) == "--" or path then
    io.stderr:write(usage, "\n")
    os.exit(2)
  else
    path = a
  end
end
if not path then
  io.stderr:write(usage, "\n")
  os.exit(2)
end

local lines, err = eval.read_lines(path)
if not lines then
  io.stderr:write("eval: ", err, "\n")
  os.exit(1)
end
local is_tty = os.execute("test -t 1") == true
local report, rerr = eval.eval(lines, {
  is_tty = is_tty,
  write = function(s) io.stderr:write(s) end,
})
if not report then
  io.stderr:write("eval: ", path, ": ", rerr, "\n")
  os.exit(1)
end
if as_json then
  io.stdout:write(eval.json(report), "\n")
else
  io.stdout:write(eval.text(report))
end
