/*
** pg.c — PostgreSQL connections on the loop (libpq, non-blocking).
**
** A connection userdata owns one PGconn in non-blocking mode and a uv_poll
** handle on PQsocket(), started only while an operation is in flight. It
** runs one operation at a time: the asynchronous connect (PQconnectStart +
** PQconnectPoll), a parameterised statement (PQsendQueryParams, $1..$n
** only) or a multi-statement script (PQsendQuery). A statement whose text
** and parameter types come a second time on a connection is prepared there
** (PQsendPrepare, one more round trip) and from then on executed by name
** (PQsendQueryPrepared): the server parses and plans it once per connection
** instead of every time. Each connection remembers up to STMT_CACHE such
** statements; more are sent unprepared. Statements may also be sent as a
** batch (libpq's pipeline mode): conn:send queues each one without waiting
** and conn:sync sends them with one Sync, so the server answers them all
** in one round trip; an error stops the rest of the batch, and is reported
** with the position of the statement that failed. Results are turned into
** Lua values by the waiting task: rows keyed by column name, with int, float,
** bool, json/jsonb and bytea columns typed; NULL is core.pg.null.
**
** Cancelling a task in the middle of a statement sends PostgreSQL a cancel
** request (from libuv's thread pool: PQcancel blocks) and closes the
** connection, so its state never has to be guessed. Pools, transactions,
** statement timeouts and reconnection live in moongraph/pg.lua.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include <limits.h>
#include "pq_api.h"

#include "mg.h"

#define CONN_MT "moongraph.pg.conn"
#define ERRLEN 512
#define NPARAMS_STACK 16
#define STMT_CACHE 128

/* type OIDs (pg_type.dat) */
#define OID_BOOL 16
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23
#define OID_OID 26
#define OID_JSON 114
#define OID_FLOAT4 700
#define OID_FLOAT8 701
#define OID_NUMERIC 1700
#define OID_JSONB 3802

/* registry keys for the codecs pg.lua installs */
#define REG_ENCODE "moongraph.pg.json_encode"
#define REG_DECODE "moongraph.pg.json_decode"
#define REG_BYTEA "moongraph.pg.bytea_mt"

typedef struct pgconn pgconn;
typedef struct pgop pgop;

/* A statement seen on a connection: prepared from its second use. */
typedef struct pgstmt {
  char *sql;
  Oid *types;
  int n;
  unsigned hash;
  int state;                /* STMT_SEEN, STMT_READY or STMT_NEVER */
  char name[24];
} pgstmt;

enum { STMT_SEEN, STMT_READY, STMT_NEVER };

typedef struct pgpoll {
  uv_poll_t h;
  pgconn *pc;               /* NULL once the connection let go of it */
  int events;               /* what the handle watches for (0: stopped) */
} pgpoll;

/* A command of the batch in flight: a statement, or the prepare that
** precedes its first execution by name. */
typedef struct pgcmd {
  pgstmt *stmt;
  int prepare;
  int index;                /* the statement's position in the batch, from 1 */
  int ticket;               /* > 0: its rows are kept for conn:kept(ticket) */
} pgcmd;

/* The rows of a statement sent with keep, until conn:kept takes them. */
typedef struct pgkept {
  int ticket;
  PGresult *res;
} pgkept;

struct pgconn {
  PGconn *conn;             /* NULL once closed */
  pgpoll *poll;
  int fd;                   /* socket the poll handle watches */
  pgop *op;                 /* operation in flight */
  char err[ERRLEN];         /* why the connection is unusable */
  pgstmt *stmts;            /* STMT_CACHE slots, allocated on first use */
  int nstmts;
  pgcmd *cmds;              /* the batch being sent (pipeline mode) */
  int ncmds, cmds_cap;
  pgkept *kept;             /* rows kept for conn:kept */
  int nkept, kept_cap;
  int last_ticket;
  int nbatch;               /* statements sent in it */
};

enum { OP_CONNECT, OP_QUERY, OP_EXEC, OP_PREPARE, OP_BATCH };

struct pgop {
  mg_waiter w;
  pgconn *pc;
  int kind;
  int flushing;             /* output not yet fully sent */
  int failed;               /* err holds a connection-level failure */
  PGresult *res;            /* result to report */
  pgstmt *stmt;             /* the prepared statement it runs or prepares */
  int nparams;
  int cmd;                  /* OP_BATCH: the command whose results come next */
  int failed_cmd;           /* OP_BATCH: the first command that failed, or -1 */
  uv_timer_t *timer;        /* connect timeout, or the caller's deadline */
  double timeout;
  char err[ERRLEN];
  const char *code;         /* err's code (errors.c) */
  int retryable;
};

/* ---------------------------------------------------------------- helpers */

/* libpq's messages end in a newline and may span lines: make one line. */
static void trim_message(char *s) {
  char *w = s;
  for (char *r = s; *r; r++) {
    if (*r == '\n' || *r == '\t') {
      while (r[1] == '\n' || r[1] == '\t' || r[1] == ' ') r++;
      *w++ = ' ';
    } else *w++ = *r;
  }
  *w = '\0';
  size_t n = strlen(s);
  while (n > 0 && s[n - 1] == ' ') s[--n] = '\0';
}

static void op_fail(pgop *op, const char *code, int retryable, const char *prefix,
                    const char *msg) {
  if (op->failed) return;
  op->failed = 1;
  op->code = code;
  op->retryable = retryable;
  snprintf(op->err, ERRLEN, "%s%s", prefix, msg && msg[0] ? msg : "unknown error");
  trim_message(op->err);
}

static void poll_closed(uv_handle_t *h) { free(h->data); }

static void drop_poll(pgconn *pc) {
  if (!pc->poll) return;
  pc->poll->pc = NULL;
  uv_close((uv_handle_t *)&pc->poll->h, poll_closed);
  pc->poll = NULL;
  pc->fd = -1;
}

static void on_poll(uv_poll_t *h, int status, int events);

/* Watch the connection's current socket for `events`. libpq may switch
** sockets while connecting (another address, SSL retry): follow it. The
** handle is restarted only when what it watches changes (every
** uv_poll_start costs the loop two epoll_ctl calls), or when libuv stopped
** it: it does on an error event (POLLERR), which may also come from an
** earlier socket of the same number that a child process still holds
** between fork and exec, while this one is fine. */
static int watch(pgconn *pc, int events) {
  int fd = PQsocket(pc->conn);
  if (fd < 0) return -1;
  if (pc->poll && pc->fd != fd) drop_poll(pc);
  if (!pc->poll) {
    pgpoll *p = malloc(sizeof *p);
    if (!p) return -1;
    if (uv_poll_init(mg_loop(), &p->h, fd) != 0) { free(p); return -1; }
    p->h.data = p;
    p->pc = pc;
    p->events = 0;
    pc->poll = p;
    pc->fd = fd;
  }
  uv_ref((uv_handle_t *)&pc->poll->h);
  if (pc->poll->events == events && uv_is_active((uv_handle_t *)&pc->poll->h)) return 0;
  pc->poll->events = events;
  return uv_poll_start(&pc->poll->h, events, on_poll);
}

