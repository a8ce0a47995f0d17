-- Rule tables of the store-marketing pipeline: intent keywords, signal
-- thresholds, relevance checks and forbidden words. Plain data, read by
-- scripts/marketing/{router,features,relevance}.lua; edit here to tune.

return {
  -- intent router: the intent with the most keyword hits wins; ties go to
  -- the earlier intent in this list; no hit is GENERAL
  intents = {
    { name = "SNS", keywords = { "sns", "인스타", "인스타그램", "틱톡", "유튜브", "블로그", "홍보", "게시물",
      "해시태그", "릴스", "콘텐츠", "바이럴", "instagram" } },
    { name = "REVISIT", keywords = { "재방문", "단골", "리텐션", "재구매", "쿠폰", "멤버십", "스탬프",
      "다시 오", "충성", "retention" } },
    { name = "ISSUE", keywords = { "문제", "이슈", "원인", "진단", "개선", "하락", "감소", "떨어", "약점", "왜" } },
  },
  default_intent = "GENERAL",

  -- feature builder thresholds (the seed's)
  signals = {
    RETENTION_ALERT = { field = "revisit_rate", op = "<", value = 0.2,
      label = "재방문율이 20% 미만입니다" },
    CHANNEL_MIX_ALERT = { field = "delivery_share", op = ">=", value = 0.5,
      label = "배달 매출 비중이 50% 이상입니다" },
    NEW_CUSTOMER_FOCUS = { field = "new_customer_share", op = ">", value = 0.4,
      label = "신규 고객 비중이 40%를 넘습니다" },
  },

  -- channel hints by the largest age group
  channels_by_age = {
    ["20대"] = { "인스타그램 릴스", "틱톡 숏폼" },
    ["30대"] = { "인스타그램 피드", "네이버 블로그 리뷰" },
    ["40대"] = { "네이버 플레이스 리뷰", "카카오톡 채널" },
    ["50대+"] = { "카카오톡 채널", "네이버 밴드 지역 모임" },
  },

  -- relevance check
  relevance = {
    min_length = 150,          -- characters of the draft
    max_length = 4000,
    min_intent_keywords = 2,   -- intent keywords the draft must contain
    -- data terms: the draft must cite at least one
    data_terms = { "재방문", "신규", "배달", "매출", "객단가", "고객", "유동인구", "비중", "연령" },
    -- per intent: words a draft for that intent is expected to use
    intent_keywords = {
      SNS = { "sns", "인스타", "게시물", "해시태그", "릴스", "콘텐츠", "채널", "리뷰", "이벤트" },
      REVISIT = { "재방문", "단골", "쿠폰", "멤버십", "스탬프", "적립", "리텐션", "재구매" },
      ISSUE = { "문제", "원인", "개선", "진단", "하락", "감소", "위험", "리스크" },
      GENERAL = { "전략", "고객", "채널", "매출", "마케팅", "실행" },
    },
    -- promises and claims a response must never make
    forbidden = { "무조건", "100% 보장", "반드시 성공", "확실한 수익", "보장합니다", "대박 보장" },
  },
}
