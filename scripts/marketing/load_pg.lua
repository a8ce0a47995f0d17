-- Load the marketing dataset into PostgreSQL, so the pipeline can read it
-- from there (MARKETING_PG_URL):
--
--   ./moongraph run scripts/marketing/load_pg.lua postgresql://user@host/db [DATA_DIR]
--
-- Creates the tables of scripts/marketing/tools.lua PG_SCHEMA if missing and
-- upserts every row; the sample marks of data/marketing/ are kept.
local args = { ... }
local url = args[1] or os.getenv("MARKETING_PG_URL")
if not url then
  io.stderr:write("usage: moongraph run scripts/marketing/load_pg.lua URL [DATA_DIR]\n")
  return 2
end
local pg = require "moongraph.pg"
local tools = require "scripts.marketing.tools"
local db, err = pg.connect(url)
if not db then
  io.stderr:write("load_pg: cannot connect: ", tostring(err), "\n")
  return 1
end
local ok, lerr = tools.load_sample_into_pg(db, args[2])
db:close()
if not ok then
  io.stderr:write("load_pg: ", tostring(lerr), "\n")
  return 1
end
print("loaded the marketing dataset into " .. url:gsub("//[^@/]*@", "//"))
return 0
