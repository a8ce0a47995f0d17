-- The store-marketing command of the moongraph executable (see moongraph.commands).
return {
  marketing = { summary = "one turn of the store-marketing pipeline", module = "scripts.marketing.cli" },
}
