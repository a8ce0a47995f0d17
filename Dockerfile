# The moongraph worker container: `moongraph worker` with the application
# (scripts/, nodes/, prompts/, data/, and web/ for `moongraph serve`) in /app.
#
#   docker build -t moongraph-worker .
#   docker run -e MOONGRAPH_REDIS_URL=redis://redis:6379/0 \
#              -e MOONGRAPH_PG_URL=postgresql://moongraph@postgres/moongraph moongraph-worker
#
# Build stage: the packages of tools/debian-packages.txt (what `make deps`
# installs) except the ones only the test suite uses, then `make` as in the
# README. spec/worker_deploy_spec.lua checks that the lists stay in step.
#
#   test-only (not installed here): lua-busted redis-server postgresql procps iproute2 graphviz luarocks nodejs npm curl lua-socket wrk libh2o-dev chromium fonts-noto-cjk
#   (procps and iproute2 give the specs ps and ss; luarocks serves `luarocks
#   make`, which the image does not use; nodejs and npm run the official MCP peers of the MCP specs;
#   graphviz renders the drawings `moongraph draw` and app:draw make; curl and
#   lua-socket are the HTTP server specs' clients; wrk and libh2o-dev serve
#   `make bench-server`; chromium and fonts-noto-cjk run the web page's spec)

FROM debian:12-slim AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential pkg-config ca-certificates openssl lua5.4 liblua5.4-dev lua-cjson \
      libuv1-dev libcurl4-openssl-dev libssl-dev libhiredis-dev libpq-dev libedit-dev \
      libhttp-parser-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile ./
COPY tools/ tools/
COPY runtime/ runtime/
RUN make

# Runtime stage: the shared libraries the binary links (readelf -d) or opens
# on first use (libcurl, libpq: runtime/lazylib.h) and the Lua C module it
# loads, each from a package of tools/debian-packages.txt:
#
#   liblua5.4-0     <- liblua5.4-dev
#   libuv1          <- libuv1-dev
#   libcurl4        <- libcurl4-openssl-dev
#   libhiredis0.14  <- libhiredis-dev
#   libpq5          <- libpq-dev
#   libedit2        <- libedit-dev
#   libssl3         <- libssl-dev
#   libhttp-parser2.9 <- libhttp-parser-dev
#   lua-cjson       <- lua-cjson
#   ca-certificates <- ca-certificates

FROM debian:12-slim
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      liblua5.4-0 libuv1 libcurl4 libhiredis0.14 libpq5 libedit2 libssl3 libhttp-parser2.9 \
      lua-cjson ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /app --shell /usr/sbin/nologin moongraph
COPY --from=build /src/moongraph /usr/local/bin/moongraph
WORKDIR /app
COPY scripts/ scripts/
COPY nodes/ nodes/
COPY prompts/ prompts/
COPY data/ data/
COPY web/ web/
USER moongraph
# The pipeline the worker runs (the worker has no default; NAME=PATH, more
# than one comma-separated): the Eco² chat pipeline of this repository.
ENV MOONGRAPH_WORKER_SCRIPT=chat=scripts/eco/chat.lua
# SIGTERM drains: running jobs get --grace seconds (25 by default), so give
# the container at least that before it is killed.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/moongraph"]
CMD ["worker", "--concurrency", "32"]
