/*
** server.c — the HTTP/1.x server on the runtime's libuv loop (core.server).
**
** Owns listening sockets, connections, their deadlines and output queues,
** and hands complete requests to Lua. Parsing is http1.c, routes route.c,
** static files static.c, TLS tls.c. Lua never runs in a libuv callback:
** a request that matches a route is queued on its server and wakes the
** server's accept-loop task (srv:accept()), which spawns one task per
** request; everything else (404, 405, OPTIONS, CORS preflight, static
** files, limit errors) is answered here in C.
**
**   core.server.listen(opts) -> server | nil, err
**   server:accept() -> request, route, method, path, params... | nil (closed)
**   server:port()  server:stats()  server:drain()  server:wait_idle()
**   server:close()
**   request:respond(status, headers, body, default_type) -> true | nil, "closed"
**   request:start(status, headers)  request:write(chunk)  request:finish()
**   request:headers()  request:body()  request:query()  request:target()
**   request:remote()  request:id()  request:started()  request:closed()
**   request:abort()
**
** Lifetimes. A server (C struct) is referenced by its Lua userdata, its
** listening socket, its deadline timer, each connection and each Lua
** request object; it is freed when the last of these goes. A connection
** is freed only in its uv_close callback. While Lua handles a request, the
** request object (Lua userdata) and the connection point at each other;
** whichever ends first (the response finishes, the client goes away, the
** object is collected) unlinks the pair, so neither ever reaches freed
** memory. The request's bytes (mg_h1_request) belong to the Lua object once
** it exists, so a handler can still read them after its client has gone.
**
** Deadlines. A server has one libuv timer and five lists of connections
** (waiting for a request head, idle between requests, reading a body,
** lingering before close, blocked sending); each list has one duration, so
** appending at the tail keeps it sorted and the timer only needs the
** earliest head.
**
** Output. Writes go straight to the socket with uv_try_write; what the
** kernel does not take is copied into a uv_write request. A streamed
** response's write() waits (yields) while more than `stream_buffer` bytes
** are queued on its connection, so a slow client never makes the server
** buffer without bound.
*/
#define _GNU_SOURCE
#include "mg.h"
#include "server.h"
#include "tls.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define SERVER_MT "moongraph.server"
#define REQUEST_MT "moongraph.server.request"

#define READ_SLAB (64 * 1024)
#define LINGER_MS 2000
#define FILE_CHUNK (64 * 1024)
#define MAX_REQUEST_ID 64

typedef struct server server;
typedef struct conn conn;
typedef struct sreq sreq;

/* deadline lists: read side (one at a time) and send side */
enum { L_HEADER, L_IDLE, L_BODY, L_LINGER, L_SEND, L_COUNT };
enum { LINK_READ, LINK_SEND };

typedef struct {
  conn *prev, *next;
  int list;                   /* -1 when not linked */
  uint64_t due;               /* uv_now() ms */
} dlink;

typedef struct {
  conn *head, *tail;
  int n;
} dlist;

enum { CORS_OFF, CORS_ANY, CORS_LIST };

typedef struct {
  int mode;
  char **origins;
  int norigins;
  char *allow_headers;        /* NULL: echo what the preflight asks */
  char *expose_headers;
  int credentials;
  int max_age;
} cors_cfg;

enum { S_LISTENING, S_DRAINING, S_CLOSED };

struct server {
  int refs;
  int state;
  uv_tcp_t listener;
  int listener_open;
  uv_timer_t timer;
  int timer_open;
  uint64_t timer_due;         /* 0: not armed */
  conn *conns;                /* open connections */
  int nconns;
  conn *ready_head, *ready_tail;   /* requests waiting for accept() */
  int nready;
  mg_waiter accept_w;
  mg_waiter idle_w;           /* wait_idle(): woken when nconns reaches 0 */
  dlist lists[L_COUNT];
  uint64_t timeout_ms[L_COUNT];
  mg_h1_limits limits;
  int max_connections;
  size_t stream_buffer;
  int accept_paused;
  mg_routes routes;
  mg_static_root root;
  int has_static;
  cors_cfg cors;
  int log_fd, log_owned;
  mg_tls_ctx *tls;
  int port;
  /* counters */
  uint64_t requests_total, connections_total;
  int active;                 /* requests handed to Lua, response unfinished */
  int writers_waiting;
};

struct conn {
  uv_tcp_t tcp;
  server *srv;
  conn *prev, *next;          /* srv->conns */
  conn *rprev, *rnext;        /* srv->ready queue */
  dlink dl[2];
  mg_h1_reader rd;
  mg_tls_conn *tls;
  char *in;                   /* received, not yet parsed (pipelined) */
  size_t in_len, in_cap;
  unsigned closing : 1;       /* uv_close called */
  unsigned reading : 1;
  unsigned handling : 1;      /* a request is being answered */
  unsigned queued : 1;        /* in the ready queue */
  unsigned eof : 1;           /* the client sent FIN */
  unsigned finishing : 1;     /* close once the output is flushed */
  unsigned shut : 1;          /* uv_shutdown done or under way */
  unsigned continue_sent : 1;
  unsigned resume_on_drain : 1;
  unsigned in_input : 1;       /* conn_input is on the stack */
  unsigned again : 1;          /* ...and should parse c->in once more */
  /* the request being answered */
  mg_h1_request *q;
  mg_route_match m;
  sreq *req;                  /* its Lua object, once accepted */
  uint64_t t0;                /* when it was complete (uv_hrtime) */
  unsigned keep_alive : 1, head_only : 1, chunked : 1, started : 1,
           bodyless : 1, cors_origin_ok : 1;
  int status;
  uint64_t body_bytes;
  int file_fd;
  uint64_t file_left;
  char peer[48];
  char rid[MAX_REQUEST_ID + 1];   /* the request's id (X-Request-Id) */
};

struct sreq {
  mg_waiter w;
  conn *c;                    /* NULL once unlinked */
  server *srv;
  mg_h1_request *q;
  char *path;
  size_t path_len;
  const char *query;
  size_t query_len;
  unsigned started : 1, finished : 1, closed : 1, waiting : 1;
  char rid[MAX_REQUEST_ID + 1];
};

static int request_mt_ref = LUA_NOREF;
static char read_slab[READ_SLAB];

static void conn_close(conn *c);
static void conn_input(conn *c, const char *data, size_t n);
static void after_response(conn *c);
static void pump_file(conn *c);
static void srv_unref(server *srv);

/* ------------------------------------------------------------ utilities */

typedef struct {
  char *p;
  size_t len, cap;
} sbuf;

static sbuf scratch;          /* response heads; sent (or copied) at once */

static void sb_need(sbuf *b, size_t n) {
  if (b->len + n <= b->cap) return;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->len + n) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) abort();
  b->p = p;
  b->cap = cap;
}

static void sb_add(sbuf *b, const char *s, size_t n) {
  sb_need(b, n);
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[256];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    sb_add(b, tmp, (size_t)n);
  } else {
    sb_need(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
  }
}

