-- The Eco² commands of the moongraph executable (see moongraph.commands).
return {
  chat = { summary = "ask the Eco² chat pipeline (streams the answer; --thread continues a conversation)",
           module = "scripts.eco.chat_command" },
  route = { summary = "explain the Eco² routing decision for a message", module = "scripts.eco.route_command" },
  eval = { summary = "score the Eco² router on a labelled .jsonl file", module = "scripts.eco.eval_command" },
}
