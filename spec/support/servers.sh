#!/bin/sh
# servers.sh — throwaway redis-server and PostgreSQL instances for specs and
# benchmarks.
#
# Each instance lives in its own temporary directory (data, sockets, log and a
# `server.env` describing it) and listens on 127.0.0.1 on a free port plus a
# unix socket inside that directory. PostgreSQL runs as an unprivileged user
# when the caller is root (`moongraph-test`, created on first use). An
# instance started with `--owner PID` is destroyed by a watchdog once that
# process is gone, so an aborted test run leaves nothing behind.
#
#   servers.sh redis start [--persist | --appendfsync MODE] [--password PW] [--owner PID]
#                          [--replicaof PORT | --sentinel-of PORT SENTINEL_OPTIONS]
#       --persist: appendonly with appendfsync always (nothing acknowledged is
#       lost, even to kill -9); --appendfsync everysec|no: appendonly, that policy
#       --replicaof PORT: a replica of the server on 127.0.0.1:PORT (with
#       masterauth PW when --password is given)
#       --sentinel-of PORT: a Redis Sentinel (redis-server --sentinel, its
#       --password is the sentinel's own) monitoring 127.0.0.1:PORT; options
#       --master-name NAME (mymaster) --quorum N (2) --down-after MS (1000)
#       --failover-timeout MS (3000) --master-password PW
#   servers.sh pg start [--durable] [--owner PID]
#       without --durable: fsync and full_page_writes off (fast; survives a
#       server crash or restart, not a machine crash)
#       print `key=value` lines (dir, port, url, unix_url, ...) on success;
#       on failure print the reason and the log tail on stderr, exit 1.
#   servers.sh stop DIR [MODE]    redis: term | kill   pg: fast | immediate
#   servers.sh start DIR          start a stopped instance again (same port)
#   servers.sh restart DIR [MODE] stop then start
#   servers.sh status DIR         exit 0 when the server answers
#   servers.sh destroy DIR        stop (if running) and remove DIR
#
# Readiness is always polled with a bound (SERVERS_WAIT seconds, default 30);
# nothing here sleeps to "let a server settle".
set -eu
# Servers and tools run without a sanitizer preload inherited from `make asan`.
unset LD_PRELOAD

PROG=$0
WAIT=${SERVERS_WAIT:-30}
PG_USER=${SERVERS_PG_USER:-moongraph-test}

die() { echo "servers.sh: $*" >&2; exit 1; }

# `ss` (iproute2) is how a free port is found; without it nothing can be
# told free, and a port is never guessed.
need_ss() {
  command -v ss >/dev/null 2>&1 ||
    die "ss not found (install the iproute2 package): it is how a free TCP port is found"
}

# A random TCP port in 20000..59999 that nothing listens on right now. The
# caller still handles "address in use" (another process may take it first).
free_port() {
  need_ss
  i=0
  while [ $i -lt 50 ]; do
    n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
    p=$((20000 + n % 40000))
    listening=$(ss -Hltn "sport = :$p") || die "ss -Hltn failed; cannot tell whether port $p is free"
    if [ -z "$listening" ]; then
      echo "$p"; return 0
    fi
    i=$((i + 1))
  done
  die "no free TCP port found"
}

# Poll `cmd` every 50 ms until it succeeds, for at most $WAIT seconds.
# Stops early (status 2) when the process $2 is gone.
wait_until() {
  cmd=$1 pid=${2:-}
  deadline=$(( $(date +%s) + WAIT ))
  while :; do
    if eval "$cmd" >/dev/null 2>&1; then return 0; fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 2; fi
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}

# Wait until process $1 has exited, at most $WAIT seconds.
wait_gone() {
  deadline=$(( $(date +%s) + WAIT ))
  while kill -0 "$1" 2>/dev/null; do
    # a zombie child of ours counts as gone
    case "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" in Z) return 0 ;; esac
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}

log_tail() { [ -f "$1" ] && tail -n 15 "$1" | sed 's/^/    /' >&2 || true; }

load_env() {
  [ -f "$1/server.env" ] || die "$1 is not a server directory (no server.env)"
  # shellcheck disable=SC1090
  . "$1/server.env"
}

start_watchdog() {
  owner=$1 dir=$2
  [ -n "$owner" ] || return 0
  # Detached, with stdio closed: a caller reading our stdout through a pipe
  # must see EOF when this script exits.
  setsid sh -c '
    while kill -0 "$1" 2>/dev/null && [ -f "$2/server.env" ]; do sleep 1; done
    [ -f "$2/server.env" ] && "$3" destroy "$2"
  ' watchdog "$owner" "$dir" "$PROG" </dev/null >/dev/null 2>&1 &
}