static void sb_u64(sbuf *b, uint64_t v) {
  char tmp[24];
  int i = sizeof tmp;
  do {
    tmp[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  sb_add(b, tmp + i, sizeof tmp - (size_t)i);
}

static uint64_t now_ms(server *srv) {
  (void)srv;
  return uv_now(mg_loop());
}

/* ------------------------------------------------------------ deadlines */

static void timer_fired(uv_timer_t *t);

static void timer_arm(server *srv, uint64_t due) {
  if (!srv->timer_open) return;
  if (srv->timer_due && srv->timer_due <= due) return;
  uint64_t now = now_ms(srv);
  uv_timer_start(&srv->timer, timer_fired, due > now ? due - now : 0, 0);
  srv->timer_due = due;
}

static void dl_remove(conn *c, int which) {
  dlink *l = &c->dl[which];
  if (l->list < 0) return;
  dlist *d = &c->srv->lists[l->list];
  if (l->prev) l->prev->dl[which].next = l->next;
  else d->head = l->next;
  if (l->next) l->next->dl[which].prev = l->prev;
  else d->tail = l->prev;
  d->n--;
  l->prev = l->next = NULL;
  l->list = -1;
}

/* Put c at the tail of list `list` with a fresh deadline. */
static void dl_set(conn *c, int list) {
  int which = list == L_SEND ? LINK_SEND : LINK_READ;
  dl_remove(c, which);
  server *srv = c->srv;
  dlist *d = &srv->lists[list];
  dlink *l = &c->dl[which];
  l->list = list;
  l->due = now_ms(srv) + srv->timeout_ms[list];
  l->next = NULL;
  l->prev = d->tail;
  if (d->tail) d->tail->dl[which].next = c;
  else d->head = c;
  d->tail = c;
  d->n++;
  timer_arm(srv, l->due);
}

static void respond_error(conn *c, int status, const char *reason);

static void expire(conn *c, int list) {
  switch (list) {
    case L_HEADER:
      if (mg_h1_in_head(&c->rd)) respond_error(c, 408, "request header timeout");
      else conn_close(c);
      break;
    case L_BODY:
      respond_error(c, 408, "request body timeout");
      break;
    default:
      conn_close(c);
  }
}

static void timer_fired(uv_timer_t *t) {
  server *srv = t->data;
  srv->timer_due = 0;
  uint64_t now = now_ms(srv);
  for (int i = 0; i < L_COUNT; i++) {
    int which = i == L_SEND ? LINK_SEND : LINK_READ;
    dlist *d = &srv->lists[i];
    while (d->head && d->head->dl[which].due <= now) {
      conn *c = d->head;
      dl_remove(c, which);
      expire(c, i);
    }
  }
  uint64_t next = 0;
  for (int i = 0; i < L_COUNT; i++) {
    int which = i == L_SEND ? LINK_SEND : LINK_READ;
    dlist *d = &srv->lists[i];
    if (d->head && (!next || d->head->dl[which].due < next)) next = d->head->dl[which].due;
  }
  if (next) timer_arm(srv, next);
}

/* --------------------------------------------------------------- output */

typedef struct {
  uv_write_t req;
  conn *c;
  char data[];
} wreq;

static void on_written(uv_write_t *req, int status);

/* Queue bytes on the socket (already encrypted when TLS). */
static int send_raw(conn *c, uv_buf_t *bufs, unsigned n) {
  if (c->closing) return -1;
  uv_stream_t *s = (uv_stream_t *)&c->tcp;
  size_t total = 0;
  for (unsigned i = 0; i < n; i++) total += bufs[i].len;
  if (total == 0) return 0;
  size_t done = 0;
  if (s->write_queue_size == 0) {
    int r = uv_try_write(s, bufs, n);
    if (r < 0 && r != UV_EAGAIN) {
      conn_close(c);
      return -1;
    }
    if (r > 0) done = (size_t)r;
    if (done == total) return 0;
  }
  size_t rest = total - done;
  wreq *w = malloc(sizeof *w + rest);
  if (!w) {
    conn_close(c);
    return -1;
  }
  w->c = c;
  size_t o = 0, skip = done;
  for (unsigned i = 0; i < n; i++) {
    size_t len = bufs[i].len;
    if (skip >= len) { skip -= len; continue; }
    memcpy(w->data + o, bufs[i].base + skip, len - skip);
    o += len - skip;
    skip = 0;
  }
  uv_buf_t b = uv_buf_init(w->data, (unsigned)rest);
  int r = uv_write(&w->req, s, &b, 1, on_written);
  if (r < 0) {
    free(w);
    conn_close(c);
    return -1;
  }
  if (c->dl[LINK_SEND].list < 0) dl_set(c, L_SEND);
  return 0;
}

static int conn_send(conn *c, uv_buf_t *bufs, unsigned n) {
  if (!c->tls) return send_raw(c, bufs, n);
  if (c->closing) return -1;
  for (unsigned i = 0; i < n; i++) {
    if (mg_tls_write(c->tls, bufs[i].base, bufs[i].len) < 0) {
      conn_close(c);
      return -1;
    }
  }
  static char out[READ_SLAB];
  size_t len;
  while ((len = mg_tls_pull(c->tls, out, sizeof out)) > 0) {
    uv_buf_t b = uv_buf_init(out, (unsigned)len);
    if (send_raw(c, &b, 1)) return -1;
  }
  return 0;
}

static void do_shutdown(conn *c);

static void on_written(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  conn *c = w->c;
  free(w);
  if (c->closing) return;
  if (status < 0) {
    conn_close(c);
    return;
  }
  size_t queued = c->tcp.write_queue_size;
  if (queued == 0) dl_remove(c, LINK_SEND);
  else dl_set(c, L_SEND);   /* progress: a fresh send deadline */
  sreq *s = c->req;
  if (s && s->waiting && queued <= c->srv->stream_buffer / 2) mg_wake(&s->w);
  if (c->file_fd >= 0) pump_file(c);
  if (queued == 0 && c->finishing && !c->shut) do_shutdown(c);
  if (c->resume_on_drain && queued <= c->srv->stream_buffer) {
    c->resume_on_drain = 0;
    conn_input(c, NULL, 0);
  }
}

/* ---------------------------------------------------------- access log */

static void json_str(sbuf *b, const char *s, size_t n) {
  sb_add(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') {
      char e[2] = {'\\', (char)ch};
      sb_add(b, e, 2);
    } else if (ch < 0x20 || ch >= 0x7f) {
      sb_fmt(b, "\\u%04x", ch);
    } else {
      sb_add(b, (const char *)&ch, 1);
    }
  }
  sb_add(b, "\"", 1);
}

static void log_request(conn *c, int aborted) {
  server *srv = c->srv;
  if (srv->log_fd < 0 || !c->q) return;
  static sbuf line;
  line.len = 0;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  time_t secs = tv.tv_sec;
  gmtime_r(&secs, &tm);
  sb_fmt(&line, "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",\"remote\":",
         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
         tm.tm_sec, (int)(tv.tv_usec / 1000));
  json_str(&line, c->peer, strlen(c->peer));
  sb_fmt(&line, ",\"method\":\"%s\",\"path\":", mg_h1_method(c->q));
  /* the path as sent, without the query: queries may carry secrets */
  const char *t = c->q->head;
  size_t tl = c->q->target_len, pl = 0;
  while (pl < tl && t[pl] != '?' && t[pl] != '#') pl++;
  json_str(&line, t, pl);
  double ms = (double)(uv_hrtime() - c->t0) / 1e6;
  sb_fmt(&line, ",\"status\":%d,\"bytes\":%llu,\"ms\":%.3f,\"request_id\":\"%s\"%s}\n",
         c->status, (unsigned long long)c->body_bytes, ms, c->rid,
         aborted ? ",\"aborted\":true" : "");
  ssize_t w = write(srv->log_fd, line.p, line.len);
  (void)w;
}

/* ---------------------------------------------------------- request ids */

/* Every request has an id, sent back in X-Request-Id and written to the
** access log, so what a client reports and what the server logged meet:
** the client's own X-Request-Id when it is a plain token of at most
** MAX_REQUEST_ID bytes, else one made here (a random prefix per process
** and a counter: unique across processes, cheap to make). */
static int id_char(unsigned char ch) {
  return isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == ':' || ch == '@' ||
         ch == '/' || ch == '+' || ch == '=';
}

static void set_request_id(conn *c, const mg_h1_request *q) {
  size_t n = 0;
  const char *given = q ? mg_h1_header(q, "x-request-id", &n) : NULL;
  if (given && n > 0 && n <= MAX_REQUEST_ID) {
    size_t i = 0;
    while (i < n && id_char((unsigned char)given[i])) i++;
    if (i == n) {
      memcpy(c->rid, given, n);
      c->rid[n] = '\0';
      return;
    }
  }
  static char prefix[18];      /* 16 hex digits and '-' */
  static uint64_t counter;
  if (!prefix[0]) {
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
      r = uv_hrtime() ^ ((uint64_t)getpid() << 32);
    snprintf(prefix, sizeof prefix, "%016llx-", (unsigned long long)r);
  }
  /* (made for every request: no printf) */
  static const char hex[] = "0123456789abcdef";
  char digits[16];
  int nd = 0;
  uint64_t v = ++counter;
  do { digits[nd++] = hex[v & 15]; v >>= 4; } while (v);
  memcpy(c->rid, prefix, 17);
  for (int i = 0; i < nd; i++) c->rid[17 + i] = digits[nd - 1 - i];
  c->rid[17 + nd] = '\0';
}

/* ---------------------------------------------------- response building */

/* Headers every response of c carries: Date, framing, Connection, CORS. */
static void head_begin(sbuf *b, conn *c, int status) {
  char date[48];
  b->len = 0;
  char line[16] = "HTTP/1.1 000 ";
  line[9] = (char)('0' + status / 100 % 10);
  line[10] = (char)('0' + status / 10 % 10);
  line[11] = (char)('0' + status % 10);
  sb_add(b, line, 13);
  sb_str(b, mg_h1_reason(status));
  sb_add(b, "\r\n", 2);
  sb_add(b, date, mg_h1_date_line(date));
  if (!c->keep_alive) sb_str(b, "Connection: close\r\n");
  else if (c->q && c->q->minor == 0) sb_str(b, "Connection: keep-alive\r\n");
  if (c->rid[0]) {
    sb_str(b, "X-Request-Id: ");
    sb_str(b, c->rid);
    sb_str(b, "\r\n");
  }
  const cors_cfg *cc = &c->srv->cors;
  if (cc->mode != CORS_OFF && c->cors_origin_ok) {
    size_t ol;
    const char *origin = mg_h1_header(c->q, "origin", &ol);
    if (cc->mode == CORS_ANY && !cc->credentials) {
      sb_str(b, "Access-Control-Allow-Origin: *\r\n");
    } else if (origin) {
      sb_str(b, "Access-Control-Allow-Origin: ");
      sb_add(b, origin, ol);
      sb_str(b, "\r\nVary: Origin\r\n");
    }
    if (cc->credentials) sb_str(b, "Access-Control-Allow-Credentials: true\r\n");
    if (cc->expose_headers) sb_fmt(b, "Access-Control-Expose-Headers: %s\r\n", cc->expose_headers);
  }
}

static void allow_list(sbuf *b, conn *c) {
  int first = 1;
  uint64_t a = c->m.allowed;
  if (c->m.any_method) a = ~(uint64_t)0 & (((uint64_t)1 << (HTTP_SOURCE + 1)) - 1);
  if (a & ((uint64_t)1 << HTTP_GET)) a |= (uint64_t)1 << HTTP_HEAD;
  a |= (uint64_t)1 << HTTP_OPTIONS;
  for (unsigned m = 0; m <= HTTP_SOURCE; m++) {
    if (!(a & ((uint64_t)1 << m))) continue;
    if (!first) sb_str(b, ", ");
    sb_str(b, http_method_str((enum http_method)m));
    first = 0;
  }
}

/* Send a whole response built in C (errors, 404, 405, preflight). */
static void respond_simple(conn *c, int status, const char *extra, const char *body) {
  sbuf *b = &scratch;
  c->status = status;
  head_begin(b, c, status);
  if (extra) sb_str(b, extra);
  size_t bl = body ? strlen(body) : 0;
  if (!mg_h1_bodyless(status)) {
    sb_fmt(b, "Content-Type: application/json\r\nContent-Length: %zu\r\n", bl);
  }
  sb_str(b, "\r\n");
  if (body && !c->head_only && !mg_h1_bodyless(status)) sb_add(b, body, bl);
  c->body_bytes = c->head_only ? 0 : bl;
  uv_buf_t buf = uv_buf_init(b->p, (unsigned)b->len);
  if (conn_send(c, &buf, 1) == 0) after_response(c);
}

static void error_body(char *out, size_t n, const char *msg) {
  snprintf(out, n, "{\"error\":\"%s\"}", msg);
}

/* Answer a request that could not be read (or timed out) and close. */
static void respond_error(conn *c, int status, const char *reason) {
  if (c->closing) return;
  dl_remove(c, LINK_READ);
  if (c->handling) {   /* a response is already on its way */
    conn_close(c);
    return;
  }
  c->handling = 1;
  c->keep_alive = 0;
  c->head_only = 0;
  c->t0 = uv_hrtime();
  set_request_id(c, NULL);
  char body[160];
  error_body(body, sizeof body, reason ? reason : mg_h1_reason(status));
  /* the request's bytes are not kept: log nothing but the status */
  c->status = status;
  sbuf *b = &scratch;
  head_begin(b, c, status);
  size_t bl = strlen(body);
  sb_fmt(b, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", bl);
  sb_add(b, body, bl);
  uv_buf_t buf = uv_buf_init(b->p, (unsigned)b->len);
  if (conn_send(c, &buf, 1) == 0) {
    c->handling = 0;
    c->finishing = 1;
    if (c->tcp.write_queue_size == 0) do_shutdown(c);
  }
}

/* ------------------------------------------------------------ lifecycle */

static void ready_remove(conn *c) {
  if (!c->queued) return;
  server *srv = c->srv;
  if (c->rprev) c->rprev->rnext = c->rnext;
  else srv->ready_head = c->rnext;
  if (c->rnext) c->rnext->rprev = c->rprev;
  else srv->ready_tail = c->rprev;
  c->rprev = c->rnext = NULL;
  c->queued = 0;
  srv->nready--;
}

static void ready_push(conn *c) {
  server *srv = c->srv;
  c->queued = 1;
  c->rnext = NULL;
  c->rprev = srv->ready_tail;
  if (srv->ready_tail) srv->ready_tail->rnext = c;
  else srv->ready_head = c;
  srv->ready_tail = c;
  srv->nready++;
  mg_wake(&srv->accept_w);
}

/* Unlink a Lua request object from its connection. */
static void detach(sreq *s) {
  conn *c = s->c;
  if (!c) return;
  s->c = NULL;
  c->req = NULL;
  c->q = NULL;                /* s owns the request's bytes */
  s->srv->active--;
  if (s->waiting) mg_wake(&s->w);
}

static void on_conn_closed(uv_handle_t *h) {
  conn *c = (conn *)h;
  server *srv = c->srv;
  mg_h1_reader_free(&c->rd);
  if (c->tls) mg_tls_conn_free(c->tls);
  free(c->in);
  free(c);
  srv_unref(srv);
}

static void accept_one(server *srv);

/* Close now: pending output is dropped, a waiting writer gets "closed". */
static void conn_close(conn *c) {
  if (c->closing) return;
  server *srv = c->srv;
  c->closing = 1;
  dl_remove(c, LINK_READ);
  dl_remove(c, LINK_SEND);
  ready_remove(c);
  if (c->handling && c->q && (c->started || c->req)) log_request(c, 1);
  if (c->req) {
    sreq *s = c->req;
    s->closed = 1;
    detach(s);
  } else if (c->q) {
    mg_h1_request_free(c->q);
  }
  c->q = NULL;
  free(c->m.path);
  c->m.path = NULL;
  if (c->file_fd >= 0) {
    close(c->file_fd);
    c->file_fd = -1;
  }
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  srv->nconns--;
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  if (srv->nconns == 0) mg_wake(&srv->idle_w);
  if (srv->accept_paused && srv->state == S_LISTENING) accept_one(srv);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  conn *c = req->data;
  free(req);
  if (c->closing) return;
  if (status < 0) {
    conn_close(c);
    return;
  }
  /* linger: read and drop what the client still sends, so closing does not
  ** reset the connection before it has read our answer */
  if (c->eof) conn_close(c);
  else dl_set(c, L_LINGER);
}

static void do_shutdown(conn *c) {
  if (c->shut || c->closing) return;
  c->shut = 1;
  if (c->tls) mg_tls_close_notify(c->tls), conn_send(c, NULL, 0);
  uv_shutdown_t *req = malloc(sizeof *req);
  if (!req) {
    conn_close(c);
    return;
  }
  req->data = c;
  if (uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
    free(req);
    conn_close(c);
  }
}

/* The response to c's request is complete (all of it queued). */
static void after_response(conn *c) {
  if (c->closing) return;
  server *srv = c->srv;
  log_request(c, 0);
  if (c->req) detach(c->req);
  else if (c->q) mg_h1_request_free(c->q);
  c->q = NULL;
  free(c->m.path);
  c->m.path = NULL;
  c->handling = 0;
  c->started = 0;
  if (!c->keep_alive || c->eof || srv->state != S_LISTENING) {
    c->finishing = 1;
    if (c->tcp.write_queue_size == 0) do_shutdown(c);
    return;
  }
  if (c->tcp.write_queue_size > srv->stream_buffer) {
    c->resume_on_drain = 1;   /* pipelined requests wait for the output */
    return;
  }
  conn_input(c, NULL, 0);
}

/* ---------------------------------------------------------- dispatching */

static int origin_allowed(conn *c) {
  const cors_cfg *cc = &c->srv->cors;
  if (cc->mode == CORS_OFF) return 0;
  size_t ol;
  const char *origin = mg_h1_header(c->q, "origin", &ol);
  if (!origin) return 0;
  if (cc->mode == CORS_ANY) return 1;
  for (int i = 0; i < cc->norigins; i++)
    if (strlen(cc->origins[i]) == ol && memcmp(cc->origins[i], origin, ol) == 0) return 1;
  return 0;
}

static void preflight(conn *c) {
  const cors_cfg *cc = &c->srv->cors;
  sbuf extra = {0};
  sb_str(&extra, "Access-Control-Allow-Methods: ");
  allow_list(&extra, c);
  sb_str(&extra, "\r\n");
  if (cc->allow_headers) {
    sb_fmt(&extra, "Access-Control-Allow-Headers: %s\r\n", cc->allow_headers);
  } else {
    size_t hl;
    const char *h = mg_h1_header(c->q, "access-control-request-headers", &hl);
    if (h && mg_h1_valid_value(h, hl)) {
      sb_str(&extra, "Access-Control-Allow-Headers: ");
      sb_add(&extra, h, hl);
      sb_str(&extra, "\r\n");
    }
  }
  sb_fmt(&extra, "Access-Control-Max-Age: %d\r\n", cc->max_age);
  sb_add(&extra, "", 1);
  respond_simple(c, 204, extra.p, NULL);
  free(extra.p);
}

/* Serve the file for c's path; -1 (nothing sent) when there is none. */
static int serve_static(conn *c) {
  server *srv = c->srv;
  mg_static_file f;
  mg_static_open(&srv->root, c->m.path, c->m.path_len, c->q, &f);
  char body[96];
  switch (f.status) {
    case 200:
    case 304: {
      sbuf *b = &scratch;
      c->status = f.status;
      head_begin(b, c, f.status);
      sb_fmt(b, "ETag: %s\r\nLast-Modified: %s\r\n", f.etag, f.last_modified);
      if (f.status == 200) {
        sb_fmt(b, "Content-Type: %s\r\nContent-Length: %llu\r\n", f.content_type,
               (unsigned long long)f.size);
      }
      sb_str(b, "\r\n");
      uv_buf_t buf = uv_buf_init(b->p, (unsigned)b->len);
      if (conn_send(c, &buf, 1) != 0) {
        if (f.fd >= 0) close(f.fd);
        return 0;
      }
      if (f.status == 304 || c->head_only || f.size == 0) {
        if (f.fd >= 0) close(f.fd);
        after_response(c);
        return 0;
      }
      c->file_fd = f.fd;
      c->file_left = f.size;
      pump_file(c);
      return 0;
    }
    case 301: {
      /* the target's path plus '/', keeping the query */
      const char *t = c->q->head;
      size_t tl = c->q->target_len, pl = 0;
      while (pl < tl && t[pl] != '?') pl++;
      sbuf loc = {0};
      sb_str(&loc, "Location: ");
      sb_add(&loc, t, pl);
      sb_str(&loc, "/");
      sb_add(&loc, t + pl, tl - pl);
      sb_str(&loc, "\r\n");
      sb_add(&loc, "", 1);
      if (!mg_h1_valid_value(loc.p, loc.len - 3)) {
        free(loc.p);
        return -1;
      }
      error_body(body, sizeof body, "moved permanently");
      respond_simple(c, 301, loc.p, body);
      free(loc.p);
      return 0;
    }
    case 403:
      error_body(body, sizeof body, "forbidden");
      respond_simple(c, 403, NULL, body);
      return 0;
    default:
      return -1;
  }
}

/* Read the next piece of a static file into the output (blocking pread of
** a local file, like h2o's and nginx's default). */
static void pump_file(conn *c) {
  while (c->file_fd >= 0 && !c->closing &&
         c->tcp.write_queue_size <= c->srv->stream_buffer) {
    static char buf[FILE_CHUNK];
    size_t want = c->file_left < FILE_CHUNK ? (size_t)c->file_left : FILE_CHUNK;
    ssize_t n = read(c->file_fd, buf, want);
    if (n <= 0) {                 /* truncated under us: cut the response */
      conn_close(c);
      return;
    }
    c->file_left -= (uint64_t)n;
    c->body_bytes += (uint64_t)n;
    uv_buf_t b = uv_buf_init(buf, (unsigned)n);
    if (conn_send(c, &b, 1) != 0) return;
    if (c->file_left == 0) {
      close(c->file_fd);
      c->file_fd = -1;
      after_response(c);
      return;
    }
  }
}

/* A whole request was read: route it. */
static void dispatch(conn *c, mg_h1_request *q) {
  server *srv = c->srv;
  dl_remove(c, LINK_READ);
  c->q = q;
  c->handling = 1;
  c->t0 = uv_hrtime();
  set_request_id(c, q);
  c->status = 0;
  c->body_bytes = 0;
  c->started = 0;
  c->continue_sent = 0;
  c->keep_alive = q->keep_alive && srv->state == S_LISTENING;
  c->head_only = q->method == HTTP_HEAD;
  srv->requests_total++;
  c->cors_origin_ok = origin_allowed(c);
  char body[160];
  int r = mg_routes_match(&srv->routes, q->method, q->head, q->target_len, &c->m);
  if (r == MG_ROUTE_FOUND) {
    ready_push(c);
    return;
  }
  if (r == MG_ROUTE_BAD_PATH) {
    c->keep_alive = 0;
    if (q->target_len == 1 && q->head[0] == '*' && q->method == HTTP_OPTIONS) {
      respond_simple(c, 204, NULL, NULL);
      return;
    }
    error_body(body, sizeof body, "bad request path");
    respond_simple(c, 400, NULL, body);
    return;
  }
  if (q->method == HTTP_OPTIONS && (r == MG_ROUTE_NOT_ALLOWED)) {
    if (c->cors_origin_ok && mg_h1_header(q, "access-control-request-method", NULL)) {
      preflight(c);
      return;
    }
    sbuf extra = {0};
    sb_str(&extra, "Allow: ");
    allow_list(&extra, c);
    sb_str(&extra, "\r\n");
    sb_add(&extra, "", 1);
    respond_simple(c, 204, extra.p, NULL);
    free(extra.p);
    return;
  }
  if (srv->has_static && (q->method == HTTP_GET || q->method == HTTP_HEAD) &&
      serve_static(c) == 0)
    return;
  if (r == MG_ROUTE_NOT_ALLOWED) {
    sbuf extra = {0};
    sb_str(&extra, "Allow: ");
    allow_list(&extra, c);
    sb_str(&extra, "\r\n");
    sb_add(&extra, "", 1);
    error_body(body, sizeof body, "method not allowed");
    respond_simple(c, 405, extra.p, body);
    free(extra.p);
    return;
  }
  error_body(body, sizeof body, "not found");
  respond_simple(c, 404, NULL, body);
}

/* ---------------------------------------------------------------- input */

static void keep_input(conn *c, const char *data, size_t n) {
  if (n == 0) return;
  if (c->in_len + n > c->in_cap) {
    size_t cap = c->in_cap ? c->in_cap : 1024;
    while (cap < c->in_len + n) cap *= 2;
    char *p = realloc(c->in, cap);
    if (!p) {
      conn_close(c);
      return;
    }
    c->in = p;
    c->in_cap = cap;
  }
  memcpy(c->in + c->in_len, data, n);
  c->in_len += n;
}

/* How much a connection may hold of requests it has not started answering
** (pipelining) before it stops reading. */
static size_t input_cap(server *srv) { return srv->limits.max_header + 65536; }

static void start_reading(conn *c);

/* Feed bytes to the parser; with data == NULL, what c->in holds. A
** request answered at once in C (404, static file) ends in after_response,
** which calls back here: that nested call only asks this one to go on, so
** a long pipeline is a loop, not a recursion. */
static void conn_input(conn *c, const char *data, size_t n) {
  if (c->closing) return;
  server *srv = c->srv;
  if (c->handling || c->finishing || c->in_input) {
    if (c->finishing) return;               /* lingering: drop */
    keep_input(c, data, n);
    if (c->in_input) c->again = 1;
    if (c->in_len > input_cap(srv) && c->reading) {
      uv_read_stop((uv_stream_t *)&c->tcp);
      c->reading = 0;
    }
    return;
  }
  c->in_input = 1;
  do {
    c->again = 0;
    char *owned = NULL;
    if (!data) {
      owned = c->in;
      data = owned;
      n = c->in_len;
      c->in = NULL;
      c->in_len = c->in_cap = 0;
    }
    while (n > 0 && !c->closing) {
      size_t used;
      int ev = mg_h1_feed(&c->rd, data, n, &used);
      data += used;
      n -= used;
      if (ev == MG_H1_ERROR) {
        respond_error(c, c->rd.status, c->rd.reason);
        break;
      }
      if (ev == MG_H1_REQUEST) {
        keep_input(c, data, n);
        n = 0;
        dispatch(c, mg_h1_take(&c->rd));
        break;
      }
      /* MG_H1_MORE */
      if (mg_h1_in_body(&c->rd)) {
        dl_set(c, L_BODY);
        if (mg_h1_wants_continue(&c->rd) && !c->continue_sent) {
          c->continue_sent = 1;
          uv_buf_t b = uv_buf_init("HTTP/1.1 100 Continue\r\n\r\n", 25);
          conn_send(c, &b, 1);
        }
      } else if (mg_h1_in_head(&c->rd) && c->dl[LINK_READ].list != L_HEADER) {
        dl_set(c, L_HEADER);
      }
    }
    free(owned);
    data = NULL;
    n = 0;
  } while (c->again && !c->closing && !c->handling && !c->finishing);
  c->in_input = 0;
  if (c->closing || c->handling || c->finishing) return;
  if (!mg_h1_in_head(&c->rd) && !mg_h1_in_body(&c->rd)) {
    /* between requests */
    if (c->eof) {
      conn_close(c);
      return;
    }
    if (c->dl[LINK_READ].list != L_IDLE) dl_set(c, L_IDLE);
  } else if (c->eof) {
    conn_close(c);          /* the client left in the middle of a request */
    return;
  }
  if (!c->reading) start_reading(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  buf->base = read_slab;
  buf->len = sizeof read_slab;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn *c = (conn *)s;
  if (c->closing) return;
  if (nread == 0) return;
  if (nread < 0) {
    if (nread != UV_EOF || c->finishing) {
      conn_close(c);
      return;
    }
    c->eof = 1;
    uv_read_stop(s);
    c->reading = 0;
    if (c->handling) {
      c->keep_alive = 0;
      /* a stream being written has lost its reader */
      if (c->started && c->req) conn_close(c);
      return;
    }
    conn_input(c, NULL, 0);
    return;
  }
  if (c->finishing) return;   /* lingering: drop */
  if (!c->tls) {
    conn_input(c, buf->base, (size_t)nread);
    return;
  }
  if (mg_tls_feed(c->tls, buf->base, (size_t)nread) < 0) {
    conn_close(c);
    return;
  }
  static char plain[READ_SLAB];
  for (;;) {
    ssize_t n = mg_tls_read(c->tls, plain, sizeof plain);
    if (n < 0) {
      conn_close(c);
      return;
    }
    conn_send(c, NULL, 0);    /* handshake bytes */
    if (c->closing || n == 0) break;
    conn_input(c, plain, (size_t)n);
    if (c->closing) return;
  }
}

static void start_reading(conn *c) {
  if (c->reading || c->closing || c->eof) return;
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = 1;
  else conn_close(c);
}

/* --------------------------------------------------------------- accept */

/* Make room at max_connections: close the connection that has waited
** longest without a request (idle keep-alive first, then new ones that
** sent nothing). */
static int evict_idle(server *srv) {
  conn *c = srv->lists[L_IDLE].head;
  if (!c) {
    int scanned = 0;
    for (conn *h = srv->lists[L_HEADER].head; h && scanned < 64; h = h->dl[LINK_READ].next, scanned++) {
      if (!mg_h1_in_head(&h->rd)) { c = h; break; }
    }
  }
  if (!c) return 0;
  conn_close(c);
  return 1;
}

static void accept_one(server *srv) {
  if (srv->state != S_LISTENING) return;
  if (srv->nconns >= srv->max_connections && !evict_idle(srv)) {
    srv->accept_paused = 1;   /* libuv stops polling until uv_accept */
    return;
  }
  srv->accept_paused = 0;
  conn *c = calloc(1, sizeof *c);
  if (!c) {
    srv->accept_paused = 1;
    return;
  }
  uv_tcp_init(mg_loop(), &c->tcp);
  if (uv_accept((uv_stream_t *)&srv->listener, (uv_stream_t *)&c->tcp) != 0) {
    uv_close((uv_handle_t *)&c->tcp, (uv_close_cb)free);
    return;
  }
  c->srv = srv;
  srv->refs++;
  c->dl[0].list = c->dl[1].list = -1;
  c->file_fd = -1;
  mg_h1_reader_init(&c->rd, &srv->limits);
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  srv->nconns++;
  srv->connections_total++;
  uv_tcp_nodelay(&c->tcp, 1);
  struct sockaddr_storage ss;
  int len = sizeof ss;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6)
      uv_ip6_name((struct sockaddr_in6 *)&ss, c->peer, sizeof c->peer);
    else
      uv_ip4_name((struct sockaddr_in *)&ss, c->peer, sizeof c->peer);
  }
  if (srv->tls) {
    c->tls = mg_tls_conn_new(srv->tls);
    if (!c->tls) {
      conn_close(c);
      return;
    }
  }
  dl_set(c, L_HEADER);
  start_reading(c);
}

static void on_connection(uv_stream_t *l, int status) {
  server *srv = l->data;
  if (status < 0) return;
  accept_one(srv);
}

/* ------------------------------------------------------ server lifetime */

static void srv_free(server *srv) {
  mg_routes_free(&srv->routes);
  if (srv->has_static) mg_static_root_close(&srv->root);
  for (int i = 0; i < srv->cors.norigins; i++) free(srv->cors.origins[i]);
  free(srv->cors.origins);
  free(srv->cors.allow_headers);
  free(srv->cors.expose_headers);
  if (srv->log_owned) close(srv->log_fd);
  if (srv->tls) mg_tls_ctx_free(srv->tls);
  free(srv);
}

static void srv_unref(server *srv) {
  if (--srv->refs == 0) srv_free(srv);
}

static void on_handle_closed(uv_handle_t *h) {
  srv_unref(h->data);
}

static void stop_listening(server *srv) {
  if (!srv->listener_open) return;
  srv->listener_open = 0;
  uv_close((uv_handle_t *)&srv->listener, on_handle_closed);
}

/* Stop accepting; close connections that hold no request. */
static void srv_drain(server *srv) {
  if (srv->state != S_LISTENING) return;
  srv->state = S_DRAINING;
  stop_listening(srv);
  conn *c = srv->conns;
  while (c) {
    conn *next = c->next;
    if (!c->handling && !c->finishing) conn_close(c);
    else c->keep_alive = 0;
    c = next;
  }
}

static void srv_close(server *srv) {
  if (srv->state == S_CLOSED) return;
  srv->state = S_CLOSED;
  stop_listening(srv);
  while (srv->conns) conn_close(srv->conns);
  if (srv->timer_open) {
    srv->timer_open = 0;
    uv_close((uv_handle_t *)&srv->timer, on_handle_closed);
  }
  mg_wake(&srv->accept_w);
  mg_wake(&srv->idle_w);
}

/* ------------------------------------------------------ Lua: the server */

typedef struct {
  server *srv;
} server_ud;

static server *check_server(lua_State *L) {
  server_ud *u = luaL_checkudata(L, 1, SERVER_MT);
  if (!u->srv) luaL_error(L, "server is closed");
  return u->srv;
}

static int push_request(lua_State *L, server *srv) {
  conn *c = srv->ready_head;
  ready_remove(c);
  sreq *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  lua_rawgeti(L, LUA_REGISTRYINDEX, request_mt_ref);
  lua_setmetatable(L, -2);
  s->c = c;
  s->srv = srv;
  srv->refs++;
  s->q = c->q;
  s->path = c->m.path;
  s->path_len = c->m.path_len;
  s->query = c->m.query;
  s->query_len = c->m.query_len;
  memcpy(s->rid, c->rid, sizeof s->rid);
  c->m.path = NULL;
  c->req = s;
  srv->active++;
  int np = c->m.nparams;
  luaL_checkstack(L, np + 4, "too many route parameters");
  lua_pushinteger(L, c->m.route);
  lua_pushstring(L, mg_h1_method(s->q));
  lua_pushlstring(L, s->path, s->path_len);
  for (int i = 0; i < np; i++)
    lua_pushlstring(L, s->path + c->m.params[i].off, c->m.params[i].len);
  return 4 + np;
}

/* A task waiting in accept() or wait_idle() holds a reference on the
** server: close() wakes it, and the handles' close callbacks may drop every
** other reference before it runs. The continuation drops it first, and
** finds the server closed when it was the last. */
static server *wait_end(lua_KContext ctx) {
  server *srv = (server *)ctx;
  if (--srv->refs > 0) return srv;
  srv_free(srv);
  return NULL;
}

static void accept_cancel(mg_waiter *w) {
  srv_unref((server *)((char *)w - offsetof(server, accept_w)));
}

static int accept_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  server *srv = wait_end(ctx);
  if (srv && srv->ready_head) return push_request(L, srv);
  if (!srv || srv->state == S_CLOSED) {
    lua_pushnil(L);
    return 1;
  }
  srv->refs++;
  return mg_await(L, &srv->accept_w, accept_cancel, accept_k, ctx);
}

