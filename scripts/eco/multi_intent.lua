-- How a message is cut into clauses for multi-intent detection, and when a
-- message counts as complex (Eco² chat worker). Data for the intent
-- classifier (nodes/lib/intent_classifier.lua), read on every call.
--
-- A message is cut at sentence marks, commas, conjunction words and words
-- ending in a joining suffix; each clause is classified on its own. The
-- first clause gives the primary intent, other clauses add their intents
-- when the classifier is sure enough. A cut after a single word joined by
-- a particle or a comma is undone: "책상이랑 의자 버리는 비용" and
-- "소파, 침대 버리는 법" are lists of things, not two requests.
return {
  -- always end a clause (".", only when followed by a space or the end)
  sentence_marks = { "?", "!", ";", "\n", "？", "！", "。" },
  -- end a clause unless the clause is a single word (a list of nouns)
  list_marks = { ",", "，", "、" },
  -- words that start a new clause and are dropped
  conjunction_words = {
    "그리고", "그리구", "그리고요", "그리고는", "그리고나서", "또", "또한",
    "그다음", "그다음에", "그담에", "다음으로", "아울러", "추가로", "근데",
    "그런데", "참", "및",
  },
  -- a word ending in one of these ends a clause unless the clause is that
  -- single word; the suffix is dropped from the clause ("책장이랑" -> "책장")
  particle_suffixes = { "이랑", "랑", "하고" },
  -- a word ending in one of these (a request verb joined by -고) ends a clause
  verb_suffixes = { "주고", "주시고", "주구", "해주고", "하시고" },
  -- list words need this many words before the particle or comma to count
  -- as a clause of their own
  min_clause_words = 2,
  -- "X도 알려줘": in a message with no other marker, a word ending in "도"
  -- followed by a request verb marks a second request; the cut before it is
  -- found by trying every word boundary (leaving at least min_clause_words
  -- words before it) and keeping the one the classifier is surest about
  also_suffix = "도",
  request_words = {
    "알려", "찾아", "보여", "그려", "만들어", "검색", "궁금", "추천", "말해",
    "가르쳐", "확인",
  },
  -- a clause after the first adds its intent only with at least this
  -- probability
  min_additional_prob = 0.5,
  -- an "also" cut is kept only when both sides reach this probability
  min_also_prob = 0.6,

  -- complexity: "complex" when the message has several intents or several
  -- questions (clauses ended by a sentence mark, a conjunction or a request
  -- verb), is longer than max_simple_chars characters, or contains one of
  -- the markers (asks to compare, explain in depth, ...)
  complexity = {
    max_simple_chars = 60,
    markers = { "비교", "차이", "자세히", "자세하게", "장단점", "단계별", "정리해", "이유" },
  },
}
