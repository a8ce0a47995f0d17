-- Evaluate routing on a labelled JSONL file (offline classifier).
--
--   lua5.4 scripts/eco/eval_cli.lua [--json] FILE.jsonl
--
-- A progress bar is drawn on stderr while stdout is a terminal.

local root = (arg and arg[0] or ""):match("^(.-)scripts[/\\]eco[/\\]eval_cli%.lua$") or ""
root = root ~= "" and root or "./"
package.path = root .. "?.lua;" .. root .. "runtime/lua/?.lua;" .. package.path

local is_tty = os.execute("test -t 1") == true
os.exit(require("scripts.eco.commands").eval(arg, { is_tty = is_tty }))
