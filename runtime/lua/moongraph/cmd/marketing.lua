-- moongraph marketing [--store NAME] [--thread ID] [--json] "query"
-- One conversation turn of the store-marketing pipeline (scripts/marketing/,
-- run from the repository root); settings come from the environment
-- (CONFIRM_ON_MULTI, ENABLE_RELEVANCE_CHECK, MAX_RETRIES, ...).
return {
  main = function(args)
    return require("scripts.marketing.cli").main(args)
  end,
}