make_dir() {
  d=$(mktemp -d "${TMPDIR:-/tmp}/moongraph-$1.XXXXXX")
  chmod 755 "$d"
  echo "$d"
}

# ---------------------------------------------------------------- redis

redis_launch() {
  dir=$1
  # (SENTINEL comes from server.env)
  setsid redis-server "$dir/redis.conf" ${SENTINEL:+--sentinel} </dev/null >>"$dir/redis.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/redis.pid"
  rc=0
  wait_until "redis-cli -s '$dir/redis.sock' ${REDIS_PASSWORD:+-a '$REDIS_PASSWORD' --no-auth-warning} ping | grep -q PONG" "$pid" || rc=$?
  if [ $rc -ne 0 ]; then
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/redis.pid"
    if grep -q "Address already in use" "$dir/redis.log" 2>/dev/null; then return 2; fi
    return 1
  fi
}

redis_start_new() {
  persist=no password="" owner="" replicaof="" sentinel_of=""
  master_name=mymaster quorum=2 down_after=1000 failover_timeout=3000 master_password=""
  while [ $# -gt 0 ]; do
    case $1 in
      --replicaof) replicaof=$2; shift ;;
      --sentinel-of) sentinel_of=$2; shift ;;
      --master-name) master_name=$2; shift ;;
      --quorum) quorum=$2; shift ;;
      --down-after) down_after=$2; shift ;;
      --failover-timeout) failover_timeout=$2; shift ;;
      --master-password) master_password=$2; shift ;;
      --persist) persist=always ;;
      --appendfsync)
        case ${2:-} in always|everysec|no) persist=$2 ;; *) die "redis start: --appendfsync always|everysec|no" ;; esac
        shift ;;
      --password) password=$2; shift ;;
      --owner) owner=$2; shift ;;
      *) die "redis start: unknown option $1" ;;
    esac
    shift
  done
  command -v redis-server >/dev/null || die "redis-server not found (install the redis-server package)"
  command -v redis-cli >/dev/null || die "redis-cli not found (install the redis-tools package)"
  need_ss
  dir=$(make_dir redis)
  attempt=0
  while :; do
    port=$(free_port) || { rm -rf "$dir"; exit 1; }
    {
      echo "port $port"
      echo "bind 127.0.0.1"
      echo "unixsocket $dir/redis.sock"
      echo "unixsocketperm 700"
      echo "dir $dir"
      echo "daemonize no"
      echo "enable-debug-command local"
      echo 'logfile ""'
      if [ -n "$sentinel_of" ]; then
        echo "sentinel monitor $master_name 127.0.0.1 $sentinel_of $quorum"
        echo "sentinel down-after-milliseconds $master_name $down_after"
        echo "sentinel failover-timeout $master_name $failover_timeout"
        [ -n "$master_password" ] && echo "sentinel auth-pass $master_name $master_password"
        # sentinels talk to each other with the password they require
        [ -n "$password" ] && echo "sentinel sentinel-pass $password"
      else
        echo 'save ""'
        if [ $persist != no ]; then
          echo "appendonly yes"
          echo "appendfsync $persist"
        else
          echo "appendonly no"
        fi
        if [ -n "$replicaof" ]; then
          echo "replicaof 127.0.0.1 $replicaof"
          [ -n "$password" ] && echo "masterauth $password"
        fi
      fi
      [ -n "$password" ] && echo "requirepass $password"
    } >"$dir/redis.conf"
    {
      echo "KIND=redis"
      echo "PORT=$port"
      echo "REDIS_PASSWORD='$password'"
      [ -n "$sentinel_of" ] && echo "SENTINEL=yes"
    } >"$dir/server.env"
    SENTINEL=""
    [ -n "$sentinel_of" ] && SENTINEL=yes
    REDIS_PASSWORD=$password
    rc=0
    redis_launch "$dir" || rc=$?
    [ $rc -eq 0 ] && break
    attempt=$((attempt + 1))
    if [ $rc -ne 2 ] || [ $attempt -ge 10 ]; then
      echo "servers.sh: redis-server did not start (dir $dir); log:" >&2
      log_tail "$dir/redis.log"
      rm -rf "$dir"
      exit 1
    fi
    : >"$dir/redis.log"
  done
  start_watchdog "$owner" "$dir"
  auth=""
  [ -n "$password" ] && auth=":$password@"
  echo "kind=redis"
  echo "dir=$dir"
  echo "host=127.0.0.1"
  echo "port=$port"
  echo "pid=$(cat "$dir/redis.pid")"
  echo "socket=$dir/redis.sock"
  echo "url=redis://${auth}127.0.0.1:$port/0"
  echo "unix_url=unix://${auth}$dir/redis.sock"
}

