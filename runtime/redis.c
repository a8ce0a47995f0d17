/*
** redis.c — Redis connections on the loop (hiredis 0.14 async API).
**
** A connection userdata owns one redisAsyncContext, attached to the
** runtime's libuv loop through a uv_poll handle the same way hiredis' own
** libuv adapter does it, except that the handle's lifetime is ours. Any
** number of commands may be in flight on one connection: hiredis keeps their
** callbacks in send order, so concurrent tasks pipeline naturally. Commands
** are written in the Redis protocol here (each argument as its length and
** its bytes: binary safe, never printf-formatted) and handed to hiredis as
** they are; subscriptions go through redisAsyncCommandArgv.
**
** Replies are taken over from hiredis inside its callback (the tree is moved,
** not copied) and turned into Lua values by the waiting task. Pub/sub
** messages are queued on the connection until a task asks for the next one.
**
** Reconnection, AUTH/SELECT, pools and blocking-command routing live in
** moongraph/redis.lua; this file offers one physical connection.
*/
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "buf.h"
#include "mg.h"

#define CONN_MT "moongraph.redis.conn"
#define ERRLEN 256
#define ARGV_STACK 16

typedef struct rconn rconn;
typedef struct rop rop;
typedef struct rmsg rmsg;

/* The event-library side of one context; freed in the poll close callback. */
typedef struct revents {
  uv_poll_t poll;
  uv_prepare_t flush;       /* writes what was queued, before the loop polls */
  redisAsyncContext *ac;    /* NULL once hiredis cleaned up */
  int events;               /* what hiredis asked to hear about */
  int watching;             /* what the poll handle watches */
  int writing;              /* inside hiredis' write */
  int handles;              /* of poll and flush, not closed yet */
} revents;

struct rmsg {
  rmsg *next;
  redisReply *reply;        /* owned */
};

struct rconn {
  redisAsyncContext *ac;    /* NULL when not connected (failed, lost, closed) */
  int connected;            /* the connect callback reported success */
  int closing;              /* close() was called */
  int inflight;             /* commands sent, reply not yet received */
  double timeout;           /* per command, seconds; 0 = none */
  int drop_on_cancel;       /* a cancelled command closes the connection */
  char err[ERRLEN];         /* why the connection is gone */
  char addr[128];           /* host:port or socket path, for messages */
  rop *connecting;          /* the connect operation, while it waits */
  /* pub/sub */
  rmsg *mhead, *mtail;
  int mcount;
  rop *msg_op;              /* task waiting for the next message */
  rop *sub_op;              /* task waiting for (un)subscribe confirmations */
  int sub_pending;
};

enum { OP_CONNECT, OP_CMD, OP_PIPE, OP_SUB, OP_MSG };

/*
** An operation is shared by the waiting task, hiredis (while replies are
** outstanding) and its timer; `refs` counts those owners and the last one
** frees it.
*/
struct rop {
  mg_waiter w;
  rconn *c;
  int kind;
  int refs;
  int expected;             /* replies still to come from hiredis */
  int nreplies;             /* replies stored so far */
  int size;                 /* capacity of replies[] */
  int failed;               /* err holds a connection-level failure */
  redisReply **replies;
  uv_timer_t *timer;
  double timeout;           /* seconds, for the timeout message */
  int by_deadline;          /* the caller's deadline set the timer */
  char err[ERRLEN];
  const char *code;         /* err's code (errors.c) */
  int retryable;
  redisReply *one[1];
};

/* ---------------------------------------------------------------- helpers */

static void op_unref(rop *op) {
  if (--op->refs > 0) return;
  for (int i = 0; i < op->nreplies; i++)
    if (op->replies[i]) freeReplyObject(op->replies[i]);
  if (op->replies != op->one) free(op->replies);
  free(op);
}

static rop *op_new(rconn *c, int kind, int nreplies) {
  rop *op = calloc(1, sizeof *op);
  if (!op) return NULL;
  op->c = c;
  op->kind = kind;
  op->refs = 1;                             /* the task */
  op->size = nreplies;
  if (nreplies <= 1) op->replies = op->one;
  else if (!(op->replies = calloc((size_t)nreplies, sizeof *op->replies))) {
    free(op);
    return NULL;
  }
  return op;
}

static void op_fail(rop *op, const char *code, int retryable, const char *msg) {
  if (op->failed) return;
  op->failed = 1;
  op->code = code;
  op->retryable = retryable;
  snprintf(op->err, ERRLEN, "%s", msg);
}

/* An error reply as an error value: its first word is the code
** ("redis:READONLY"); waiting heals a server loading, busy, failing over
** or short of replicas. */
static void push_reply_error(lua_State *L, const char *str, size_t len) {
  static const char *const healing[] = {"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN",
                                        "MASTERDOWN", "READONLY", "NOREPLICAS"};
  char code[40] = "redis:";
  size_t n = 0;
  while (n < len && n < sizeof code - 7 && str[n] != ' ') {
    code[6 + n] = str[n];
    n++;
  }
  code[6 + n] = '\0';
  int retryable = 0;
  for (size_t i = 0; i < sizeof healing / sizeof healing[0]; i++)
    if (strcmp(code + 6, healing[i]) == 0) retryable = 1;
  lua_pushlstring(L, str, len);
  mg_error_new(L, n ? code : "redis:ERR", retryable);
}