/* server:accept() -> request, route, method, path, params... | nil when closed */
static int l_accept(lua_State *L) {
  server *srv = check_server(L);
  if (srv->ready_head) return push_request(L, srv);
  if (srv->state == S_CLOSED) {
    lua_pushnil(L);
    return 1;
  }
  mg_check_yieldable(L, "server:accept");
  srv->refs++;
  return mg_await(L, &srv->accept_w, accept_cancel, accept_k, (lua_KContext)srv);
}

static void idle_cancel(mg_waiter *w) {
  srv_unref((server *)((char *)w - offsetof(server, idle_w)));
}

static int idle_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  server *srv = wait_end(ctx);
  if (!srv || srv->nconns == 0 || srv->state == S_CLOSED) {
    lua_pushboolean(L, 1);
    return 1;
  }
  srv->refs++;
  return mg_await(L, &srv->idle_w, idle_cancel, idle_k, ctx);
}

/* server:wait_idle() waits until no connection is left. */
static int l_wait_idle(lua_State *L) {
  server *srv = check_server(L);
  if (srv->nconns == 0 || srv->state == S_CLOSED) {
    lua_pushboolean(L, 1);
    return 1;
  }
  mg_check_yieldable(L, "server:wait_idle");
  srv->refs++;
  return mg_await(L, &srv->idle_w, idle_cancel, idle_k, (lua_KContext)srv);
}