redis_stop() {
  dir=$1 mode=${2:-term}
  [ -f "$dir/redis.pid" ] || return 0
  pid=$(cat "$dir/redis.pid")
  case $mode in
    term) kill -TERM "$pid" 2>/dev/null || true ;;
    kill) kill -KILL "$pid" 2>/dev/null || true ;;
    *) die "redis stop: mode must be term or kill, not $mode" ;;
  esac
  wait_gone "$pid" || { kill -KILL "$pid" 2>/dev/null || true; wait_gone "$pid" || true; }
  rm -f "$dir/redis.pid" "$dir/redis.sock"
}

redis_start_again() {
  dir=$1
  [ -f "$dir/redis.pid" ] && kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null && return 0
  if ! redis_launch "$dir"; then
    echo "servers.sh: redis-server did not start again on port $PORT (dir $dir); log:" >&2
    log_tail "$dir/redis.log"
    exit 1
  fi
  echo "pid=$(cat "$dir/redis.pid")"
}

# ---------------------------------------------------------------- postgres

pg_bindir() {
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
      echo "$d"; return 0
    fi
  done
  if p=$(command -v initdb 2>/dev/null); then dirname "$p"; return 0; fi
  return 1
}

# Commands run as the database owner: ourselves, or $PG_USER when root
# (PostgreSQL refuses to run as root).
pg_as() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u "$PG_USER" -- "$@"; else "$@"; fi
}

pg_ensure_user() {
  [ "$(id -u)" -eq 0 ] || return 0
  if id -u "$PG_USER" >/dev/null 2>&1; then pg_user_can_run; return 0; fi
  useradd --system --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin "$PG_USER" 2>/dev/null || true
  id -u "$PG_USER" >/dev/null 2>&1 || die "could not create the unprivileged user $PG_USER for PostgreSQL"
  pg_user_can_run
}

# The unprivileged user must be able to reach the programs: a root
# directory only root may enter (a chroot unpacked into a `mktemp -d`
# directory has mode 0700) makes every exec fail with EACCES.
pg_user_can_run() {
  runuser -u "$PG_USER" -- true 2>/dev/null && return 0
  if [ -z "$(find / -maxdepth 0 -perm -o=x)" ]; then
    chmod o+x / && echo "servers.sh: / was not searchable by other users; made it so for $PG_USER" >&2
  fi
  runuser -u "$PG_USER" -- true || die "the unprivileged user $PG_USER cannot run programs (check the permissions of / and /usr)"
}

# A freshly initdb'd cluster, made once per PostgreSQL version and user and
# copied for every instance (initdb costs seconds, a copy a fraction of that).
pg_template() {
  bindir=$1
  ver=$("$bindir/postgres" -V | sed -n "s/^[^0-9]*\([0-9][0-9.]*\).*/\1/p")
  tpl="${TMPDIR:-/tmp}/moongraph-pg-template-$ver-$(pg_as id -u)"
  if [ ! -f "$tpl/PG_VERSION" ]; then
    tmp="$tpl.tmp.$$"
    rm -rf "$tmp"
    if ! pg_as "$bindir/initdb" -D "$tmp" -A trust -U postgres -E UTF8 \
         --locale=C.UTF-8 --no-sync >"${TMPDIR:-/tmp}/moongraph-initdb.$$.log" 2>&1; then
      echo "servers.sh: initdb failed:" >&2
      log_tail "${TMPDIR:-/tmp}/moongraph-initdb.$$.log"
      rm -rf "$tmp" "${TMPDIR:-/tmp}/moongraph-initdb.$$.log"
      exit 1
    fi
    rm -f "${TMPDIR:-/tmp}/moongraph-initdb.$$.log"
    # Another process may have won the race; its template is as good as ours.
    mv -T "$tmp" "$tpl" 2>/dev/null || rm -rf "$tmp"
  fi
  echo "$tpl"
}

pg_write_conf() {
  dir=$1 port=$2 durable=$3
  fast="fsync = off
full_page_writes = off"
  [ "$durable" = yes ] && fast=""
  # postgresql.auto.conf is read last, so these win over the template's file.
  pg_as sh -c "cat >'$dir/data/postgresql.auto.conf'" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 200
logging_collector = off
$fast
EOF
}

pg_launch() {
  dir=$1
  pg_as touch "$dir/pg.log"
  rc=0
  pg_as "$BINDIR/pg_ctl" -D "$dir/data" -l "$dir/pg.log" -w -t "$WAIT" start >/dev/null 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    head -n 1 "$dir/data/postmaster.pid" >"$dir/pg.pid"
    return 0
  fi
  if grep -q "could not bind\|Address already in use" "$dir/pg.log" 2>/dev/null; then return 2; fi
  return 1
}

