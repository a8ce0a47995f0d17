-- Chain-of-Intent transition boosts (Eco² chat worker).
--
-- boosts[previous_intent][candidate_intent] is added to the candidate's
-- score before the intent is chosen, so the previous turn can tip a close
-- decision: after "냉장고 버리려면 어떻게 해?" (bulk_waste), "팔 수 있어?"
-- gets +0.08 for recyclable_price. Pairs not listed add nothing.
return {
  waste = {
    location = 0.15,          -- "버리고 싶은데 센터 어디야?"
    character = 0.05,
    collection_point = 0.10,  -- "어디서 버려?" -> 수거함
  },
  bulk_waste = {
    location = 0.12,          -- "대형폐기물 센터 어디야?"
    recyclable_price = 0.08,  -- "냉장고 팔 수 있어?"
  },
  recyclable_price = {
    location = 0.10,          -- "어디서 팔아?"
    collection_point = 0.08,
  },
  collection_point = {
    waste = 0.10,             -- "어떻게 버려?"
    location = 0.08,
  },
  general = {
    waste = 0.10,
    character = 0.05,
    location = 0.08,
  },
  character = {
    waste = 0.08,
  },
}