static int l_port(lua_State *L) {
  lua_pushinteger(L, check_server(L)->port);
  return 1;
}

static int l_stats(lua_State *L) {
  server *srv = check_server(L);
  size_t buffered = 0;
  int streaming = 0;
  for (conn *c = srv->conns; c; c = c->next) {
    buffered += c->tcp.write_queue_size;
    if (c->req && c->started) streaming++;
  }
  lua_createtable(L, 0, 10);
  lua_pushinteger(L, srv->nconns);
  lua_setfield(L, -2, "connections");
  lua_pushinteger(L, srv->lists[L_IDLE].n);
  lua_setfield(L, -2, "idle");
  lua_pushinteger(L, srv->active);
  lua_setfield(L, -2, "active");
  lua_pushinteger(L, srv->nready);
  lua_setfield(L, -2, "queued");
  lua_pushinteger(L, streaming);
  lua_setfield(L, -2, "streaming");
  lua_pushinteger(L, (lua_Integer)buffered);
  lua_setfield(L, -2, "buffered");
  lua_pushinteger(L, srv->writers_waiting);
  lua_setfield(L, -2, "writers_waiting");
  lua_pushinteger(L, (lua_Integer)srv->requests_total);
  lua_setfield(L, -2, "requests_total");
  lua_pushinteger(L, (lua_Integer)srv->connections_total);
  lua_setfield(L, -2, "connections_total");
  lua_pushboolean(L, srv->accept_paused);
  lua_setfield(L, -2, "accept_paused");
  return 1;
}