pg_start_new() {
  owner="" durable=no
  while [ $# -gt 0 ]; do
    case $1 in
      --owner) owner=$2; shift ;;
      --durable) durable=yes ;;
      *) die "pg start: unknown option $1" ;;
    esac
    shift
  done
  BINDIR=$(pg_bindir) || die "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (install the postgresql package)"
  command -v psql >/dev/null || die "psql not found (install postgresql-client)"
  need_ss
  pg_ensure_user
  tpl=$(pg_template "$BINDIR")
  dir=$(make_dir pg)
  [ "$(id -u)" -eq 0 ] && chown "$PG_USER" "$dir"
  cp -a "$tpl" "$dir/data"
  attempt=0
  while :; do
    port=$(free_port) || { rm -rf "$dir"; exit 1; }
    pg_write_conf "$dir" "$port" "$durable"
    {
      echo "KIND=pg"
      echo "PORT=$port"
      echo "BINDIR=$BINDIR"
    } >"$dir/server.env"
    rc=0
    pg_launch "$dir" || rc=$?
    [ $rc -eq 0 ] && break
    attempt=$((attempt + 1))
    if [ $rc -ne 2 ] || [ $attempt -ge 10 ]; then
      echo "servers.sh: PostgreSQL did not start (dir $dir); log:" >&2
      log_tail "$dir/pg.log"
      rm -rf "$dir"
      exit 1
    fi
  done
  start_watchdog "$owner" "$dir"
  echo "kind=pg"
  echo "dir=$dir"
  echo "host=127.0.0.1"
  echo "port=$port"
  echo "pid=$(cat "$dir/pg.pid")"
  echo "socket_dir=$dir"
  echo "bindir=$BINDIR"
  echo "url=postgresql://postgres@127.0.0.1:$port/postgres"
  echo "unix_url=postgresql://postgres@/postgres?host=$dir&port=$port"
}

pg_stop() {
  dir=$1 mode=${2:-fast}
  case $mode in fast|immediate|smart) ;; *) die "pg stop: mode must be fast or immediate, not $mode" ;; esac
  [ -f "$dir/data/postmaster.pid" ] || { rm -f "$dir/pg.pid"; return 0; }
  pg_as "$BINDIR/pg_ctl" -D "$dir/data" -m "$mode" -w -t "$WAIT" stop >/dev/null 2>&1 || true
  rm -f "$dir/pg.pid"
}

pg_start_again() {
  dir=$1
  if [ -f "$dir/data/postmaster.pid" ] && pg_as "$BINDIR/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    return 0
  fi
  if ! pg_launch "$dir"; then
    echo "servers.sh: PostgreSQL did not start again on port $PORT (dir $dir); log:" >&2
    log_tail "$dir/pg.log"
    exit 1
  fi
  echo "pid=$(cat "$dir/pg.pid")"
}

# ---------------------------------------------------------------- dispatch

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  redis|pg)
    sub=${1:-}; [ $# -gt 0 ] && shift
    [ "$sub" = start ] || die "usage: servers.sh $cmd start [options]"
    if [ "$cmd" = redis ]; then redis_start_new "$@"; else pg_start_new "$@"; fi
    ;;
  stop|start|restart|status|destroy)
    dir=${1:-}; [ -n "$dir" ] || die "usage: servers.sh $cmd DIR"
    mode=${2:-}
    if [ "$cmd" = destroy ] && [ ! -f "$dir/server.env" ]; then exit 0; fi
    load_env "$dir"
    case "$KIND:$cmd" in
      redis:stop) redis_stop "$dir" "${mode:-term}" ;;
      redis:start) redis_start_again "$dir" ;;
      redis:restart) redis_stop "$dir" "${mode:-term}"; redis_start_again "$dir" ;;
      redis:status) redis-cli -s "$dir/redis.sock" ${REDIS_PASSWORD:+-a "$REDIS_PASSWORD" --no-auth-warning} ping 2>/dev/null | grep -q PONG ;;
      redis:destroy) redis_stop "$dir" kill; rm -rf "$dir" ;;
      pg:stop) pg_stop "$dir" "${mode:-fast}" ;;
      pg:start) pg_start_again "$dir" ;;
      pg:restart) pg_stop "$dir" "${mode:-fast}"; pg_start_again "$dir" ;;
      pg:status) psql -h "$dir" -p "$PORT" -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1 ;;
      pg:destroy) pg_stop "$dir" immediate; rm -rf "$dir" ;;
    esac
    ;;
  *)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
