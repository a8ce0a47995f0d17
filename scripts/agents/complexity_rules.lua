-- Rules of the offline complexity classifier (scripts/agents/complexity.lua).
-- A request is "complex" when any rule fires, else "simple". Edit freely:
-- the table is read on each classification.
return {
  -- words or phrases that ask for analysis rather than a fact (lower case)
  markers = {
    "compare", "comparison", "analyze", "analyse", "analysis", "why", "explain",
    "design", "trade-off", "tradeoff", "trade-offs", "pros and cons", "step by step",
    "evaluate", "strategy", "architecture", "plan for", "in depth",
    "비교", "분석", "왜", "설계", "장단점", "전략", "평가", "단계별",
  },
  -- more words than this is complex
  max_simple_words = 25,
  -- this many question marks or more is complex (several questions at once)
  min_questions = 2,
}