static int l_drain(lua_State *L) {
  srv_drain(check_server(L));
  return 0;
}

static int l_server_close(lua_State *L) {
  server_ud *u = luaL_checkudata(L, 1, SERVER_MT);
  if (u->srv) {
    server *srv = u->srv;
    u->srv = NULL;
    srv_close(srv);
    srv_unref(srv);
  }
  return 0;
}

/* ------------------------------------------------------ Lua: listen */

static const char *opt_string(lua_State *L, int t, const char *name) {
  int ty = lua_getfield(L, t, name);
  const char *s = NULL;
  if (ty == LUA_TSTRING) s = lua_tostring(L, -1);
  else if (ty != LUA_TNIL)
    luaL_error(L, "bad argument #1 to 'listen' (%s must be a string)", name);
  lua_pop(L, 1);   /* the string stays referenced by the options table */
  return s;
}

static lua_Number opt_number(lua_State *L, int t, const char *name, lua_Number dflt) {
  int ty = lua_getfield(L, t, name);
  lua_Number v = dflt;
  if (ty == LUA_TNUMBER) v = lua_tonumber(L, -1);
  else if (ty != LUA_TNIL)
    luaL_error(L, "bad argument #1 to 'listen' (%s must be a number)", name);
  lua_pop(L, 1);
  return v;
}

