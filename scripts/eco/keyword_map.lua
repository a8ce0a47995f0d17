-- Keyword map for intent confidence calibration (Eco² chat worker).
--
-- After an intent is chosen, its confidence gains 0.1 for every keyword of
-- that intent found in the message (at most +0.2), and loses 0.1 when none
-- is found. Keywords only adjust confidence; they never pick the intent.
-- Matching is by substring on the lower-cased message, so "버리" also
-- matches "버리려면" and "kg" matches "KG".
return {
  waste = { "버려", "버리", "분리", "재활용", "쓰레기", "폐기" },
  character = { "캐릭터", "얻", "모아", "컬렉션" },
  location = { "어디", "근처", "가까", "위치", "샵", "제로웨이스트", "재활용센터" },
  bulk_waste = {
    "대형폐기물", "대형", "소파", "냉장고", "세탁기", "가구", "수수료", "신청",
    "가전", "매트리스", "침대",
  },
  recyclable_price = { "시세", "가격", "얼마", "고철", "폐지", "매입", "kg", "킬로" },
  collection_point = {
    "수거함", "의류수거", "폐건전지", "폐형광등", "형광등", "건전지", "의류",
  },
  web_search = { "최신", "최근", "뉴스", "정책", "규제", "발표", "공지" },
  image_generation = { "이미지", "그림", "인포그래픽", "시각", "보여줘", "그려" },
  general = { "안녕", "뭐야", "왜", "어때" },
}