/* Take a reply tree over from hiredis, which frees the emptied shell. */
static redisReply *steal(redisReply *r) {
  redisReply *own = malloc(sizeof *own);
  if (!own) return NULL;
  *own = *r;
  r->type = REDIS_REPLY_NIL;
  r->str = NULL;
  r->len = 0;
  r->element = NULL;
  r->elements = 0;
  return own;
}

#define CONN_CODE(c) (c)->closing ? "cancelled" : "unavailable", !(c)->closing

static const char *conn_error(rconn *c) {
  return c->err[0] ? c->err : "redis: connection closed";
}

/* ---------------------------------------------------------------- timers */

static void timer_closed(uv_handle_t *h) {
  rop *op = h->data;
  free(h);
  op_unref(op);
}

static void op_stop_timer(rop *op) {
  if (!op->timer) return;
  uv_timer_stop(op->timer);
  uv_close((uv_handle_t *)op->timer, timer_closed);
  op->timer = NULL;
}

static void conn_drop(rconn *c, const char *why);

static void op_timed_out(uv_timer_t *t) {
  rop *op = t->data;
  rconn *c = op->c;
  char msg[ERRLEN];
  op_stop_timer(op);
  if (!op->w.task) return;
  if (op->kind == OP_MSG) {
    op_fail(op, MG_TIMEOUT, "timeout");
    if (c->msg_op == op) c->msg_op = NULL;
    mg_wake(&op->w);
    return;
  }
  if (op->kind == OP_CONNECT)
    snprintf(msg, sizeof msg, "redis: cannot connect to %s: timeout after %gs",
             c->addr, op->timeout);
  else snprintf(msg, sizeof msg, "redis: timeout after %gs%s", op->timeout,
                op->by_deadline ? ", at the caller's deadline" : "");
  op_fail(op, MG_TIMEOUT, msg);
  mg_wake(&op->w);
  if (op->by_deadline) {
    /* the command itself is fine: like a cancel, its reply is discarded on
    ** arrival, and the connection serves the other tasks on */
    if (c->drop_on_cancel)
      conn_drop(c, "redis: connection closed after a command ran out of time");
    return;
  }
  /* The reply may still come: a connection in an unknown state is closed
  ** rather than reused, and its other commands fail with this reason. */
  if (op->kind == OP_SUB && c->sub_op == op) c->sub_op = NULL;
  if (op->kind == OP_CONNECT) {
    if (c->connecting == op) c->connecting = NULL;
    conn_drop(c, msg);
  } else {
    conn_drop(c, "redis: connection closed after a command timed out");
  }
}

/* The time limit of a command: the connection's, or less when the calling
** task's deadline comes first (see mg_call_budget). */
static double op_limit(lua_State *L, rop *op, double own) {
  double budget = mg_call_budget(L);
  if (budget < 0 || (own > 0 && own <= budget)) return own;
  op->by_deadline = 1;
  return budget > 0.001 ? budget : 0.001;
}

static int op_start_timer(rop *op, double sec) {
  if (sec <= 0) return 0;
  uv_timer_t *t = malloc(sizeof *t);
  if (!t) return -1;
  uv_timer_init(mg_loop(), t);
  t->data = op;
  op->timer = t;
  op->timeout = sec;
  op->refs++;
  uint64_t ms = (uint64_t)ceil(sec * 1000.0);
  uv_timer_start(t, op_timed_out, ms, 0);
  return 0;
}

/* ---------------------------------------------------------------- events */

static void ev_closed(uv_handle_t *h) {
  revents *e = h->data;
  if (--e->handles == 0) free(e);
}

static void ev_write(revents *e) {
  e->writing = 1;
  redisAsyncHandleWrite(e->ac);
  e->writing = 0;
}

static void ev_poll(uv_poll_t *h, int status, int events) {
  revents *e = h->data;
  if (status < 0) events = UV_READABLE;   /* let hiredis read the error */
  if (e->ac && (events & UV_READABLE)) redisAsyncHandleRead(e->ac);
  if (e->ac && (events & UV_WRITABLE)) ev_write(e);
  /* libuv stops the handle on an error event, which may belong to an
  ** earlier socket of this number that a child process still holds
  ** between fork and exec: a connection hiredis still has is watched again */
  if (status < 0 && e->ac && e->watching && !uv_is_active((uv_handle_t *)&e->poll) &&
      !uv_is_closing((uv_handle_t *)&e->poll))
    uv_poll_start(&e->poll, e->watching, ev_poll);
}

/* The poll handle is restarted only when what it watches changes: every
** uv_poll_start costs the loop two epoll_ctl calls, and hiredis asks for
** reading after every write and for writing with every command. */
static void ev_update(revents *e) {
  if (e->events == e->watching) return;
  e->watching = e->events;
  if (e->events) uv_poll_start(&e->poll, e->events, ev_poll);
  else uv_poll_stop(&e->poll);
}