static char *dup_or_die(lua_State *L, const char *s) {
  char *d = strdup(s);
  if (!d) luaL_error(L, "out of memory");
  return d;
}

static void read_cors(lua_State *L, int t, cors_cfg *cc) {
  int ty = lua_getfield(L, t, "cors");
  if (ty == LUA_TNIL) {
    lua_pop(L, 1);
    return;
  }
  luaL_checktype(L, -1, LUA_TTABLE);
  int ci = lua_gettop(L);
  cc->mode = CORS_ANY;
  cc->max_age = 600;
  if (lua_getfield(L, ci, "origins") == LUA_TTABLE) {
    int n = (int)lua_rawlen(L, -1);
    cc->origins = calloc((size_t)n + 1, sizeof *cc->origins);
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      const char *o = lua_tostring(L, -1);
      if (o && strcmp(o, "*") != 0) {
        cc->origins[cc->norigins++] = dup_or_die(L, o);
        cc->mode = CORS_LIST;
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  const char *s;
  if ((s = opt_string(L, ci, "headers"))) cc->allow_headers = dup_or_die(L, s);
  if ((s = opt_string(L, ci, "expose"))) cc->expose_headers = dup_or_die(L, s);
  lua_getfield(L, ci, "credentials");
  cc->credentials = lua_toboolean(L, -1);
  lua_pop(L, 1);
  cc->max_age = (int)opt_number(L, ci, "max_age", 600);
  lua_pop(L, 1);
}

/* Raise RLIMIT_NOFILE's soft limit towards what max_connections needs. */
static void raise_nofile(int want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t need = (rlim_t)want + 64;
  if (rl.rlim_cur >= need) return;
  rl.rlim_cur = need < rl.rlim_max ? need : rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

static int listen_fail(lua_State *L, server *srv, const char *fmt, const char *a, const char *b) {
  srv_free(srv);
  luaL_pushfail(L);
  lua_pushfstring(L, fmt, a, b);
  return 2;
}

/* core.server.listen{host, port, backlog, routes = {{method, pattern}...},
**   static, max_header, max_body, header_timeout, body_timeout,
**   idle_timeout, send_timeout, max_connections, stream_buffer, log, cors,
**   tls = {cert, key}} -> server | nil, err
** The Lua module validates the options; this only checks their types. */
static int l_listen(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  server *srv = calloc(1, sizeof *srv);
  if (!srv) return luaL_error(L, "out of memory");
  srv->log_fd = -1;
  char err[256];
  const char *host = opt_string(L, 1, "host");
  if (!host) host = "127.0.0.1";
  int port = (int)opt_number(L, 1, "port", 0);
  int backlog = (int)opt_number(L, 1, "backlog", 511);
  srv->limits.max_header = (size_t)opt_number(L, 1, "max_header", 16384);
  srv->limits.max_body = (size_t)opt_number(L, 1, "max_body", 1024 * 1024);
  srv->timeout_ms[L_HEADER] = (uint64_t)(opt_number(L, 1, "header_timeout", 10) * 1000);
  srv->timeout_ms[L_BODY] = (uint64_t)(opt_number(L, 1, "body_timeout", 30) * 1000);
  srv->timeout_ms[L_IDLE] = (uint64_t)(opt_number(L, 1, "idle_timeout", 75) * 1000);
  srv->timeout_ms[L_SEND] = (uint64_t)(opt_number(L, 1, "send_timeout", 60) * 1000);
  srv->timeout_ms[L_LINGER] = LINGER_MS;
  srv->max_connections = (int)opt_number(L, 1, "max_connections", 10000);
  srv->stream_buffer = (size_t)opt_number(L, 1, "stream_buffer", 65536);

  if (lua_getfield(L, 1, "routes") == LUA_TTABLE) {
    int n = (int)lua_rawlen(L, -1);
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      lua_rawgeti(L, -1, 1);
      lua_rawgeti(L, -2, 2);
      const char *m = lua_tostring(L, -2), *p = lua_tostring(L, -1);
      if (!m || !p) {
        srv_free(srv);
        return luaL_error(L, "bad argument #1 to 'listen' (routes[%d] must be {method, pattern})", i);
      }
      if (mg_routes_add(&srv->routes, m, p, i, err, sizeof err) != 0) {
        srv_free(srv);
        return luaL_error(L, "bad argument #1 to 'listen' (route %s)", err);
      }
      lua_pop(L, 3);
    }
  }
  lua_pop(L, 1);
  if (mg_routes_finish(&srv->routes, err, sizeof err) != 0) {
    srv_free(srv);
    return luaL_error(L, "bad argument #1 to 'listen' (%s)", err);
  }
  const char *dir = opt_string(L, 1, "static");
  if (dir) {
    if (mg_static_root_open(&srv->root, dir, err, sizeof err) != 0)
      return listen_fail(L, srv, "%s%s", err, "");
    srv->has_static = 1;
  }
  read_cors(L, 1, &srv->cors);
  int lt = lua_getfield(L, 1, "log");
  if (lt == LUA_TBOOLEAN && lua_toboolean(L, -1)) {
    srv->log_fd = 2;
  } else if (lt == LUA_TSTRING) {
    const char *path = lua_tostring(L, -1);
    srv->log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (srv->log_fd < 0) {
      lua_pop(L, 1);
      return listen_fail(L, srv, "access log '%s': %s", path, strerror(errno));
    }
    srv->log_owned = 1;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "tls") == LUA_TTABLE) {
    const char *cert = opt_string(L, lua_gettop(L), "cert");
    const char *key = opt_string(L, lua_gettop(L), "key");
    srv->tls = mg_tls_ctx_new(cert, key, err, sizeof err);
    if (!srv->tls) {
      lua_pop(L, 1);
      return listen_fail(L, srv, "%s%s", err, "");
    }
  }
  lua_pop(L, 1);

  /* a write to a connection the client has closed must not kill us */
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL)
    signal(SIGPIPE, SIG_IGN);
  raise_nofile(srv->max_connections);

  struct sockaddr_storage addr;
  memset(&addr, 0, sizeof addr);
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0)
    return listen_fail(L, srv, "listen: '%s' is not an IP address%s", host, "");
  uv_loop_t *loop = mg_loop();
  uv_tcp_init(loop, &srv->listener);
  srv->listener.data = srv;
  srv->listener_open = 1;
  srv->refs = 2;   /* the Lua object and the listener */
  int r = uv_tcp_bind(&srv->listener, (struct sockaddr *)&addr, 0);
  if (r == 0) r = uv_listen((uv_stream_t *)&srv->listener, backlog, on_connection);
  if (r != 0) {
    srv->state = S_CLOSED;
    srv->refs = 1;   /* the listener's close callback frees */
    stop_listening(srv);
    luaL_pushfail(L);
    lua_pushfstring(L, "listen on %s:%d: %s", host, port, uv_strerror(r));
    return 2;
  }
  struct sockaddr_storage bound;
  int blen = sizeof bound;
  uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &blen);
  srv->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                               : ((struct sockaddr_in *)&bound)->sin_port);
  uv_timer_init(loop, &srv->timer);
  srv->timer.data = srv;
  srv->timer_open = 1;
  srv->refs++;
  uv_unref((uv_handle_t *)&srv->timer);

  server_ud *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->srv = srv;
  luaL_setmetatable(L, SERVER_MT);
  return 1;
}