/* Between operations an open connection stays watched for reading, without
** keeping the loop alive: what the server sends meanwhile (a FATAL message,
** the end of the connection on a restart) is read when it comes, and the
** connection is closed then, so it need not be checked before its next use. */
static void unwatch(pgconn *pc) {
  if (!pc->conn || PQstatus(pc->conn) != CONNECTION_OK || watch(pc, UV_READABLE) != 0) {
    drop_poll(pc);
    return;
  }
  uv_unref((uv_handle_t *)&pc->poll->h);
}

static void timer_closed(uv_handle_t *h) { free(h); }

static void op_stop_timer(pgop *op) {
  if (!op->timer) return;
  uv_timer_stop(op->timer);
  uv_close((uv_handle_t *)op->timer, timer_closed);
  op->timer = NULL;
}

static void op_free(pgop *op) {
  op_stop_timer(op);
  if (op->res) PQclear(op->res);
  free(op);
}

/* End the operation in flight and wake its task. */
static void finish(pgconn *pc) {
  pgop *op = pc->op;
  unwatch(pc);
  pc->op = NULL;
  if (op) {
    op_stop_timer(op);
    mg_wake(&op->w);
  }
}

/* Let go of the rows kept for conn:kept. */
static void drop_kept(pgconn *pc) {
  for (int i = 0; i < pc->nkept; i++) PQclear(pc->kept[i].res);
  pc->nkept = 0;
}

/* Keep r for conn:kept(ticket); 0 when out of memory (r is not taken). */
static int keep_rows(pgconn *pc, int ticket, PGresult *r) {
  if (pc->nkept == pc->kept_cap) {
    int cap = pc->kept_cap ? pc->kept_cap * 2 : 4;
    pgkept *k = realloc(pc->kept, sizeof *k * (size_t)cap);
    if (!k) return 0;
    pc->kept = k;
    pc->kept_cap = cap;
  }
  pc->kept[pc->nkept++] = (pgkept){ ticket, r };
  return 1;
}

/* Close the connection for good; `why` is what later calls report. */
static void conn_close(pgconn *pc, const char *why) {
  if (!pc->err[0]) snprintf(pc->err, ERRLEN, "%s", why);
  drop_poll(pc);
  drop_kept(pc);
  pc->ncmds = pc->nbatch = 0;
  if (pc->conn) {
    PQfinish(pc->conn);
    pc->conn = NULL;
  }
}

static void discard_notice(void *arg, const char *message) {
  (void)arg; (void)message;
}

/* libpq could not take what was asked ("cannot connect", "cannot send"):
** close the connection (its state is unknown) and push nil, why. */
static int fail_closed(lua_State *L, pgconn *pc, const char *what) {
  char msg[ERRLEN];
  snprintf(msg, sizeof msg, "pg: %s: %s", what, PQerrorMessage(pc->conn));
  trim_message(msg);
  conn_close(pc, msg);
  return mg_push_error(L, MG_UNAVAILABLE, msg);
}

/* ---------------------------------------------------------------- cancel requests */

typedef struct cancel_work {
  uv_work_t req;
  PGcancel *cancel;
} cancel_work;

static void cancel_run(uv_work_t *req) {
  cancel_work *cw = req->data;
  char buf[256];
  PQcancel(cw->cancel, buf, sizeof buf);
}

static void cancel_after(uv_work_t *req, int status) {
  cancel_work *cw = req->data;
  (void)status;
  PQfreeCancel(cw->cancel);
  free(cw);
}

/* Ask the server to stop the running statement, without blocking the loop. */
static void send_cancel(pgconn *pc) {
  PGcancel *c = PQgetCancel(pc->conn);
  if (!c) return;
  cancel_work *cw = malloc(sizeof *cw);
  if (!cw) { PQfreeCancel(c); return; }
  cw->cancel = c;
  cw->req.data = cw;
  if (uv_queue_work(mg_loop(), &cw->req, cancel_run, cancel_after) != 0) {
    PQfreeCancel(c);
    free(cw);
  }
}

/* ---------------------------------------------------------------- driving */

static void drive_connect(pgconn *pc) {
  pgop *op = pc->op;
  PostgresPollingStatusType st = PQconnectPoll(pc->conn);
  /* libpq may have closed the socket and opened another one, possibly with
  ** the same number: watch afresh after every step */
  drop_poll(pc);
  switch (st) {
    case PGRES_POLLING_READING:
      if (watch(pc, UV_READABLE) != 0) break;
      return;
    case PGRES_POLLING_WRITING:
      if (watch(pc, UV_WRITABLE) != 0) break;
      return;
    case PGRES_POLLING_OK:
      if (PQsetnonblocking(pc->conn, 1) != 0) break;
      finish(pc);
      return;
    default:
      break;
  }
  op_fail(op, MG_UNAVAILABLE, "pg: cannot connect: ", PQerrorMessage(pc->conn));
  conn_close(pc, op->err);
  finish(pc);
}

/* Keep the first error result, else the last result. */
static void keep_result(pgop *op, PGresult *r) {
  if (op->res && PQresultStatus(op->res) == PGRES_FATAL_ERROR) {
    PQclear(r);
    return;
  }
  if (op->res) PQclear(op->res);
  op->res = r;
}

