-- One turn of the store-marketing pipeline from the command line:
--
--   ./moongraph run scripts/marketing/run.lua "본죽 문제점이 뭐야?"
--   ./moongraph run scripts/marketing/run.lua --thread ID --store "본죽 강남역점"
--
-- The same as `moongraph marketing ...`; see scripts/marketing/cli.lua.
return require("scripts.marketing.cli").main({ ... })