static void ev_flush(uv_prepare_t *h) {
  revents *e = h->data;
  uv_prepare_stop(h);
  if (e->ac) ev_write(e);
}

static void ev_add_read(void *p) { revents *e = p; e->events |= UV_READABLE; ev_update(e); }
static void ev_del_read(void *p) { revents *e = p; e->events &= ~UV_READABLE; ev_update(e); }

/* Commands are written just before the loop next polls, all those queued
** meanwhile in one write; the socket is watched for writing only while
** connecting, or when it took less than was written (full). */
static void ev_add_write(void *p) {
  revents *e = p;
  if (!e->writing && (e->ac->c.flags & REDIS_CONNECTED)) {
    uv_prepare_start(&e->flush, ev_flush);
    return;
  }
  e->events |= UV_WRITABLE;
  ev_update(e);
}

static void ev_del_write(void *p) {
  revents *e = p;
  uv_prepare_stop(&e->flush);
  e->events &= ~UV_WRITABLE;
  ev_update(e);
}

static void ev_cleanup(void *p) {
  revents *e = p;
  e->ac = NULL;
  uv_close((uv_handle_t *)&e->poll, ev_closed);
  uv_close((uv_handle_t *)&e->flush, ev_closed);
}

static int ev_attach(redisAsyncContext *ac) {
  revents *e = calloc(1, sizeof *e);
  if (!e) return -1;
  if (uv_poll_init(mg_loop(), &e->poll, ac->c.fd) != 0) {
    free(e);
    return -1;
  }
  uv_prepare_init(mg_loop(), &e->flush);
  e->handles = 2;
  e->poll.data = e;
  e->flush.data = e;
  e->ac = ac;
  ac->ev.data = e;
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->ev.cleanup = ev_cleanup;
  return 0;
}

/* ---------------------------------------------------------------- connection state */

static void wake_sub_waiters(rconn *c) {
  if (c->connecting) {
    op_fail(c->connecting, CONN_CODE(c), conn_error(c));
    mg_wake(&c->connecting->w);
    c->connecting = NULL;
  }
  if (c->msg_op) {
    op_fail(c->msg_op, CONN_CODE(c), conn_error(c));
    mg_wake(&c->msg_op->w);
    c->msg_op = NULL;
  }
  if (c->sub_op) {
    op_fail(c->sub_op, CONN_CODE(c), conn_error(c));
    mg_wake(&c->sub_op->w);
    c->sub_op = NULL;
  }
  c->sub_pending = 0;
}

static void on_connect(const redisAsyncContext *ac, int status) {
  rconn *c = ac->data;
  if (!c) return;
  if (status != REDIS_OK) {
    snprintf(c->err, ERRLEN, "redis: cannot connect to %s: %s", c->addr,
             ac->errstr && ac->errstr[0] ? ac->errstr : "unknown error");
    c->ac = NULL;                            /* hiredis frees it next */
    wake_sub_waiters(c);
    return;
  }
  c->connected = 1;
  if (c->connecting) {
    mg_wake(&c->connecting->w);
    c->connecting = NULL;
  }
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  rconn *c = ac->data;
  if (!c) return;
  if (!c->err[0]) {
    if (c->closing) snprintf(c->err, ERRLEN, "redis: connection closed");
    else if (status != REDIS_OK)
      snprintf(c->err, ERRLEN, "redis: connection lost: %s",
               ac->errstr && ac->errstr[0] ? ac->errstr : "server closed the connection");
    else snprintf(c->err, ERRLEN, "redis: connection lost: server closed the connection");
  }
  c->ac = NULL;
  c->connected = 0;
  wake_sub_waiters(c);
}

/* Close at once: pending commands fail with `why`. Safe outside hiredis
** callbacks only (all our callers are timers, cancels, close and __gc). */
static void conn_drop(rconn *c, const char *why) {
  if (!c->ac) return;
  if (!c->err[0]) snprintf(c->err, ERRLEN, "%s", why);
  redisAsyncContext *ac = c->ac;
  redisAsyncFree(ac);                /* runs callbacks, on_disconnect */
  c->ac = NULL;
  c->connected = 0;
  wake_sub_waiters(c);
}

/* ---------------------------------------------------------------- reply callbacks */

static void on_reply(redisAsyncContext *ac, void *r, void *privdata) {
  rop *op = privdata;
  redisReply *reply = r;
  rconn *c = ac->data;
  if (c && c->inflight > 0) c->inflight--;
  if (op->nreplies < op->size) {
    if (reply) op->replies[op->nreplies] = steal(reply);
    else {
      /* the context is going away; on_disconnect has not run yet */
      char msg[ERRLEN];
      if (c && c->err[0]) snprintf(msg, ERRLEN, "%s", c->err);
      else if (ac->errstr && ac->errstr[0])
        snprintf(msg, ERRLEN, "redis: connection lost: %s", ac->errstr);
      else snprintf(msg, ERRLEN, "redis: connection closed");
      op->replies[op->nreplies] = NULL;
      if (c) op_fail(op, CONN_CODE(c), msg);
      else op_fail(op, MG_UNAVAILABLE, msg);
    }
    op->nreplies++;
  }
  if (--op->expected == 0) {
    op_stop_timer(op);
    mg_wake(&op->w);
    op_unref(op);                            /* hiredis' reference */
  }
}

