-- What `moongraph serve` serves when it is given no --script (see
-- moongraph.commands): the Eco² chat pipeline, as the Chat API's "chat".
return {
  { name = "chat", path = "scripts/eco/chat.lua" },
}
