-- Run the GCRI workflow on one task from the command line:
--
--   ./moongraph run scripts/gcri/run.lua "make 24 from 4 7 8 8"
--   ./moongraph run scripts/gcri/run.lua --branches 3 --run-dir /tmp/gcri "make 24 from 3 3 8 8"
--
-- The same as `moongraph gcri ...`; see scripts/gcri/cli.lua for the options.
return require("scripts.gcri.cli").main({ ... })