static void push_message(rconn *c, redisReply *r) {
  rmsg *m = malloc(sizeof *m);
  if (!m) return;
  m->reply = steal(r);
  if (!m->reply) { free(m); return; }
  m->next = NULL;
  if (c->mtail) c->mtail->next = m; else c->mhead = m;
  c->mtail = m;
  c->mcount++;
  if (c->msg_op) {
    op_stop_timer(c->msg_op);
    mg_wake(&c->msg_op->w);
    c->msg_op = NULL;
  }
}

static void on_sub(redisAsyncContext *ac, void *r, void *privdata) {
  rconn *c = privdata;
  redisReply *reply = r;
  (void)ac;
  if (!reply) return;                        /* on_disconnect wakes waiters */
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
      reply->element[0]->type != REDIS_REPLY_STRING) return;
  const char *kind = reply->element[0]->str;
  if (!strcmp(kind, "message") || !strcmp(kind, "pmessage")) {
    push_message(c, reply);
    return;
  }
  /* (p)(un)subscribe confirmation, one per channel or pattern */
  if (c->sub_pending > 0 && --c->sub_pending == 0 && c->sub_op) {
    op_stop_timer(c->sub_op);
    mg_wake(&c->sub_op->w);
    c->sub_op = NULL;
  }
}

/* ---------------------------------------------------------------- Lua values */

static void push_null(lua_State *L) { lua_pushlightuserdata(L, NULL); }