static void drive_query(pgconn *pc, int events) {
  pgop *op = pc->op;
  PGconn *conn = pc->conn;
  if (events & UV_READABLE) {
    if (!PQconsumeInput(conn)) goto broken;
  }
  if (op->flushing) {
    int f = PQflush(conn);
    if (f < 0) goto broken;
    op->flushing = f;
  }
  while (!PQisBusy(conn)) {
    PGresult *r = PQgetResult(conn);
    if (op->kind == OP_BATCH) {
      /* each command's results end with a NULL; the Sync's ends the batch */
      if (!r) { op->cmd++; continue; }
      ExecStatusType st = PQresultStatus(r);
      if (st == PGRES_PIPELINE_SYNC) {
        PQclear(r);
        PQexitPipelineMode(conn);
        finish(pc);
        return;
      }
      if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT) {
        PQclear(r);
        op_fail(op, "invalid", 0, "pg: ", "COPY is not supported by moongraph.pg");
        conn_close(pc, op->err);
        finish(pc);
        return;
      }
      if (st == PGRES_FATAL_ERROR && op->failed_cmd < 0) op->failed_cmd = op->cmd;
      if ((st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) && op->cmd < pc->ncmds &&
          pc->cmds[op->cmd].ticket && keep_rows(pc, pc->cmds[op->cmd].ticket, r))
        continue;
      keep_result(op, r);
      continue;
    }
    if (!r) {
      finish(pc);
      return;
    }
    switch (PQresultStatus(r)) {
      case PGRES_COPY_IN:
        PQclear(r);
        PQputCopyEnd(conn, "COPY FROM STDIN is not supported by moongraph.pg");
        op->flushing = 1;
        continue;
      case PGRES_COPY_OUT: {
        char *buf;
        int n;
        PQclear(r);
        while ((n = PQgetCopyData(conn, &buf, 1)) > 0) PQfreemem(buf);
        if (n == 0) goto wait;              /* more COPY data to come */
        op_fail(op, "invalid", 0, "pg: ", "COPY TO STDOUT is not supported by moongraph.pg");
        continue;
      }
      default:
        keep_result(op, r);
    }
    if (PQstatus(conn) == CONNECTION_BAD) goto broken;
  }
wait:
  if (watch(pc, op->flushing ? UV_READABLE | UV_WRITABLE : UV_READABLE) == 0) return;
broken:
  op_fail(op, MG_UNAVAILABLE, "pg: connection lost: ", PQerrorMessage(conn));
  conn_close(pc, op->err);
  finish(pc);
}

/* The server sent something while no operation waited: read it. Results
** are left to a batch being sent (they are its own); otherwise what came is
** a notice or a FATAL message, and the end of the connection follows. */
static int read_idle(pgconn *pc) {
  PGconn *conn = pc->conn;
  int ok = PQconsumeInput(conn) && PQstatus(conn) == CONNECTION_OK;
  if (ok && !pc->nbatch) {
    PGresult *r;
    while (!PQisBusy(conn) && (r = PQgetResult(conn)) != NULL) PQclear(r);
    ok = PQstatus(conn) == CONNECTION_OK;
  }
  if (!ok) {
    char msg[ERRLEN];
    snprintf(msg, sizeof msg, "pg: connection lost: %s", PQerrorMessage(conn));
    trim_message(msg);
    conn_close(pc, msg);
  }
  return ok;
}

static void on_poll(uv_poll_t *h, int status, int events) {
  pgpoll *p = h->data;
  pgconn *pc = p->pc;
  if (!pc || !pc->conn) return;
  if (!pc->op) {
    (void)read_idle(pc);
    return;
  }
  if (status < 0) events = UV_READABLE | UV_WRITABLE;  /* let libpq see the error */
  if (pc->op->kind == OP_CONNECT) drive_connect(pc);
  else drive_query(pc, events);
}

/* ---------------------------------------------------------------- connect */

static pgconn *check_conn(lua_State *L) {
  return luaL_checkudata(L, 1, CONN_MT);
}

/* The connect timeout, or a statement at its caller's deadline: the
** statement is cancelled on the server and the connection closed (its state
** is unknown), as when the task itself is cancelled. */
static void op_timed_out(uv_timer_t *t) {
  pgop *op = t->data;
  pgconn *pc = op->pc;
  char msg[96];
  if (op->kind == OP_CONNECT) {
    snprintf(msg, sizeof msg, "timeout after %gs", op->timeout);
    op_fail(op, MG_TIMEOUT, "pg: cannot connect: ", msg);
  } else {
    snprintf(msg, sizeof msg, "timeout after %gs, at the caller's deadline", op->timeout);
    op_fail(op, MG_TIMEOUT, "pg: ", msg);
    if (pc->conn) send_cancel(pc);
  }
  conn_close(pc, op->kind == OP_CONNECT ? op->err
                 : "pg: connection closed after a statement ran out of time");
  finish(pc);
}

static void op_start_timer(pgop *op, double sec) {
  op->timer = malloc(sizeof *op->timer);
  if (!op->timer) return;
  op->timeout = sec;
  uv_timer_init(mg_loop(), op->timer);
  op->timer->data = op;
  uv_timer_start(op->timer, op_timed_out, (uint64_t)ceil(sec * 1000.0), 0);
}

static int connect_done(lua_State *L, int status, lua_KContext ctx) {
  pgop *op = (pgop *)ctx;
  (void)status;
  if (op->failed) {
    mg_push_error(L, op->code, op->retryable, op->err);
    op_free(op);
    return 2;
  }
  op_free(op);
  lua_settop(L, 1);
  return 1;
}

static void op_cancel(mg_waiter *w) {
  pgop *op = (pgop *)w;
  pgconn *pc = op->pc;
  if (pc->op == op) {                  /* still running: stop it */
    pc->op = NULL;
    if (op->kind != OP_CONNECT && pc->conn) send_cancel(pc);
    conn_close(pc, op->kind == OP_CONNECT ? "pg: connect cancelled"
                                          : "pg: connection closed after a statement was cancelled");
  }
  op_free(op);
}

/* connect(conninfo [, timeout]) -> conn | nil, err */
static int l_connect(lua_State *L) {
  const char *info = luaL_checkstring(L, 1);
  double timeout = luaL_optnumber(L, 2, 0);
  mg_check_yieldable(L, "pg.connect");
  const char *why = mg_pq_load();
  if (why) {
    lua_pushfstring(L, "pg: %s", why);
    return mg_push_error(L, "unavailable", 0, lua_tostring(L, -1));
  }
  pgconn *pc = lua_newuserdatauv(L, sizeof *pc, 0);
  memset(pc, 0, sizeof *pc);
  pc->fd = -1;
  luaL_setmetatable(L, CONN_MT);
  lua_replace(L, 1);
  lua_settop(L, 1);
  pc->conn = PQconnectStart(info);
  if (!pc->conn) {
    mg_push_error(L, "unavailable", 1, "pg: out of memory");
    return 2;
  }
  PQsetNoticeProcessor(pc->conn, discard_notice, NULL);
  if (PQstatus(pc->conn) == CONNECTION_BAD) return fail_closed(L, pc, "cannot connect");
  pgop *op = calloc(1, sizeof *op);
  if (!op) return luaL_error(L, "pg: out of memory");
  op->pc = pc;
  op->kind = OP_CONNECT;
  pc->op = op;
  double budget = mg_call_budget(L);
  if (budget >= 0 && (timeout <= 0 || budget < timeout)) timeout = budget > 0.001 ? budget : 0.001;
  if (timeout > 0) op_start_timer(op, timeout);
  /* as if PQconnectPoll had asked to write */
  if (watch(pc, UV_WRITABLE) != 0) {
    op_fail(op, MG_UNAVAILABLE, "pg: cannot connect: ", "cannot watch the socket");
    conn_close(pc, op->err);
    pc->op = NULL;
    mg_push_error(L, op->code, op->retryable, op->err);
    op_free(op);
    return 2;
  }
  return mg_await(L, &op->w, op_cancel, connect_done, (lua_KContext)op);
}

