-- Disposal tips by forecast condition, in the order they are offered.
-- `when` names a condition computed by the weather node: rain, snow, hot,
-- cold, clear.
return {
  { when = "rain", text = "비 예보가 있으니 종이류·박스는 젖지 않게 실내에 보관했다가 비가 그친 뒤 내놓으세요." },
  { when = "rain", text = "재활용품은 뚜껑 있는 곳에 두고, 음식물 쓰레기는 빗물이 들어가지 않게 용기 뚜껑을 꼭 닫으세요." },
  { when = "snow", text = "눈 예보가 있으니 종이류는 젖지 않게 보관하고, 배출 장소가 미끄러우니 조심하세요." },
  { when = "hot", text = "기온이 높아 음식물 쓰레기가 빨리 상하니 물기를 꼭 빼고 자주 비우세요." },
  { when = "cold", text = "기온이 낮아 음식물 쓰레기가 용기에 얼어붙기 쉬우니 물기를 최대한 빼서 버리세요." },
  { when = "clear", text = "비 소식이 없어 종이류·재활용품을 내놓기 좋은 날씨예요." },
  thresholds = { rain_pop = 60, hot_tmp = 28, cold_tmp = -5 },
}
