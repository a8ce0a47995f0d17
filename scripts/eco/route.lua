-- Explain how a message is classified and routed (offline classifier).
--
--   lua5.4 scripts/eco/route.lua [--prev-intent I] [--location L] [--json] "message"

local root = (arg and arg[0] or ""):match("^(.-)scripts[/\\]eco[/\\]route%.lua$") or ""
root = root ~= "" and root or "./"
package.path = root .. "?.lua;" .. root .. "runtime/lua/?.lua;" .. package.path

os.exit(require("scripts.eco.commands").route(arg))