/* --------------------------------------------- Lua: a request/response */

static sreq *check_req(lua_State *L) {
  return luaL_checkudata(L, 1, REQUEST_MT);
}

static int push_closed(lua_State *L) {
  luaL_pushfail(L);
  lua_pushliteral(L, "closed");
  return 2;
}

static int framing_header(const char *name, size_t n) {
  static const char *const names[] = {"content-length", "transfer-encoding",
                                      "connection", "keep-alive", "upgrade",
                                      "x-request-id"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i]) == n && strncasecmp(names[i], name, n) == 0) return 1;
  return 0;
}

static void add_header(lua_State *L, sbuf *b, const char *name, size_t nl, int vi, const char *fn) {
  size_t vl;
  const char *v = lua_tolstring(L, vi, &vl);
  if (!v || !mg_h1_valid_value(v, vl))
    luaL_error(L, "bad argument to '%s' (header '%s' has a value with CR, LF or NUL, or not a string)", fn, name);
  sb_add(b, name, nl);
  sb_add(b, ": ", 2);
  sb_add(b, v, vl);
  sb_add(b, "\r\n", 2);
}

/* Append the headers of the table at index t; returns whether it set
** Content-Type. Misuse raises. */
static int user_headers(lua_State *L, sbuf *b, int t, const char *fn) {
  if (t == 0 || lua_isnoneornil(L, t)) return 0;
  luaL_checktype(L, t, LUA_TTABLE);
  int has_type = 0;
  lua_pushnil(L);
  while (lua_next(L, t)) {
    size_t nl;
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_error(L, "bad argument to '%s' (header names must be strings)", fn);
    const char *name = lua_tolstring(L, -2, &nl);
    if (!mg_h1_valid_name(name, nl))
      luaL_error(L, "bad argument to '%s' (invalid header name '%s')", fn, name);
    if (framing_header(name, nl))
      luaL_error(L, "bad argument to '%s' (header '%s' is set by the server)", fn, name);
    if (nl == 12 && strncasecmp(name, "content-type", 12) == 0) has_type = 1;
    if (lua_type(L, -1) == LUA_TTABLE) {
      int n = (int)lua_rawlen(L, -1);
      for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, -1, i);
        add_header(L, b, name, nl, lua_gettop(L), fn);
        lua_pop(L, 1);
      }
    } else {
      add_header(L, b, name, nl, lua_gettop(L), fn);
    }
    lua_pop(L, 1);
  }
  return has_type;
}

static int check_status(lua_State *L, int i, const char *fn) {
  lua_Integer st = luaL_optinteger(L, i, 200);
  if (st < 100 || st > 999 || (st >= 100 && st < 200))
    luaL_error(L, "bad argument #%d to '%s' (status must be an integer from 200 to 999, got %d)",
               i - 1, fn, (int)st);
  return (int)st;
}

/* request:respond(status, headers, body, default_type) -> true | nil, "closed" */
static int l_respond(lua_State *L) {
  sreq *s = check_req(L);
  int status = check_status(L, 2, "respond");
  size_t bl = 0;
  const char *body = luaL_optlstring(L, 4, NULL, &bl);
  const char *dtype = luaL_optstring(L, 5, NULL);
  if (s->started || s->finished)
    return luaL_error(L, "respond: the response was already %s", s->finished ? "sent" : "started");
  conn *c = s->c;
  if (!c || s->closed) {
    s->finished = 1;
    detach(s);
    return push_closed(L);
  }
  sbuf *b = &scratch;
  c->status = status;
  head_begin(b, c, status);
  int has_type = user_headers(L, b, 3, "respond");
  int bodyless = mg_h1_bodyless(status);
  if (!bodyless) {
    if (!has_type && dtype && (bl > 0 || c->head_only)) {
      sb_add(b, "Content-Type: ", 14);
      sb_str(b, dtype);
      sb_add(b, "\r\n", 2);
    }
    sb_add(b, "Content-Length: ", 16);
    sb_u64(b, bl);
    sb_add(b, "\r\n", 2);
  }
  sb_add(b, "\r\n", 2);
  s->started = s->finished = 1;
  uv_buf_t bufs[2] = {uv_buf_init(b->p, (unsigned)b->len), uv_buf_init((char *)body, (unsigned)bl)};
  int nb = (bodyless || c->head_only || bl == 0) ? 1 : 2;
  c->body_bytes = nb == 2 ? bl : 0;
  if (conn_send(c, bufs, (unsigned)nb) != 0) return push_closed(L);
  after_response(c);
  lua_pushboolean(L, 1);
  return 1;
}

static int start_stream(lua_State *L, sreq *s, int status, int hi, const char *fn) {
  conn *c = s->c;
  sbuf *b = &scratch;
  c->status = status;
  c->bodyless = mg_h1_bodyless(status);
  c->chunked = !c->bodyless && c->q->minor >= 1;
  if (!c->bodyless && !c->chunked) c->keep_alive = 0;   /* HTTP/1.0: ends at close */
  head_begin(b, c, status);
  user_headers(L, b, hi, fn);
  if (c->chunked) sb_str(b, "Transfer-Encoding: chunked\r\n");
  sb_add(b, "\r\n", 2);
  s->started = 1;
  c->started = 1;
  uv_buf_t buf = uv_buf_init(b->p, (unsigned)b->len);
  return conn_send(c, &buf, 1);
}

