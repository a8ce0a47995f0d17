package = "moongraph"
version = "scm-1"
source = {
  url = "git+file://.",
}
description = {
  summary = "Lua-scriptable orchestration runtime for LLM agent pipelines",
  detailed = [[
    A C runtime (libuv loop, libcurl multi, hiredis, libpq) that runs each
    graph branch in its own coroutine, with a LangGraph-style graph engine,
    HTTP/LLM/Redis/Postgres primitives and checkpointing, scripted in Lua.
  ]],
  license = "MIT",
}
dependencies = {
  "lua >= 5.4",
  -- lua-cjson comes from Debian (lua-cjson), installed by `make deps`.
}
build = {
  type = "make",
  build_target = "lib/moongraph/core.so",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
  },
  install_variables = {
    LUADIR = "$(LUADIR)",
    LIBDIR = "$(LIBDIR)",
  },
}