/* ---------------------------------------------------------------- parameters */

typedef struct params {
  int n;
  Oid *types;
  const char **values;
  int *lengths;
  int *formats;
  char *nums;               /* formatted numbers, 32 bytes each */
  Oid stypes[NPARAMS_STACK];
  const char *svalues[NPARAMS_STACK];
  int slengths[NPARAMS_STACK];
  int sformats[NPARAMS_STACK];
  char snums[NPARAMS_STACK * 32];
} params;

static void params_free(params *p) {
  if (p->types != p->stypes) {
    free(p->types); free(p->values); free(p->lengths); free(p->formats); free(p->nums);
  }
}

/* Text parameters must be valid UTF-8 without NUL bytes (the server's
** encoding); anything else is sent as bytea. A job's state and answer go
** through here (kilobytes per job, much of it the ASCII of JSON): runs of
** ASCII are taken 8 bytes at a time. */
static int valid_utf8(const unsigned char *s, size_t n) {
  const uint64_t high = 0x8080808080808080ULL, ones = 0x0101010101010101ULL;
  size_t i = 0;
  while (i < n) {
    while (n - i >= 8) {
      uint64_t w;
      memcpy(&w, s + i, 8);
      /* a byte with its high bit set, or a NUL byte: one by one below */
      if ((w & high) || ((w - ones) & ~w & high)) break;
      i += 8;
    }
    if (i >= n) break;
    unsigned char c = s[i];
    size_t k;
    if (c < 0x80) {
      if (c == 0) return 0;
      i++;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF) k = 1;
    else if (c >= 0xE0 && c <= 0xEF) k = 2;
    else if (c >= 0xF0 && c <= 0xF4) k = 3;
    else return 0;
    if (n - i <= k) return 0;
    for (size_t j = 1; j <= k; j++)
      if ((s[i + j] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] >= 0xA0) ||
        (c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] >= 0x90))
      return 0;                                 /* overlong, surrogate, > U+10FFFF */
    i += k + 1;
  }
  return 1;
}

static int is_bytea(lua_State *L, int idx) {
  if (!lua_getmetatable(L, idx)) return 0;
  lua_getfield(L, LUA_REGISTRYINDEX, REG_BYTEA);
  int eq = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return eq;
}

/* Turn the list at stack index t (n entries) into libpq parameters. The
** strings stay on the Lua stack above `t` until the statement is sent, so
** the caller must not pop them before then. Raises on bad values. */
static void params_collect(lua_State *L, params *p, int t, int n) {
  p->n = n;
  p->types = p->stypes; p->values = p->svalues; p->lengths = p->slengths;
  p->formats = p->sformats; p->nums = p->snums;
  if (n > NPARAMS_STACK) {
    p->types = malloc(sizeof(Oid) * (size_t)n);
    p->values = malloc(sizeof(char *) * (size_t)n);
    p->lengths = malloc(sizeof(int) * (size_t)n);
    p->formats = malloc(sizeof(int) * (size_t)n);
    p->nums = malloc(32 * (size_t)n);
    if (!p->types || !p->values || !p->lengths || !p->formats || !p->nums) {
      params_free(p);
      luaL_error(L, "pg: out of memory");
    }
  }
  luaL_checkstack(L, n + 4, "too many parameters");
  for (int i = 0; i < n; i++) {
    char *num = p->nums + 32 * i;
    p->types[i] = 0;
    p->lengths[i] = 0;
    p->formats[i] = 0;
    p->values[i] = NULL;
    lua_rawgeti(L, t, i + 1);                     /* stays on the stack */
    int vi = lua_gettop(L);
    switch (lua_type(L, vi)) {
      case LUA_TNIL:
        break;                                    /* NULL */
      case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, vi) != NULL) goto bad;
        break;                                    /* pg.null */
      case LUA_TBOOLEAN:
        p->types[i] = OID_BOOL;
        p->values[i] = lua_toboolean(L, vi) ? "t" : "f";
        break;
      case LUA_TNUMBER:
        if (lua_isinteger(L, vi)) {
          p->types[i] = OID_INT8;
          snprintf(num, 32, LUA_INTEGER_FMT, lua_tointeger(L, vi));
        } else {
          double x = (double)lua_tonumber(L, vi);
          p->types[i] = OID_FLOAT8;
          if (isnan(x)) snprintf(num, 32, "NaN");
          else if (isinf(x)) snprintf(num, 32, "%s", x > 0 ? "Infinity" : "-Infinity");
          else {
            int prec = 15;
            do snprintf(num, 32, "%.*g", prec, x);
            while (strtod(num, NULL) != x && ++prec <= 17);
          }
        }
        p->values[i] = num;
        break;
      case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, vi, &len);
        if (len > 0x7fffffff) goto bad;
        p->values[i] = s;
        p->lengths[i] = (int)len;
        if (!valid_utf8((const unsigned char *)s, len)) {
          /* not text: send the bytes as they are */
          p->types[i] = OID_BYTEA;
          p->formats[i] = 1;
        }
        break;
      }
      case LUA_TTABLE:
        if (is_bytea(L, vi)) {
          size_t len;
          lua_rawgeti(L, vi, 1);
          const char *s = lua_tolstring(L, -1, &len);
          if (!s) goto bad;
          lua_replace(L, vi);
          p->values[i] = s;
          p->lengths[i] = (int)len;
          p->types[i] = OID_BYTEA;
          p->formats[i] = 1;
        } else {
          lua_getfield(L, LUA_REGISTRYINDEX, REG_ENCODE);
          lua_pushvalue(L, vi);
          if (lua_pcall(L, 1, 1, 0) != LUA_OK || !lua_isstring(L, -1)) {
            const char *m = lua_tostring(L, -1);
            char msg[ERRLEN];
            snprintf(msg, sizeof msg, "bad parameter $%d (cannot encode table as JSON: %s)",
                     i + 1, m ? m : "encoder failed");
            params_free(p);
            luaL_error(L, "%s", msg);
          }
          lua_replace(L, vi);
          p->values[i] = lua_tostring(L, vi);
          p->types[i] = OID_JSONB;
        }
        break;
      default:
        goto bad;
    }
    continue;
  bad:
    {
      const char *tn = luaL_typename(L, vi);
      params_free(p);
      luaL_error(L, "bad parameter $%d (%s cannot be sent to PostgreSQL; "
                    "use pg.null for NULL)", i + 1, tn);
    }
  }
}

