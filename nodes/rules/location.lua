-- What the location node searches for, by what the question mentions.
-- The first rule whose word appears wins; `query` is the Kakao keyword,
-- `category` the category of the sample places used offline.
return {
  radius = 3000, -- metres around the user's point (Kakao allows up to 20000)
  size = 5,      -- places to return (Kakao allows 1..15)
  default = { query = "재활용센터", category = "재활용센터" },
  rules = {
    { words = { "제로웨이스트", "제로 웨이스트", "zero waste", "친환경 가게", "친환경가게" },
      query = "제로웨이스트샵", category = "제로웨이스트샵" },
    { words = { "리필" }, query = "리필스테이션", category = "리필스테이션" },
    { words = { "고물상", "고철", "폐지", "매입", "팔아", "팔 수", "팔고", "팔려", "파는 곳", "사주는" },
      query = "고물상", category = "고물상" },
    { words = { "기부", "아름다운가게", "중고매장", "중고 매장", "나눔" },
      query = "아름다운가게", category = "중고매장" },
    { words = { "재활용센터", "재활용 센터", "중고가구", "중고 가구", "중고가전" },
      query = "재활용센터", category = "재활용센터" },
  },
}