static void push_reply(lua_State *L, redisReply *r) {
  luaL_checkstack(L, 4, "redis reply nested too deeply");
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      lua_pushlstring(L, r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      lua_pushinteger(L, (lua_Integer)r->integer);
      break;
    case REDIS_REPLY_NIL:
      push_null(L);
      break;
    case REDIS_REPLY_ERROR:
      /* nested errors (EXEC, pipelines) follow lua-resty-redis: {false, err} */
      lua_createtable(L, 2, 0);
      lua_pushboolean(L, 0);
      lua_rawseti(L, -2, 1);
      push_reply_error(L, r->str, r->len);
      lua_rawseti(L, -2, 2);
      break;
    case REDIS_REPLY_ARRAY:
      lua_createtable(L, (int)r->elements, 0);
      for (size_t i = 0; i < r->elements; i++) {
        push_reply(L, r->element[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
      }
      break;
    default:
      push_null(L);
  }
}

/* ---------------------------------------------------------------- arguments */

typedef struct argv_buf {
  int argc;
  const char **argv;
  size_t *lens;
  char *nums;               /* formatted numbers, 32 bytes each */
  const char *sargv[ARGV_STACK];
  size_t slens[ARGV_STACK];
  char snums[ARGV_STACK * 32];
} argv_buf;

static void argv_free(argv_buf *a) {
  if (a->argv != a->sargv) free((void *)a->argv);
  if (a->lens != a->slens) free(a->lens);
  if (a->nums != a->snums) free(a->nums);
}

/* Raise unless the value at idx can be a command argument. */
static void check_arg(lua_State *L, int idx, const char *what, int argno) {
  int t = lua_type(L, idx);
  if (t == LUA_TSTRING) return;
  if (t == LUA_TNUMBER) {
    if (!lua_isinteger(L, idx) && isnan(lua_tonumber(L, idx)))
      luaL_error(L, "bad argument #%d to '%s' (NaN cannot be sent to Redis)", argno, what);
    return;
  }
  luaL_error(L, "bad argument #%d to '%s' (string or number expected, got %s)",
             argno, what, luaL_typename(L, idx));
}

/* Collect the values at stack [first, first+n) as command arguments.
** Strings go as they are (binary safe); numbers are formatted losslessly.
** `what` and `argbase` name the argument in error messages. */
static void argv_collect(lua_State *L, argv_buf *a, int first, int n,
                         const char *what, int argbase) {
  for (int i = 0; i < n; i++) check_arg(L, first + i, what, argbase + i);
  a->argc = n;
  a->argv = a->sargv;
  a->lens = a->slens;
  a->nums = a->snums;
  if (n > ARGV_STACK) {
    a->argv = malloc(sizeof(char *) * (size_t)n);
    a->lens = malloc(sizeof(size_t) * (size_t)n);
    a->nums = malloc(32 * (size_t)n);
    if (!a->argv || !a->lens || !a->nums) {
      argv_free(a);
      luaL_error(L, "%s: out of memory", what);
    }
  }
  for (int i = 0; i < n; i++) {
    int idx = first + i;
    switch (lua_type(L, idx)) {
      case LUA_TSTRING:
        a->argv[i] = lua_tolstring(L, idx, &a->lens[i]);
        break;
      case LUA_TNUMBER: {
        char *b = a->nums + 32 * i;
        int len;
        if (lua_isinteger(L, idx))
          len = snprintf(b, 32, LUA_INTEGER_FMT, lua_tointeger(L, idx));
        else {
          lua_Number x = lua_tonumber(L, idx);
          if (isinf(x)) len = snprintf(b, 32, "%s", x > 0 ? "inf" : "-inf");
          else {
            /* the shortest form that reads back as the same double */
            int prec = 15;
            do len = snprintf(b, 32, "%.*g", prec, (double)x);
            while (strtod(b, NULL) != (double)x && ++prec <= 17);
          }
        }
        a->argv[i] = b;
        a->lens[i] = (size_t)len;
        break;
      }
      default:
        break;                       /* excluded by check_arg */
    }
  }
}

/* A command in the Redis protocol (RESP), formatted here rather than by
** hiredis (whose sds formatting was most of a pipeline's cost): "*argc",
** then "$len" and the bytes of each argument, each line ending in CRLF. */
typedef struct resp_buf {
  char *buf;
  size_t len, cap;
  char sbuf[1024];
} resp_buf;

static void resp_init(resp_buf *r) {
  r->buf = r->sbuf;
  r->len = 0;
  r->cap = sizeof r->sbuf;
}

static void resp_free(resp_buf *r) {
  mg_buf_free(r->buf, r->sbuf);
}

/* "<c><n>\r\n" (room already made: at most 24 bytes) */
static void resp_line(resp_buf *r, char c, size_t n) {
  char digits[20];
  int d = 0;
  do digits[d++] = (char)('0' + n % 10); while ((n /= 10) > 0);
  char *p = r->buf + r->len;
  *p++ = c;
  while (d > 0) *p++ = digits[--d];
  *p++ = '\r';
  *p++ = '\n';
  r->len = (size_t)(p - r->buf);
}

/* The command of argv_buf a, replacing what r held: 0, or -1 (out of memory) */
static int resp_format(resp_buf *r, const argv_buf *a) {
  size_t need = 24;
  for (int i = 0; i < a->argc; i++) need += 24 + a->lens[i] + 2;
  r->len = 0;
  if (mg_buf_room(&r->buf, &r->cap, r->len, r->sbuf, need) != 0) return -1;
  resp_line(r, '*', (size_t)a->argc);
  for (int i = 0; i < a->argc; i++) {
    resp_line(r, '$', a->lens[i]);
    memcpy(r->buf + r->len, a->argv[i], a->lens[i]);
    r->len += a->lens[i];
    r->buf[r->len++] = '\r';
    r->buf[r->len++] = '\n';
  }
  return 0;
}

/* Queue the command of a on the connection, its reply to on_reply(op):
** 1, 0 (not accepted), or -1 (out of memory). */
static int send_argv(redisAsyncContext *ac, resp_buf *r, const argv_buf *a, void *op) {
  if (resp_format(r, a) != 0) return -1;
  return redisAsyncFormattedCommand(ac, on_reply, op, r->buf, r->len) == REDIS_OK;
}

/* ---------------------------------------------------------------- connect */

static rconn *check_conn(lua_State *L) {
  return luaL_checkudata(L, 1, CONN_MT);
}

static int connect_done(lua_State *L, int status, lua_KContext ctx) {
  rop *op = (rop *)ctx;
  rconn *c = op->c;
  (void)status;
  if (op->failed || !c->ac || !c->connected) {
    if (op->failed) mg_push_error(L, op->code, op->retryable, op->err);
    else mg_push_error(L, CONN_CODE(c), conn_error(c));
    op_unref(op);
    return 2;
  }
  op_unref(op);
  lua_settop(L, 1);                          /* the connection */
  return 1;
}

static void connect_cancel(mg_waiter *w) {
  rop *op = (rop *)w;
  rconn *c = op->c;
  op_stop_timer(op);
  if (c->connecting == op) c->connecting = NULL;
  conn_drop(c, "redis: connect cancelled");
  op_unref(op);
}

/* connect(host, port [, timeout]) or connect(path [, nil, timeout])
** -> conn | nil, err. Yields until the TCP/unix connection is up. */
static int l_connect(lua_State *L) {
  const char *host = luaL_checkstring(L, 1);
  int unix_socket = lua_isnoneornil(L, 2);
  lua_Integer port = unix_socket ? 0 : luaL_checkinteger(L, 2);
  double timeout = luaL_optnumber(L, 3, 0);
  if (!unix_socket && (port <= 0 || port > 65535))
    return luaL_argerror(L, 2, "port must be 1..65535");
  mg_check_yieldable(L, "redis.connect");

  rconn *c = lua_newuserdatauv(L, sizeof *c, 0);
  memset(c, 0, sizeof *c);
  luaL_setmetatable(L, CONN_MT);
  if (unix_socket) snprintf(c->addr, sizeof c->addr, "%s", host);
  else snprintf(c->addr, sizeof c->addr, "%s:%d", host, (int)port);

  redisAsyncContext *ac = unix_socket ? redisAsyncConnectUnix(host)
                                      : redisAsyncConnect(host, (int)port);
  if (!ac) return mg_push_error(L, MG_UNAVAILABLE, "redis: out of memory");
  if (ac->err) {
    lua_pushfstring(L, "redis: cannot connect to %s: %s", c->addr, ac->errstr);
    redisAsyncFree(ac);
    return mg_push_error(L, MG_UNAVAILABLE, lua_tostring(L, -1));
  }
  /* not inherited by the programs this process starts (see http.c) */
  int fdflags = fcntl(ac->c.fd, F_GETFD);
  if (fdflags >= 0) fcntl(ac->c.fd, F_SETFD, fdflags | FD_CLOEXEC);
  if (ev_attach(ac) != 0) {
    redisAsyncFree(ac);
    return mg_push_error(L, MG_UNAVAILABLE, "redis: cannot watch the socket");
  }
  ac->data = c;
  c->ac = ac;
  redisAsyncSetConnectCallback(ac, on_connect);   /* also arms the write event */
  redisAsyncSetDisconnectCallback(ac, on_disconnect);

  rop *op = op_new(c, OP_CONNECT, 0);
  if (!op || op_start_timer(op, timeout) != 0) {
    if (op) op_unref(op);
    conn_drop(c, "redis: out of memory");
    return mg_push_error(L, MG_UNAVAILABLE, "redis: out of memory");
  }
  c->connecting = op;
  lua_replace(L, 1);                         /* the connection, kept at 1 */
  lua_settop(L, 1);
  return mg_await(L, &op->w, connect_cancel, connect_done, (lua_KContext)op);
}

/* ---------------------------------------------------------------- commands */

/* Return `nil, op->err` to Lua and drop the caller's reference to op. */
static int fail_op(lua_State *L, rop *op) {
  mg_push_error(L, op->code, op->retryable, op->err);
  op_unref(op);
  return 2;
}

static int cmd_done(lua_State *L, int status, lua_KContext ctx) {
  rop *op = (rop *)ctx;
  (void)status;
  if (op->failed) {
    return fail_op(L, op);
  }
  redisReply *r = op->replies[0];
  if (!r) {
    mg_push_error(L, MG_UNAVAILABLE, "redis: out of memory");
    op_unref(op);
    return 2;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    lua_pushnil(L);
    push_reply_error(L, r->str, r->len);
    op_unref(op);
    return 2;
  }
  push_reply(L, r);
  op_unref(op);
  return 1;
}

static int pipe_done(lua_State *L, int status, lua_KContext ctx) {
  rop *op = (rop *)ctx;
  (void)status;
  if (op->failed) {
    return fail_op(L, op);
  }
  lua_createtable(L, op->nreplies, 0);
  for (int i = 0; i < op->nreplies; i++) {
    if (op->replies[i]) push_reply(L, op->replies[i]);
    else push_null(L);
    lua_rawseti(L, -2, i + 1);
  }
  op_unref(op);
  return 1;
}

static void cmd_cancel(mg_waiter *w) {
  rop *op = (rop *)w;
  rconn *c = op->c;
  op_stop_timer(op);
  /* hiredis still holds its reference; the reply is discarded on arrival */
  if (c->drop_on_cancel)
    conn_drop(c, "redis: connection closed after a command was cancelled");
  op_unref(op);
}

static int not_connected(lua_State *L, rconn *c) {
  return mg_push_error(L, CONN_CODE(c), c->closing ? "redis: connection closed" : conn_error(c));
}

/* conn:call(cmd, ...) -> value | nil, err */
static int l_call(lua_State *L) {
  rconn *c = check_conn(L);
  int n = lua_gettop(L) - 1;
  if (n < 1) return luaL_argerror(L, 2, "command name expected");
  mg_check_yieldable(L, "redis call");
  if (!c->ac) return not_connected(L, c);
  argv_buf a;
  argv_collect(L, &a, 2, n, "call", 1);
  rop *op = op_new(c, OP_CMD, 1);
  if (!op) { argv_free(&a); return luaL_error(L, "redis: out of memory"); }
  resp_buf r;
  resp_init(&r);
  int sent = send_argv(c->ac, &r, &a, op);
  resp_free(&r);
  argv_free(&a);
  if (sent <= 0) {
    op_unref(op);
    if (sent < 0) return luaL_error(L, "redis: out of memory");
    mg_push_error(L, MG_UNAVAILABLE, "redis: command not accepted on this connection");
    return 2;
  }
  op->expected = 1;
  op->refs++;                                /* hiredis */
  c->inflight++;
  if (op_start_timer(op, op_limit(L, op, c->timeout)) != 0) op_fail(op, MG_UNAVAILABLE, "redis: out of memory");
  lua_settop(L, 1);                          /* keep the connection anchored */
  return mg_await(L, &op->w, cmd_cancel, cmd_done, (lua_KContext)op);
}

/* conn:pipeline({ {cmd, ...}, ... }) -> { reply, ... } | nil, err
** All commands are written together; errors of single commands come back
** as {false, err} in their slot. */
static int l_pipeline(lua_State *L) {
  rconn *c = check_conn(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  int n = (int)luaL_len(L, 2);
  mg_check_yieldable(L, "redis pipeline");
  for (int i = 1; i <= n; i++) {
    if (lua_rawgeti(L, 2, i) != LUA_TTABLE || luaL_len(L, -1) < 1)
      return luaL_error(L, "bad argument #1 to 'pipeline' (command %d is not a non-empty list)", i);
    int argc = (int)luaL_len(L, -1);
    for (int j = 1; j <= argc; j++) {
      lua_rawgeti(L, -1, j);
      check_arg(L, -1, "pipeline", j);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  if (n == 0) { lua_newtable(L); return 1; }
  if (!c->ac) return not_connected(L, c);
  rop *op = op_new(c, OP_PIPE, n);
  if (!op) return luaL_error(L, "redis: out of memory");
  int sent = 0, nomem = 0;
  resp_buf r;
  resp_init(&r);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);
    int t = lua_gettop(L);
    int argc = (int)luaL_len(L, t);
    luaL_checkstack(L, argc + 4, "too many arguments");
    for (int j = 1; j <= argc; j++) lua_rawgeti(L, t, j);
    argv_buf a;
    argv_collect(L, &a, t + 1, argc, "pipeline", 1);
    int ok = c->ac ? send_argv(c->ac, &r, &a, op) : 0;
    argv_free(&a);
    lua_settop(L, t - 1);
    if (ok <= 0) {
      nomem = ok < 0;
      break;
    }
    sent++;
    op->expected++;
    c->inflight++;
  }
  resp_free(&r);
  if (sent < n) op_fail(op, MG_UNAVAILABLE, nomem ? "redis: out of memory" : "redis: pipeline not accepted on this connection");
  if (sent == 0) {
    return fail_op(L, op);
  }
  op->refs++;                                /* hiredis */
  if (op_start_timer(op, op_limit(L, op, c->timeout)) != 0) op_fail(op, MG_UNAVAILABLE, "redis: out of memory");
  lua_settop(L, 1);
  return mg_await(L, &op->w, cmd_cancel, pipe_done, (lua_KContext)op);
}

/* ---------------------------------------------------------------- pub/sub */

static int sub_done(lua_State *L, int status, lua_KContext ctx) {
  rop *op = (rop *)ctx;
  (void)status;
  if (op->failed) {
    return fail_op(L, op);
  }
  op_unref(op);
  lua_pushboolean(L, 1);
  return 1;
}

static void sub_cancel(mg_waiter *w) {
  rop *op = (rop *)w;
  op_stop_timer(op);
  if (op->c->sub_op == op) op->c->sub_op = NULL;
  op_unref(op);
}

/* conn:subscribe(verb, {names}) -> true | nil, err; verb is one of
** SUBSCRIBE, PSUBSCRIBE, UNSUBSCRIBE, PUNSUBSCRIBE. Returns once Redis has
** confirmed every name, so a message published afterwards is delivered. */
static int l_subscribe(lua_State *L) {
  static const char *const verbs[] = {
    "SUBSCRIBE", "PSUBSCRIBE", "UNSUBSCRIBE", "PUNSUBSCRIBE", NULL
  };
  rconn *c = check_conn(L);
  int v = luaL_checkoption(L, 2, NULL, verbs);
  luaL_checktype(L, 3, LUA_TTABLE);
  int n = (int)luaL_len(L, 3);
  if (n < 1) return luaL_argerror(L, 3, "at least one channel expected");
  mg_check_yieldable(L, "redis subscribe");
  if (!c->ac) return not_connected(L, c);
  if (c->sub_op) return luaL_error(L, "redis subscribe: another (un)subscribe is in progress");
  luaL_checkstack(L, n + 2, "too many channels");
  lua_pushstring(L, verbs[v]);
  for (int i = 1; i <= n; i++) lua_rawgeti(L, 3, i);
  argv_buf a;
  argv_collect(L, &a, 4, n + 1, "subscribe", 1);
  rop *op = op_new(c, OP_SUB, 0);
  if (!op) { argv_free(&a); return luaL_error(L, "redis: out of memory"); }
  int ok = redisAsyncCommandArgv(c->ac, on_sub, c, a.argc, a.argv, a.lens) == REDIS_OK;
  argv_free(&a);
  if (!ok) {
    op_unref(op);
    mg_push_error(L, MG_UNAVAILABLE, "redis: subscribe not accepted on this connection");
    return 2;
  }
  c->sub_pending += n;
  c->sub_op = op;
  if (op_start_timer(op, c->timeout) != 0) op_fail(op, MG_UNAVAILABLE, "redis: out of memory");
  lua_settop(L, 1);
  return mg_await(L, &op->w, sub_cancel, sub_done, (lua_KContext)op);
}

/* Pop the oldest message as {kind=, channel=, data=, pattern=}. */
static void pop_message(lua_State *L, rconn *c) {
  rmsg *m = c->mhead;
  c->mhead = m->next;
  if (!c->mhead) c->mtail = NULL;
  c->mcount--;
  redisReply *r = m->reply;
  int pm = !strcmp(r->element[0]->str, "pmessage") && r->elements >= 4;
  lua_createtable(L, 0, 4);
  lua_pushstring(L, pm ? "pmessage" : "message");
  lua_setfield(L, -2, "kind");
  if (pm) {
    lua_pushlstring(L, r->element[1]->str, r->element[1]->len);
    lua_setfield(L, -2, "pattern");
  }
  redisReply *ch = r->element[pm ? 2 : 1], *data = r->element[pm ? 3 : 2];
  lua_pushlstring(L, ch->str ? ch->str : "", ch->len);
  lua_setfield(L, -2, "channel");
  lua_pushlstring(L, data->str ? data->str : "", data->len);
  lua_setfield(L, -2, "data");
  freeReplyObject(r);
  free(m);
}

static int msg_done(lua_State *L, int status, lua_KContext ctx) {
  rop *op = (rop *)ctx;
  rconn *c = op->c;
  (void)status;
  if (c->mhead) {                           /* messages win over a late error */
    op_unref(op);
    pop_message(L, c);
    return 1;
  }
  if (op->failed && op->kind == OP_MSG && strcmp(op->code, "timeout") == 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");   /* no message in time: not a failure */
  } else if (op->failed) {
    mg_push_error(L, op->code, op->retryable, op->err);
  } else {
    mg_push_error(L, CONN_CODE(c), conn_error(c));
  }
  op_unref(op);
  return 2;
}

static void msg_cancel(mg_waiter *w) {
  rop *op = (rop *)w;
  op_stop_timer(op);
  if (op->c->msg_op == op) op->c->msg_op = NULL;
  op_unref(op);
}

/* conn:next_message([timeout]) -> msg | nil, "timeout" | nil, err */
static int l_next_message(lua_State *L) {
  rconn *c = check_conn(L);
  double timeout = luaL_optnumber(L, 2, 0);
  if (c->mhead) {
    pop_message(L, c);
    return 1;
  }
  mg_check_yieldable(L, "redis next_message");
  if (!c->ac) return not_connected(L, c);
  if (c->msg_op) return luaL_error(L, "redis: another task is already reading this subscription");
  rop *op = op_new(c, OP_MSG, 0);
  if (!op) return luaL_error(L, "redis: out of memory");
  if (timeout > 0) {
    if (op_start_timer(op, timeout) != 0) {
      op_unref(op);
      return luaL_error(L, "redis: out of memory");
    }
  }
  c->msg_op = op;
  lua_settop(L, 1);
  return mg_await(L, &op->w, msg_cancel, msg_done, (lua_KContext)op);
}

/* ---------------------------------------------------------------- misc methods */

static int l_close(lua_State *L) {
  rconn *c = check_conn(L);
  c->closing = 1;
  if (c->ac) {
    snprintf(c->err, ERRLEN, "redis: connection closed");
    conn_drop(c, "redis: connection closed");
  }
  while (c->mhead) {
    rmsg *m = c->mhead;
    c->mhead = m->next;
    freeReplyObject(m->reply);
    free(m);
  }
  c->mtail = NULL;
  c->mcount = 0;
  return 0;
}

static int l_gc(lua_State *L) {
  rconn *c = luaL_checkudata(L, 1, CONN_MT);
  if (c->ac) {
    c->closing = 1;
    c->ac->data = NULL;         /* no callbacks into freed memory */
    redisAsyncContext *ac = c->ac;
    c->ac = NULL;
    redisAsyncFree(ac);
  }
  while (c->mhead) {
    rmsg *m = c->mhead;
    c->mhead = m->next;
    freeReplyObject(m->reply);
    free(m);
  }
  return 0;
}

static int l_connected(lua_State *L) {
  rconn *c = check_conn(L);
  lua_pushboolean(L, c->ac != NULL && c->connected);
  return 1;
}

static int l_error(lua_State *L) {
  rconn *c = check_conn(L);
  if (c->ac) lua_pushnil(L);
  else lua_pushstring(L, conn_error(c));
  return 1;
}

static int l_inflight(lua_State *L) {
  rconn *c = check_conn(L);
  lua_pushinteger(L, c->inflight);
  return 1;
}

static int l_set_timeout(lua_State *L) {
  rconn *c = check_conn(L);
  double t = luaL_optnumber(L, 2, 0);
  luaL_argcheck(L, t >= 0, 2, "timeout must be >= 0 seconds");
  c->timeout = t;
  return 0;
}

static int l_set_drop_on_cancel(lua_State *L) {
  rconn *c = check_conn(L);
  c->drop_on_cancel = lua_toboolean(L, 2);
  return 0;
}

static int l_tostring(lua_State *L) {
  rconn *c = check_conn(L);
  lua_pushfstring(L, "redis connection (%s): %p", c->ac ? "open" : "closed", (void *)c);
  return 1;
}

static const luaL_Reg conn_methods[] = {
  { "call", l_call },
  { "pipeline", l_pipeline },
  { "subscribe", l_subscribe },
  { "next_message", l_next_message },
  { "close", l_close },
  { "connected", l_connected },
  { "error", l_error },
  { "inflight", l_inflight },
  { "set_timeout", l_set_timeout },
  { "set_drop_on_cancel", l_set_drop_on_cancel },
  { NULL, NULL }
};

static const luaL_Reg funcs[] = {
  { "connect", l_connect },
  { NULL, NULL }
};

int mg_open_redis(lua_State *L) {
  mg_register_class(L, CONN_MT, conn_methods, l_gc, l_close, l_tostring);
  luaL_newlib(L, funcs);
  push_null(L);
  lua_setfield(L, -2, "null");
  return 1;
}