/* ---------------------------------------------------------------- results */

static void push_value(lua_State *L, PGresult *r, int row, int col, Oid type) {
  const char *v = PQgetvalue(r, row, col);
  int len = PQgetlength(r, row, col);
  switch (type) {
    case OID_INT2: case OID_INT4: case OID_INT8: case OID_OID:
      if (lua_stringtonumber(L, v) == 0) lua_pushlstring(L, v, (size_t)len);
      break;
    case OID_FLOAT4: case OID_FLOAT8:
      lua_pushnumber(L, (lua_Number)strtod(v, NULL));
      break;
    case OID_BOOL:
      lua_pushboolean(L, v[0] == 't');
      break;
    case OID_BYTEA: {
      size_t n;
      unsigned char *b = PQunescapeBytea((const unsigned char *)v, &n);
      if (b) { lua_pushlstring(L, (const char *)b, n); PQfreemem(b); }
      else lua_pushlstring(L, v, (size_t)len);
      break;
    }
    case OID_JSON: case OID_JSONB:
      lua_getfield(L, LUA_REGISTRYINDEX, REG_DECODE);
      lua_pushlstring(L, v, (size_t)len);
      if (lua_pcall(L, 1, 1, 0) != LUA_OK) {  /* keep the text */
        lua_pop(L, 1);
        lua_pushlstring(L, v, (size_t)len);
      }
      break;
    default:                                    /* numeric, text, dates, ... */
      lua_pushlstring(L, v, (size_t)len);
  }
}

static void push_rows(lua_State *L, PGresult *r) {
  int nrows = PQntuples(r), ncols = PQnfields(r);
  luaL_checkstack(L, ncols + 8, "too many columns");
  lua_createtable(L, nrows, 0);
  int rows = lua_gettop(L);
  /* column names once, as Lua strings */
  for (int c = 0; c < ncols; c++) lua_pushstring(L, PQfname(r, c));
  for (int i = 0; i < nrows; i++) {
    lua_createtable(L, 0, ncols);
    for (int c = 0; c < ncols; c++) {
      lua_pushvalue(L, rows + 1 + c);
      if (PQgetisnull(r, i, c)) lua_pushlightuserdata(L, NULL);
      else push_value(L, r, i, c, PQftype(r, c));
      lua_rawset(L, -3);
    }
    lua_rawseti(L, rows, i + 1);
  }
  lua_settop(L, rows);
}

/* A result's rows and count: the affected or returned row count. */
static void push_rows_count(lua_State *L, PGresult *r) {
  push_rows(L, r);
  const char *t = PQcmdTuples(r);
  if (t && t[0]) lua_pushinteger(L, (lua_Integer)strtoll(t, NULL, 10));
  else lua_pushinteger(L, PQntuples(r));
}

/* Whether waiting can heal a server error: a lost or refused connection
** (class 08), a serialization failure or deadlock (40001, 40P01), the
** server short of resources (53), shutting down or starting (57P01-57P03),
** a lock not free (55P03), a standby asked to write (25006). */
static int retryable_state(const char *s) {
  static const char *const codes[] = {"40001", "40P01", "57P01", "57P02", "57P03",
                                      "55P03", "25006"};
  if (strncmp(s, "08", 2) == 0 || strncmp(s, "53", 2) == 0) return 1;
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (strcmp(s, codes[i]) == 0) return 1;
  return 0;
}

static int push_error(lua_State *L, PGresult *r) {
  const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
  const char *severity = PQresultErrorField(r, PG_DIAG_SEVERITY);
  const char *detail = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL);
  const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  lua_pushnil(L);
  if (primary) {
    if (detail)
      lua_pushfstring(L, "pg: %s: %s (%s)", severity ? severity : "ERROR", primary, detail);
    else
      lua_pushfstring(L, "pg: %s: %s", severity ? severity : "ERROR", primary);
  } else {
    char msg[ERRLEN];
    snprintf(msg, sizeof msg, "pg: %s", PQresultErrorMessage(r));
    trim_message(msg);
    lua_pushstring(L, msg);
  }
  char code[16];
  snprintf(code, sizeof code, "pg:%s", state ? state : "XX000");
  mg_error_new(L, code, state && retryable_state(state));
  if (state) {
    lua_pushstring(L, state);
    mg_error_detail(L, "sqlstate");
  }
  if (detail) {
    lua_pushstring(L, detail);
    mg_error_detail(L, "detail");
  }
  if (state) lua_pushstring(L, state);
  else lua_pushnil(L);
  return 3;
}

static int query_done(lua_State *L, int status, lua_KContext ctx) {
  pgop *op = (pgop *)ctx;
  (void)status;
  int n;
  if (op->failed && !(op->res && PQresultStatus(op->res) == PGRES_FATAL_ERROR)) {
    n = mg_push_error(L, op->code, op->retryable, op->err);
  } else if (!op->res) {
    n = mg_push_error(L, "protocol", 0, "pg: no result");
  } else {
    PGresult *r = op->res;
    switch (PQresultStatus(r)) {
      case PGRES_TUPLES_OK:
      case PGRES_COMMAND_OK:
      case PGRES_EMPTY_QUERY:
        if (op->kind == OP_EXEC) {
          lua_pushboolean(L, 1);
          n = 1;
        } else {
          push_rows_count(L, r);
          n = 2;
        }
        break;
      case PGRES_FATAL_ERROR: {
        /* a table under a prepared statement changed shape (0A000): the
        ** statement goes unprepared from now on; one the session lost
        ** (26000, DEALLOCATE) is prepared again on its next use */
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        if (op->stmt && op->kind == OP_QUERY && state) {
          if (strcmp(state, "0A000") == 0) op->stmt->state = STMT_NEVER;
          else if (strcmp(state, "26000") == 0) op->stmt->state = STMT_SEEN;
        }
        n = push_error(L, r);
        break;
      }
      default:
        lua_pushfstring(L, "pg: unexpected result: %s", PQresStatus(PQresultStatus(r)));
        n = mg_push_error(L, "protocol", 0, lua_tostring(L, -1));
    }
  }
  op_free(op);
  return n;
}