/* request:start(status, headers) -> true | nil, "closed" */
static int l_start(lua_State *L) {
  sreq *s = check_req(L);
  int status = check_status(L, 2, "start");
  if (s->started || s->finished)
    return luaL_error(L, "start: the response was already %s", s->finished ? "sent" : "started");
  if (!s->c || s->closed) return push_closed(L);
  if (start_stream(L, s, status, 3, "start") != 0) return push_closed(L);
  lua_pushboolean(L, 1);
  return 1;
}

static void write_cancel(mg_waiter *w) {
  sreq *s = (sreq *)w;
  if (s->waiting) {
    s->waiting = 0;
    s->srv->writers_waiting--;
  }
}

static int write_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  sreq *s = (sreq *)ctx;
  write_cancel(&s->w);
  if (!s->c || s->closed) return push_closed(L);
  if (s->c->tcp.write_queue_size > s->srv->stream_buffer) {
    s->waiting = 1;
    s->srv->writers_waiting++;
    return mg_await(L, &s->w, write_cancel, write_k, ctx);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* request:write(chunk) -> true | nil, "closed"; waits while the connection
** has more than stream_buffer bytes queued */
static int l_write(lua_State *L) {
  sreq *s = check_req(L);
  size_t n;
  const char *data = luaL_checklstring(L, 2, &n);
  if (s->finished) return luaL_error(L, "write: the response was already finished");
  conn *c = s->c;
  if (!c || s->closed) return push_closed(L);
  if (!s->started && start_stream(L, s, 200, 0, "write") != 0) return push_closed(L);
  if (n > 0 && !c->head_only && !c->bodyless) {
    char size[24];
    uv_buf_t bufs[3];
    unsigned nb = 0;
    if (c->chunked) bufs[nb++] = uv_buf_init(size, (unsigned)snprintf(size, sizeof size, "%zx\r\n", n));
    bufs[nb++] = uv_buf_init((char *)data, (unsigned)n);
    if (c->chunked) bufs[nb++] = uv_buf_init("\r\n", 2);
    c->body_bytes += n;
    if (conn_send(c, bufs, nb) != 0) return push_closed(L);
  }
  if (s->c && c->tcp.write_queue_size > s->srv->stream_buffer) {
    mg_check_yieldable(L, "res:write");
    s->waiting = 1;
    s->srv->writers_waiting++;
    return mg_await(L, &s->w, write_cancel, write_k, (lua_KContext)s);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* request:finish() -> true | nil, "closed" */
static int l_finish(lua_State *L) {
  sreq *s = check_req(L);
  if (s->finished) {
    lua_pushboolean(L, 1);
    return 1;
  }
  conn *c = s->c;
  if (!c || s->closed) {
    s->finished = 1;
    return push_closed(L);
  }
  if (!s->started) {
    lua_settop(L, 1);
    lua_pushinteger(L, 200);
    return l_respond(L);
  }
  s->finished = 1;
  if (c->chunked && !c->head_only) {
    uv_buf_t b = uv_buf_init("0\r\n\r\n", 5);
    if (conn_send(c, &b, 1) != 0) return push_closed(L);
  }
  after_response(c);
  lua_pushboolean(L, 1);
  return 1;
}

/* Cut an unfinished response: the connection closes, so the client sees an
** incomplete answer rather than a complete wrong one. */
static int l_abort(lua_State *L) {
  sreq *s = luaL_checkudata(L, 1, REQUEST_MT);
  if (s->c && !s->finished) {
    s->finished = 1;
    conn_close(s->c);
  }
  return 0;
}

static int l_req_gc(lua_State *L) {
  sreq *s = luaL_checkudata(L, 1, REQUEST_MT);
  if (s->c) {
    if (!s->finished) conn_close(s->c);
    else detach(s);
  }
  if (s->q) mg_h1_request_free(s->q);
  free(s->path);
  s->q = NULL;
  s->path = NULL;
  if (s->srv) {
    server *srv = s->srv;
    s->srv = NULL;
    srv_unref(srv);
  }
  return 0;
}

static int l_started(lua_State *L) {
  lua_pushboolean(L, check_req(L)->started);
  return 1;
}

static int l_closed(lua_State *L) {
  sreq *s = check_req(L);
  lua_pushboolean(L, s->closed || (!s->c && !s->finished));
  return 1;
}

/* headers as a table: lower-case names, repeated ones joined with ", " */
static int l_headers(lua_State *L) {
  sreq *s = check_req(L);
  lua_createtable(L, 0, s->q ? s->q->nheaders : 0);
  if (!s->q) return 1;
  size_t pos = 0, vl;
  const char *name, *value;
  while (mg_h1_next_header(s->q, &pos, &name, &value, &vl)) {
    lua_pushstring(L, name);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) == LUA_TSTRING) {
      lua_pushstring(L, strcmp(name, "cookie") == 0 ? "; " : ", ");
      lua_pushlstring(L, value, vl);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, value, vl);
    }
    lua_rawset(L, -3);
  }
  return 1;
}

static int l_body(lua_State *L) {
  sreq *s = check_req(L);
  if (s->q && s->q->body) lua_pushlstring(L, s->q->body, s->q->body_len);
  else lua_pushliteral(L, "");
  return 1;
}

static int l_query(lua_State *L) {
  sreq *s = check_req(L);
  if (s->query) lua_pushlstring(L, s->query, s->query_len);
  else lua_pushnil(L);
  return 1;
}

static int l_target(lua_State *L) {
  sreq *s = check_req(L);
  if (s->q) lua_pushlstring(L, s->q->head, s->q->target_len);
  else lua_pushnil(L);
  return 1;
}

static int l_remote(lua_State *L) {
  sreq *s = check_req(L);
  if (s->c && s->c->peer[0]) lua_pushstring(L, s->c->peer);
  else lua_pushnil(L);
  return 1;
}

static int l_id(lua_State *L) {
  sreq *s = check_req(L);
  lua_pushstring(L, s->rid);
  return 1;
}

static int l_version(lua_State *L) {
  sreq *s = check_req(L);
  if (s->q) lua_pushfstring(L, "%d.%d", (int)s->q->major, (int)s->q->minor);
  else lua_pushnil(L);
  return 1;
}

static int l_req_tostring(lua_State *L) {
  sreq *s = check_req(L);
  if (s->q)
    lua_pushfstring(L, "server request %s %s", mg_h1_method(s->q), s->path ? s->path : "?");
  else
    lua_pushliteral(L, "server request");
  return 1;
}

static int l_server_tostring(lua_State *L) {
  server_ud *u = luaL_checkudata(L, 1, SERVER_MT);
  if (u->srv) lua_pushfstring(L, "server on port %d", u->srv->port);
  else lua_pushliteral(L, "server (closed)");
  return 1;
}

/* percent-decode (plus as space when asked) -> string | nil */
static int l_decode(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  int plus = lua_toboolean(L, 2);
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, n + 1);
  ssize_t d = mg_percent_decode(s, n, out, plus);
  if (d < 0) {
    lua_pushnil(L);
    return 1;
  }
  luaL_pushresultsize(&b, (size_t)d);
  return 1;
}

static const luaL_Reg server_methods[] = {
  {"accept", l_accept},
  {"port", l_port},
  {"stats", l_stats},
  {"drain", l_drain},
  {"wait_idle", l_wait_idle},
  {"close", l_server_close},
  {NULL, NULL}
};

static const luaL_Reg request_methods[] = {
  {"respond", l_respond},
  {"start", l_start},
  {"write", l_write},
  {"finish", l_finish},
  {"abort", l_abort},
  {"started", l_started},
  {"closed", l_closed},
  {"headers", l_headers},
  {"body", l_body},
  {"query", l_query},
  {"target", l_target},
  {"remote", l_remote},
  {"version", l_version},
  {"id", l_id},
  {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"listen", l_listen},
  {"decode", l_decode},
  {NULL, NULL}
};

int mg_open_server(lua_State *L) {
  mg_register_class(L, SERVER_MT, server_methods, l_server_close, l_server_close,
                    l_server_tostring);
  mg_register_class(L, REQUEST_MT, request_methods, l_req_gc, l_abort, l_req_tostring);
  if (request_mt_ref == LUA_NOREF) {
    luaL_getmetatable(L, REQUEST_MT);
    request_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  luaL_newlib(L, funcs);
  /* the request methods table, so the Lua side can add its own (sse) */
  luaL_getmetatable(L, REQUEST_MT);
  lua_getfield(L, -1, "__index");
  lua_setfield(L, -3, "request_methods");
  lua_pop(L, 1);
  return 1;
}