/* ---------------------------------------------------------------- prepared statements */

static unsigned stmt_hash(const char *sql, const Oid *types, int n) {
  unsigned h = 2166136261u;
  for (const unsigned char *c = (const unsigned char *)sql; *c; c++) h = (h ^ *c) * 16777619u;
  for (int i = 0; i < n; i++) h = (h ^ (unsigned)types[i]) * 16777619u;
  return h;
}

/* The connection's record of (sql, types), added as seen when there is
** room; NULL when there is none. */
static pgstmt *stmt_lookup(pgconn *pc, const char *sql, const Oid *types, int n) {
  unsigned h = stmt_hash(sql, types, n);
  for (int i = 0; i < pc->nstmts; i++) {
    pgstmt *s = &pc->stmts[i];
    if (s->hash == h && s->n == n && strcmp(s->sql, sql) == 0 &&
        (n == 0 || memcmp(s->types, types, sizeof(Oid) * (size_t)n) == 0))
      return s;
  }
  if (!pc->stmts) {
    pc->stmts = calloc(STMT_CACHE, sizeof *pc->stmts);
    if (!pc->stmts) return NULL;
  }
  if (pc->nstmts >= STMT_CACHE) return NULL;
  pgstmt *s = &pc->stmts[pc->nstmts];
  s->sql = strdup(sql);
  s->types = n ? malloc(sizeof(Oid) * (size_t)n) : NULL;
  if (!s->sql || (n && !s->types)) {
    free(s->sql);
    free(s->types);
    s->sql = NULL;
    s->types = NULL;
    return NULL;
  }
  if (n) memcpy(s->types, types, sizeof(Oid) * (size_t)n);
  s->n = n;
  s->hash = h;
  s->state = STMT_SEEN;
  snprintf(s->name, sizeof s->name, "mg_%d", pc->nstmts);
  pc->nstmts++;
  return NULL;                 /* first sight: sent unprepared */
}

static int not_ready(lua_State *L, pgconn *pc) {
  if (!pc->conn) return mg_push_error(L, MG_UNAVAILABLE, pc->err[0] ? pc->err : "pg: connection closed");
  if (pc->op) return luaL_error(L, "pg: the connection is busy with another statement "
                                   "(one at a time per connection: use a pool)");
  return mg_push_error(L, MG_UNAVAILABLE, "pg: connection is not usable");
}

static int batch_abandoned(lua_State *L, pgconn *pc) {
  conn_close(pc, "pg: connection closed: a batch was left without its sync");
  return mg_push_error(L, "invalid", 0, pc->err);
}

static int prepare_done(lua_State *L, int status, lua_KContext ctx);
static int batch_done(lua_State *L, int status, lua_KContext ctx);

/* Start sending; on success the task waits for the results (a prepare
** keeps the caller's arguments on the stack for the execute that follows). */
static int start_op_for(lua_State *L, pgconn *pc, int kind, int sent, pgstmt *stmt, int nparams) {
  if (!sent) {
    char msg[ERRLEN];
    snprintf(msg, sizeof msg, "pg: cannot send: %s", PQerrorMessage(pc->conn));
    trim_message(msg);
    if (PQstatus(pc->conn) == CONNECTION_BAD) conn_close(pc, msg);
    return mg_push_error(L, MG_UNAVAILABLE, msg);
  }
  pgop *op = calloc(1, sizeof *op);
  if (!op) {
    conn_close(pc, "pg: out of memory");
    return luaL_error(L, "pg: out of memory");
  }
  op->pc = pc;
  op->kind = kind;
  op->stmt = stmt;
  op->nparams = nparams;
  int f = PQflush(pc->conn);
  op->flushing = f > 0;
  pc->op = op;
  if (f < 0 || watch(pc, op->flushing ? UV_READABLE | UV_WRITABLE : UV_READABLE) != 0) {
    op_fail(op, MG_UNAVAILABLE, "pg: connection lost: ", PQerrorMessage(pc->conn));
    conn_close(pc, op->err);
    pc->op = NULL;
    mg_push_error(L, op->code, op->retryable, op->err);
    op_free(op);
    return 2;
  }
  double budget = mg_call_budget(L);
  if (budget >= 0) op_start_timer(op, budget > 0.001 ? budget : 0.001);
  if (kind == OP_PREPARE) {
    lua_settop(L, 4);
    return mg_await(L, &op->w, op_cancel, prepare_done, (lua_KContext)op);
  }
  if (kind == OP_BATCH) {
    op->failed_cmd = -1;
    lua_settop(L, 1);
    return mg_await(L, &op->w, op_cancel, batch_done, (lua_KContext)op);
  }
  lua_settop(L, 1);
  return mg_await(L, &op->w, op_cancel, query_done, (lua_KContext)op);
}

static int start_op(lua_State *L, pgconn *pc, int kind, int sent) {
  return start_op_for(L, pc, kind, sent, NULL, 0);
}

/* Send the statement's execution by name (its parameters at stack index 3). */
static int send_prepared(lua_State *L, pgconn *pc, pgstmt *s, int n) {
  params p;
  memset(&p, 0, sizeof p);
  if (n > 0) params_collect(L, &p, 3, n);
  int sent = PQsendQueryPrepared(pc->conn, s->name, n, n ? p.values : NULL,
                                 n ? p.lengths : NULL, n ? p.formats : NULL, 0);
  if (n > 0) params_free(&p);
  return start_op_for(L, pc, OP_QUERY, sent, s, n);
}

/* The prepare is done: on success execute the statement, else report why
** (the error the statement itself would have had: a later use tries to
** prepare it again). */
static int prepare_done(lua_State *L, int status, lua_KContext ctx) {
  pgop *op = (pgop *)ctx;
  pgconn *pc = op->pc;
  pgstmt *s = op->stmt;
  int n = op->nparams;
  if (op->failed || !op->res || PQresultStatus(op->res) != PGRES_COMMAND_OK)
    return query_done(L, status, ctx);
  op_free(op);
  s->state = STMT_READY;
  if (!pc->conn || pc->op) return not_ready(L, pc);
  return send_prepared(L, pc, s, n);
}

/* conn:query(sql [, params [, n]]) -> rows, count | nil, err, sqlstate */
/* The parameter count of a statement call (sql, params [, n]) at 2..4. */
static int param_count(lua_State *L) {
  if (lua_isnoneornil(L, 3)) return 0;
  luaL_checktype(L, 3, LUA_TTABLE);
  int n = lua_isnoneornil(L, 4) ? (int)luaL_len(L, 3) : (int)luaL_checkinteger(L, 4);
  luaL_argcheck(L, n >= 0 && n <= 65535, 4, "parameter count must be 0..65535");
  return n;
}

static int l_query(lua_State *L) {
  pgconn *pc = check_conn(L);
  const char *sql = luaL_checkstring(L, 2);
  int n = param_count(L);
  mg_check_yieldable(L, "pg query");
  if (!pc->conn || pc->op) return not_ready(L, pc);
  if (pc->nbatch) return batch_abandoned(L, pc);
  lua_settop(L, 3);
  lua_pushinteger(L, n);                        /* index 4: n, kept for a prepare */
  params p;
  memset(&p, 0, sizeof p);
  if (n > 0) params_collect(L, &p, 3, n);
  pgstmt *s = stmt_lookup(pc, sql, n ? p.types : NULL, n);
  int sent;
  if (s && s->state == STMT_READY) {
    sent = PQsendQueryPrepared(pc->conn, s->name, n, n ? p.values : NULL,
                               n ? p.lengths : NULL, n ? p.formats : NULL, 0);
    if (n > 0) params_free(&p);
    return start_op_for(L, pc, OP_QUERY, sent, s, n);
  }
  if (s && s->state == STMT_SEEN) {
    sent = PQsendPrepare(pc->conn, s->name, sql, n, n ? p.types : NULL);
    if (n > 0) params_free(&p);
    return start_op_for(L, pc, OP_PREPARE, sent, s, n);
  }
  sent = PQsendQueryParams(pc->conn, sql, n, n ? p.types : NULL, n ? p.values : NULL,
                           n ? p.lengths : NULL, n ? p.formats : NULL, 0);
  if (n > 0) params_free(&p);
  return start_op(L, pc, OP_QUERY, sent);
}

/* conn:exec(sql) -> true | nil, err, sqlstate; sql may hold many statements */
static int l_exec(lua_State *L) {
  pgconn *pc = check_conn(L);
  const char *sql = luaL_checkstring(L, 2);
  mg_check_yieldable(L, "pg exec");
  if (!pc->conn || pc->op) return not_ready(L, pc);
  if (pc->nbatch) return batch_abandoned(L, pc);
  return start_op(L, pc, OP_EXEC, PQsendQuery(pc->conn, sql));
}

/* ---------------------------------------------------------------- batches */

static int add_cmd(pgconn *pc, pgstmt *stmt, int prepare) {
  if (pc->ncmds == pc->cmds_cap) {
    int cap = pc->cmds_cap ? pc->cmds_cap * 2 : 16;
    pgcmd *c = realloc(pc->cmds, sizeof *c * (size_t)cap);
    if (!c) return 0;
    pc->cmds = c;
    pc->cmds_cap = cap;
  }
  pc->cmds[pc->ncmds++] = (pgcmd){ stmt, prepare, pc->nbatch, 0 };
  return 1;
}

/* conn:send(sql [, params [, n [, keep]]]) -> true | nil, err: the
** statement joins the batch, sent to the server (without waiting) when
** libpq's buffer allows; conn:sync() ends the batch and waits for its
** results. Anything else on the connection before the sync abandons the
** batch (and closes the connection: its state is no longer known). With
** keep, its rows are kept for conn:kept(ticket), and a ticket is returned
** instead of true. */
static int l_send(lua_State *L) {
  pgconn *pc = check_conn(L);
  const char *sql = luaL_checkstring(L, 2);
  int n = param_count(L);
  int keep = lua_toboolean(L, 5);
  if (!pc->conn || pc->op) return not_ready(L, pc);
  lua_settop(L, 3);
  params p;
  memset(&p, 0, sizeof p);
  if (n > 0) params_collect(L, &p, 3, n);       /* may raise: nothing sent yet */
  if (!pc->nbatch && !PQenterPipelineMode(pc->conn)) {
    if (n > 0) params_free(&p);
    mg_push_error(L, MG_UNAVAILABLE, "pg: cannot start a batch on this connection");
    return 2;
  }
  pc->nbatch++;
  pgstmt *s = stmt_lookup(pc, sql, n ? p.types : NULL, n);
  int sent = 1;
  if (s && s->state == STMT_SEEN) {
    /* prepared in the batch itself: the execution by name follows it */
    sent = PQsendPrepare(pc->conn, s->name, sql, n, n ? p.types : NULL) && add_cmd(pc, s, 1);
    if (sent) s->state = STMT_READY;
  }
  if (sent) {
    if (s && s->state == STMT_READY)
      sent = PQsendQueryPrepared(pc->conn, s->name, n, n ? p.values : NULL,
                                 n ? p.lengths : NULL, n ? p.formats : NULL, 0);
    else
      sent = PQsendQueryParams(pc->conn, sql, n, n ? p.types : NULL, n ? p.values : NULL,
                               n ? p.lengths : NULL, n ? p.formats : NULL, 0);
    sent = sent && add_cmd(pc, s, 0);
  }
  if (n > 0) params_free(&p);
  if (!sent) return fail_closed(L, pc, "cannot send");
  if (keep) {
    int ticket = pc->last_ticket = pc->last_ticket == INT_MAX ? 1 : pc->last_ticket + 1;
    pc->cmds[pc->ncmds - 1].ticket = ticket;
    lua_pushinteger(L, ticket);
  } else lua_pushboolean(L, 1);
  return 1;
}

/* conn:kept(ticket) -> rows, count | false (its batch is not synced yet)
** | nil, err: the rows of a statement sent with keep (each taken once).
** conn:kept() lets go of every kept row not taken. */
static int l_kept(lua_State *L) {
  pgconn *pc = check_conn(L);
  if (lua_isnoneornil(L, 2)) {
    drop_kept(pc);
    return 0;
  }
  lua_Integer ticket = luaL_checkinteger(L, 2);
  for (int i = 0; i < pc->nkept; i++) {
    if (pc->kept[i].ticket != ticket) continue;
    PGresult *r = pc->kept[i].res;
    pc->kept[i] = pc->kept[--pc->nkept];
    push_rows_count(L, r);
    PQclear(r);
    return 2;
  }
  for (int i = 0; i < pc->ncmds; i++) {
    if (pc->cmds[i].ticket == ticket) {
      lua_pushboolean(L, 0);
      return 1;
    }
  }
  return mg_push_error(L, "invalid", 0,
                       "pg: no rows kept for that statement (it failed or did not run, or they were taken)");
}

/* The batch's results: the last statement's rows and count, or the first
** failure with its sqlstate and the statement's position. */
static int batch_done(lua_State *L, int status, lua_KContext ctx) {
  pgop *op = (pgop *)ctx;
  pgconn *pc = op->pc;
  int failed = op->failed_cmd;
  if (failed >= 0 && failed < pc->ncmds && op->res && PQresultStatus(op->res) == PGRES_FATAL_ERROR) {
    pgcmd *c = &pc->cmds[failed];
    const char *state = PQresultErrorField(op->res, PG_DIAG_SQLSTATE);
    if (c->stmt) {
      /* as query_done does; a failed prepare is tried again next time */
      if (c->prepare) c->stmt->state = STMT_SEEN;
      else if (state && strcmp(state, "0A000") == 0) c->stmt->state = STMT_NEVER;
      else if (state && strcmp(state, "26000") == 0) c->stmt->state = STMT_SEEN;
    }
    int index = c->index;
    pc->ncmds = pc->nbatch = 0;
    int n = push_error(L, op->res);
    lua_pushinteger(L, index);
    op_free(op);
    return n + 1;
  }
  pc->ncmds = pc->nbatch = 0;
  op->kind = OP_QUERY;
  op->stmt = NULL;
  return query_done(L, status, ctx);
}

/* conn:pending() -> statements sent since the last sync */
static int l_pending(lua_State *L) {
  pgconn *pc = check_conn(L);
  lua_pushinteger(L, pc->nbatch);
  return 1;
}

/* conn:sync() -> rows, count | nil, err, sqlstate, position */
static int l_sync(lua_State *L) {
  pgconn *pc = check_conn(L);
  mg_check_yieldable(L, "pg sync");
  if (!pc->conn || pc->op) return not_ready(L, pc);
  if (!pc->nbatch) return luaL_error(L, "pg: sync without a statement sent");
  if (!PQpipelineSync(pc->conn)) return fail_closed(L, pc, "cannot send");
  return start_op_for(L, pc, OP_BATCH, 1, NULL, 0);
}

/* Has the loop waited for I/O in the last few milliseconds? Then the idle
** watch has read what the server sent before that. */
static int loop_polled_lately(void) {
  return uv_hrtime() / 1000000 <= uv_now(mg_loop()) + 5;
}

/* conn:ok() -> bool: usable for the next statement. A connection the server
** closed while it was idle (restart, admin shutdown) is noticed before
** anything is sent: by the idle watch, or, when the loop has not polled
** lately (the task ran a while without yielding), by reading now. */
static int l_ok(lua_State *L) {
  pgconn *pc = check_conn(L);
  if (pc->conn && !pc->op && pc->nbatch)
    conn_close(pc, "pg: connection closed: a batch was left without its sync");
  int ok = pc->conn != NULL && pc->op == NULL && PQstatus(pc->conn) == CONNECTION_OK;
  /* twice: a server shutting down sends a FATAL message and then closes;
  ** the first read takes the message, the second sees the end */
  if (ok && !loop_polled_lately()) ok = read_idle(pc) && read_idle(pc);
  lua_pushboolean(L, ok);
  return 1;
}

/* conn:tx_status() -> "idle" | "active" | "intrans" | "inerror" | "unknown" */
static int l_tx_status(lua_State *L) {
  pgconn *pc = check_conn(L);
  const char *s = "unknown";
  if (pc->conn) {
    switch (PQtransactionStatus(pc->conn)) {
      case PQTRANS_IDLE: s = "idle"; break;
      case PQTRANS_ACTIVE: s = "active"; break;
      case PQTRANS_INTRANS: s = "intrans"; break;
      case PQTRANS_INERROR: s = "inerror"; break;
      default: break;
    }
  }
  lua_pushstring(L, s);
  return 1;
}

static int l_backend_pid(lua_State *L) {
  pgconn *pc = check_conn(L);
  if (!pc->conn) lua_pushnil(L);
  else lua_pushinteger(L, PQbackendPID(pc->conn));
  return 1;
}

static int l_error(lua_State *L) {
  pgconn *pc = check_conn(L);
  if (pc->conn) lua_pushnil(L);
  else lua_pushstring(L, pc->err[0] ? pc->err : "pg: connection closed");
  return 1;
}

static int l_close(lua_State *L) {
  pgconn *pc = check_conn(L);
  if (pc->op) {                         /* a task waits: end its statement */
    pgop *op = pc->op;
    op_fail(op, "cancelled", 0, "pg: ", "connection closed");
    finish(pc);
  }
  conn_close(pc, "pg: connection closed");
  return 0;
}

static int l_gc(lua_State *L) {
  pgconn *pc = luaL_checkudata(L, 1, CONN_MT);
  pc->op = NULL;
  conn_close(pc, "pg: connection closed");
  if (pc->stmts) {
    for (int i = 0; i < pc->nstmts; i++) {
      free(pc->stmts[i].sql);
      free(pc->stmts[i].types);
    }
    free(pc->stmts);
    pc->stmts = NULL;
  }
  drop_kept(pc);
  free(pc->kept);
  pc->kept = NULL;
  pc->kept_cap = 0;
  free(pc->cmds);
  pc->cmds = NULL;
  pc->cmds_cap = 0;
  return 0;
}

static int l_tostring(lua_State *L) {
  pgconn *pc = check_conn(L);
  lua_pushfstring(L, "pg connection (%s): %p", pc->conn ? "open" : "closed", (void *)pc);
  return 1;
}

/* set_codecs(json_encode, json_decode, bytea_metatable) */
static int l_set_codecs(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_pushvalue(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, REG_ENCODE);
  lua_pushvalue(L, 2);
  lua_setfield(L, LUA_REGISTRYINDEX, REG_DECODE);
  lua_pushvalue(L, 3);
  lua_setfield(L, LUA_REGISTRYINDEX, REG_BYTEA);
  return 0;
}

static const luaL_Reg conn_methods[] = {
  { "query", l_query },
  { "exec", l_exec },
  { "send", l_send },
  { "kept", l_kept },
  { "sync", l_sync },
  { "pending", l_pending },
  { "ok", l_ok },
  { "tx_status", l_tx_status },
  { "backend_pid", l_backend_pid },
  { "error", l_error },
  { "close", l_close },
  { NULL, NULL }
};

static const luaL_Reg funcs[] = {
  { "connect", l_connect },
  { "set_codecs", l_set_codecs },
  { NULL, NULL }
};

int mg_open_pg(lua_State *L) {
  mg_register_class(L, CONN_MT, conn_methods, l_gc, l_close, l_tostring);
  luaL_newlib(L, funcs);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "null");
  return 1;
}
