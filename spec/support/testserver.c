/*
** testserver.c — local HTTP/1.1 (and HTTPS) server for specs and benchmarks.
**
** One libuv loop, keep-alive, pipelining-safe, cheap per request, so that a
** thousand concurrent clients measure the client and not the server.
**
**   build/testserver [PORT] [--host ADDR] [--tls CERT KEY]
**
** PORT 0 (the default) picks a free port. Once listening it prints one line,
** "testserver listening on http(s)://ADDR:PORT pid PID stall SPORT", and
** flushes stdout. SPORT is a port whose connections never complete.
** It exits on SIGTERM/SIGINT, and when its parent process goes away.
**
** Endpoints
**   /delay?ms=N[&bytes=B][&hold=K]
**                            reply "ok\n" (or B bytes) after N ms (and after
**                            K is released)
**   /status?code=N           reply with that status
**   /echo                    reply with the request as JSON
**   /bytes?n=N[&chunk=C][&drip_ms=D][&hold=K]
**                            N bytes, chunked in C-byte pieces, D ms apart,
**                            pausing after the first piece until K is released
**   /redirect?to=PATH[&code=302]
**   /reset                   reset the connection (TCP RST) without a reply
**   /truncate                announce 100 bytes, send 10, close
**   .../chat/completions     OpenAI-compatible chat completions: the next
**                            scripted reply for the path, else an echo of the
**                            last user message; plain or `stream: true` SSE
**
** Control (JSON bodies; see the reply object below)
**   POST /__script  reply | [reply, ...]   queue replies (times defaults to 1)
**   POST /__record  reply | [reply, ...]   same, times defaults to 0 (forever)
**   GET  /__requests                       requests received (not /__*), oldest first
**   POST /__release?key=K                  let held streams with key K go on
**   GET  /__stats[?key=K]                  connection and request counters,
**                                          held = responses waiting for a release
**                                          (of key K)
**   POST /__reset                          forget scripts, requests, releases
**
** A reply object: { path = "/v1/chat/completions", method, times, status,
**   headers = {...}, retry_after, delay_ms, body = "raw" | json = <any>,
**   content, chunks = {...}, tool_calls = [...], finish_reason, usage, model,
**   fault = "reset"|"close"|"truncate"|"malformed"|"drip"|"oversize"|"hang",
**   drip_ms, oversize_bytes, hold, hold_after, sse_eol }
** Replies for a path are used in order; a reply with times = 0 stays.
*/
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <uv.h>

#define MAX_HEAD (64 * 1024)
#define MAX_BODY (64 * 1024 * 1024)
#define MAX_LOGGED 10000

static uv_loop_t *loop;

/* ------------------------------------------------------------------ */
/* growable byte buffer                                                */

typedef struct {
  char *p;
  size_t len, cap;
} sbuf;

static void sb_reserve(sbuf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  b->p = realloc(b->p, cap);
  if (!b->p) { perror("testserver: realloc"); exit(1); }
  b->cap = cap;
}

static void sb_add(sbuf *b, const void *s, size_t n) {
  sb_reserve(b, n);
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  sb_reserve(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

static void sb_free(sbuf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

static char *xstrndup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) { perror("testserver: malloc"); exit(1); }
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

/* ------------------------------------------------------------------ */
/* JSON: a small DOM parser and writer for the control plane          */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
  jtype t;
  int b;
  double num;
  char *s;              /* J_STR (NUL-terminated; len in slen) */
  size_t slen;
  struct jval **items;  /* J_ARR, J_OBJ values */
  char **keys;          /* J_OBJ keys */
  size_t n;
} jval;

typedef struct {
  const char *s, *end;
  const char *err;
  int depth;
} jparser;

static jval *jnew(jtype t) {
  jval *v = calloc(1, sizeof *v);
  if (!v) { perror("testserver: calloc"); exit(1); }
  v->t = t;
  return v;
}

static void jfree(jval *v) {
  if (!v) return;
  for (size_t i = 0; i < v->n; i++) {
    jfree(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->s);
  free(v);
}

static void jws(jparser *p) {
  while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' ||
                           *p->s == '\r'))
    p->s++;
}

static void utf8_put(sbuf *b, unsigned cp) {
  char o[4];
  if (cp < 0x80) { o[0] = (char)cp; sb_add(b, o, 1); }
  else if (cp < 0x800) {
    o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F));
    sb_add(b, o, 2);
  } else if (cp < 0x10000) {
    o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    sb_add(b, o, 3);
  } else {
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    sb_add(b, o, 4);
  }
}

static int hex4(const char *s, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int c = s[i], d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return -1;
    v = v * 16 + (unsigned)d;
  }
  *out = v;
  return 0;
}

static int jstring(jparser *p, sbuf *out) {
  p->s++;   /* opening quote */
  while (p->s < p->end) {
    char c = *p->s++;
    if (c == '"') return 0;
    if ((unsigned char)c < 0x20) { p->err = "control character in string"; return -1; }
    if (c != '\\') { sb_add(out, &c, 1); continue; }
    if (p->s >= p->end) break;
    c = *p->s++;
    switch (c) {
      case '"': case '\\': case '/': sb_add(out, &c, 1); break;
      case 'b': sb_add(out, "\b", 1); break;
      case 'f': sb_add(out, "\f", 1); break;
      case 'n': sb_add(out, "\n", 1); break;
      case 'r': sb_add(out, "\r", 1); break;
      case 't': sb_add(out, "\t", 1); break;
      case 'u': {
        unsigned cp, lo;
        if (p->end - p->s < 4 || hex4(p->s, &cp)) { p->err = "bad \\u escape"; return -1; }
        p->s += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && p->end - p->s >= 6 && p->s[0] == '\\' &&
            p->s[1] == 'u' && !hex4(p->s + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          p->s += 6;
        }
        utf8_put(out, cp);
        break;
      }
      default: p->err = "bad escape"; return -1;
    }
  }
  p->err = "unterminated string";
  return -1;
}

static jval *jvalue(jparser *p);

static jval *jcontainer(jparser *p, int obj) {
  jval *v = jnew(obj ? J_OBJ : J_ARR);
  size_t cap = 0;
  p->s++;
  jws(p);
  if (p->s < p->end && *p->s == (obj ? '}' : ']')) { p->s++; return v; }
  for (;;) {
    char *key = NULL;
    if (obj) {
      jws(p);
      if (p->s >= p->end || *p->s != '"') { p->err = "expected object key"; goto fail; }
      sbuf k = { 0 };
      if (jstring(p, &k)) { sb_free(&k); goto fail; }
      key = k.p ? k.p : xstrndup("", 0);
      jws(p);
      if (p->s >= p->end || *p->s != ':') { free(key); p->err = "expected ':'"; goto fail; }
      p->s++;
    }
    jval *item = jvalue(p);
    if (!item) { free(key); goto fail; }
    if (v->n == cap) {
      cap = cap ? cap * 2 : 4;
      v->items = realloc(v->items, cap * sizeof *v->items);
      if (obj) v->keys = realloc(v->keys, cap * sizeof *v->keys);
    }
    v->items[v->n] = item;
    if (obj) v->keys[v->n] = key;
    v->n++;
    jws(p);
    if (p->s < p->end && *p->s == ',') { p->s++; continue; }
    if (p->s < p->end && *p->s == (obj ? '}' : ']')) { p->s++; return v; }
    p->err = obj ? "expected ',' or '}'" : "expected ',' or ']'";
    goto fail;
  }
fail:
  jfree(v);
  return NULL;
}

static jval *jvalue(jparser *p) {
  jws(p);
  if (p->s >= p->end) { p->err = "unexpected end of input"; return NULL; }
  if (++p->depth > 200) { p->err = "nesting too deep"; return NULL; }
  jval *v = NULL;
  char c = *p->s;
  if (c == '{' || c == '[') v = jcontainer(p, c == '{');
  else if (c == '"') {
    sbuf b = { 0 };
    if (jstring(p, &b)) sb_free(&b);
    else {
      v = jnew(J_STR);
      v->s = b.p ? b.p : xstrndup("", 0);
      v->slen = b.len;
    }
  } else if (p->end - p->s >= 4 && !memcmp(p->s, "true", 4)) {
    v = jnew(J_BOOL); v->b = 1; p->s += 4;
  } else if (p->end - p->s >= 5 && !memcmp(p->s, "false", 5)) {
    v = jnew(J_BOOL); p->s += 5;
  } else if (p->end - p->s >= 4 && !memcmp(p->s, "null", 4)) {
    v = jnew(J_NULL); p->s += 4;
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    char tmp[64];
    size_t k = 0;
    while (p->s < p->end && k < sizeof tmp - 1 && strchr("+-0123456789.eE", *p->s))
      tmp[k++] = *p->s++;
    tmp[k] = 0;
    char *e;
    double d = strtod(tmp, &e);
    if (*e) p->err = "bad number";
    else { v = jnew(J_NUM); v->num = d; }
  } else p->err = "unexpected character";
  p->depth--;
  return v;
}

/* Parse a whole document; on failure returns NULL and sets *err. */
static jval *json_parse(const char *s, size_t n, const char **err) {
  jparser p = { s, s + n, NULL, 0 };
  jval *v = jvalue(&p);
  if (v) {
    jws(&p);
    if (p.s != p.end) { jfree(v); v = NULL; p.err = "trailing characters"; }
  }
  if (!v && err) *err = p.err ? p.err : "invalid JSON";
  return v;
}

static jval *jget(const jval *o, const char *key) {
  if (!o || o->t != J_OBJ) return NULL;
  for (size_t i = 0; i < o->n; i++)
    if (!strcmp(o->keys[i], key)) return o->items[i];
  return NULL;
}

static const char *jstr(const jval *o, const char *key) {
  jval *v = jget(o, key);
  return v && v->t == J_STR ? v->s : NULL;
}

static double jnum(const jval *o, const char *key, double dflt) {
  jval *v = jget(o, key);
  return v && v->t == J_NUM ? v->num : dflt;
}

static void jw_str(sbuf *b, const char *s, size_t n) {
  sb_reserve(b, n + 2);
  sb_add(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
      case '"': sb_add(b, "\\\"", 2); break;
      case '\\': sb_add(b, "\\\\", 2); break;
      case '\n': sb_add(b, "\\n", 2); break;
      case '\r': sb_add(b, "\\r", 2); break;
      case '\t': sb_add(b, "\\t", 2); break;
      default:
        if (c < 0x20) sb_printf(b, "\\u%04x", c);
        else sb_add(b, &s[i], 1);
    }
  }
  sb_add(b, "\"", 1);
}

static void jw_cstr(sbuf *b, const char *s) { jw_str(b, s, strlen(s)); }

static void jw_value(sbuf *b, const jval *v) {
  switch (v->t) {
    case J_NULL: sb_puts(b, "null"); break;
    case J_BOOL: sb_puts(b, v->b ? "true" : "false"); break;
    case J_NUM:
      if (v->num == (double)(long long)v->num && v->num < 1e15 && v->num > -1e15)
        sb_printf(b, "%lld", (long long)v->num);
      else sb_printf(b, "%.17g", v->num);
      break;
    case J_STR: jw_str(b, v->s, v->slen); break;
    case J_ARR:
    case J_OBJ:
      sb_puts(b, v->t == J_ARR ? "[" : "{");
      for (size_t i = 0; i < v->n; i++) {
        if (i) sb_puts(b, ",");
        if (v->t == J_OBJ) { jw_cstr(b, v->keys[i]); sb_puts(b, ":"); }
        jw_value(b, v->items[i]);
      }
      sb_puts(b, v->t == J_ARR ? "]" : "}");
      break;
  }
}

/* ------------------------------------------------------------------ */
/* server state                                                        */

typedef struct script {
  char *method;   /* NULL: any */
  char *path;
  long times;     /* remaining uses; 0 = forever */
  jval *reply;
  struct script *next;
} script;

typedef struct conn conn;

typedef struct {
  long connections_total, connections_open, requests_total;
} stats_t;

static script *scripts;
static sbuf req_log;        /* JSON objects separated by ',' */
static long req_logged;
static stats_t stats;
static char **released;     /* released hold keys */
static size_t nreleased;
static conn *holders;       /* connections waiting on a hold key */
static SSL_CTX *tls_ctx;

/* ------------------------------------------------------------------ */
/* responses as a list of steps                                        */

enum { ST_DATA, ST_CLOSE, ST_RESET, ST_HANG };

typedef struct step {
  int kind;
  unsigned delay_ms;   /* wait before this step */
  char *hold;          /* wait for this key before this step */
  char *data;
  size_t len;
  struct step *next;
} step;

typedef struct {
  step *head, *tail;
  int chunked;
} resp;

static step *resp_step(resp *r, int kind) {
  step *s = calloc(1, sizeof *s);
  if (!s) { perror("testserver: calloc"); exit(1); }
  s->kind = kind;
  if (r->tail) r->tail->next = s;
  else r->head = s;
  r->tail = s;
  return s;
}

static void resp_data(resp *r, const char *d, size_t n, unsigned delay_ms,
                      const char *hold) {
  step *s = resp_step(r, ST_DATA);
  s->data = xstrndup(d, n);
  s->len = n;
  s->delay_ms = delay_ms;
  s->hold = hold ? xstrndup(hold, strlen(hold)) : NULL;
}

static const char *reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 307: return "Temporary Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

/* Head of a response. content_length < 0: chunked. extra: more header lines,
** each ending in CRLF. */
static void resp_head(resp *r, int status, const char *ctype,
                      long long content_length, const char *extra,
                      int keep_alive, unsigned delay_ms) {
  sbuf h = { 0 };
  sb_printf(&h, "HTTP/1.1 %d %s\r\n", status, reason(status));
  if (ctype) sb_printf(&h, "Content-Type: %s\r\n", ctype);
  if (content_length >= 0) sb_printf(&h, "Content-Length: %lld\r\n", content_length);
  else sb_puts(&h, "Transfer-Encoding: chunked\r\n");
  if (!keep_alive) sb_puts(&h, "Connection: close\r\n");
  if (extra) sb_puts(&h, extra);
  sb_puts(&h, "\r\n");
  r->chunked = content_length < 0;
  resp_data(r, h.p, h.len, delay_ms, NULL);
  sb_free(&h);
}

static void resp_chunk(resp *r, const char *d, size_t n, unsigned delay_ms,
                       const char *hold) {
  if (!r->chunked) { resp_data(r, d, n, delay_ms, hold); return; }
  if (n == 0) return;   /* a zero-length chunk would end the body */
  sbuf c = { 0 };
  sb_printf(&c, "%zx\r\n", n);
  sb_add(&c, d, n);
  sb_puts(&c, "\r\n");
  resp_data(r, c.p, c.len, delay_ms, hold);
  sb_free(&c);
}

static void resp_end_chunks(resp *r, unsigned delay_ms) {
  if (r->chunked) resp_data(r, "0\r\n\r\n", 5, delay_ms, NULL);
}

/* A complete response with a body in one piece. */
static void resp_simple(resp *r, int status, const char *ctype, const char *body,
                        size_t n, const char *extra, int keep_alive,
                        unsigned delay_ms) {
  resp_head(r, status, ctype, (long long)n, extra, keep_alive, delay_ms);
  if (n) resp_data(r, body, n, 0, NULL);
}

static void resp_json(resp *r, int status, const sbuf *body, int keep_alive) {
  resp_simple(r, status, "application/json", body->p ? body->p : "", body->len,
              NULL, keep_alive, 0);
}

static void resp_error(resp *r, int status, const char *msg, int keep_alive) {
  sbuf b = { 0 };
  sb_puts(&b, "{\"error\":{\"message\":");
  jw_cstr(&b, msg);
  sb_printf(&b, ",\"code\":%d}}", status);
  resp_json(r, status, &b, keep_alive);
  sb_free(&b);
}

static void free_steps(step *s) {
  while (s) {
    step *n = s->next;
    free(s->data);
    free(s->hold);
    free(s);
    s = n;
  }
}

/* ------------------------------------------------------------------ */
/* connections                                                         */

typedef struct {
  char *name, *value;
} header;

typedef struct {
  char *method, *target, *path, *query;
  header *headers;
  size_t nheaders;
  char *body;
  size_t body_len;
  int keep_alive;
} request;

struct conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  int closing, handles_open;
  sbuf in;              /* unparsed input (plaintext) */
  int busy;             /* a response is in progress */
  int keep_alive;
  step *steps;          /* remaining steps of the current response */
  int waiting_hold;
  conn *next_holder;
  SSL *ssl;
  BIO *rbio, *wbio;     /* TLS: network side of the SSL object */
  int sent_continue;
};

typedef struct {
  uv_write_t req;
  char *data;
} wreq;

static void conn_close(conn *c);
static void conn_run(conn *c);
static void conn_parse(conn *c);

static void on_write(uv_write_t *req, int status) {
  (void)status;
  wreq *w = (wreq *)req;
  free(w->data);
  free(w);
}

static void raw_write(conn *c, const char *d, size_t n) {
  if (c->closing || n == 0) return;
  wreq *w = malloc(sizeof *w);
  w->data = xstrndup(d, n);
  uv_buf_t b = uv_buf_init(w->data, (unsigned)n);
  if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write)) {
    free(w->data);
    free(w);
    conn_close(c);
  }
}

static void tls_flush(conn *c) {
  char buf[16384];
  int n;
  while ((n = BIO_read(c->wbio, buf, sizeof buf)) > 0) raw_write(c, buf, (size_t)n);
}

static void conn_write(conn *c, const char *d, size_t n) {
  if (!c->ssl) { raw_write(c, d, n); return; }
  while (n > 0 && !c->closing) {
    int k = SSL_write(c->ssl, d, n > INT_MAX ? INT_MAX : (int)n);
    if (k <= 0) { conn_close(c); return; }
    tls_flush(c);
    d += k;
    n -= (size_t)k;
  }
}

static void on_handle_closed(uv_handle_t *h) {
  conn *c = (conn *)h->data;
  if (--c->handles_open > 0) return;
  free_steps(c->steps);
  sb_free(&c->in);
  if (c->ssl) SSL_free(c->ssl);   /* frees the BIOs too */
  free(c);
}

static void unhold(conn *c) {
  if (!c->waiting_hold) return;
  for (conn **pp = &holders; *pp; pp = &(*pp)->next_holder)
    if (*pp == c) { *pp = c->next_holder; break; }
  c->waiting_hold = 0;
}

static void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = 1;
  unhold(c);
  stats.connections_open--;
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

static void conn_reset(conn *c) {
  if (c->closing) return;
  c->closing = 1;
  unhold(c);
  stats.connections_open--;
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  if (uv_tcp_close_reset(&c->tcp, on_handle_closed))
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

static int is_released(const char *key) {
  for (size_t i = 0; i < nreleased; i++)
    if (!strcmp(released[i], key)) return 1;
  return 0;
}

static void on_step_timer(uv_timer_t *t) {
  conn *c = (conn *)t->data;
  c->steps->delay_ms = 0;
  conn_run(c);
}

/* Execute the current response's steps until one has to wait. */
static void conn_run(conn *c) {
  while (c->steps && !c->closing) {
    step *s = c->steps;
    if (s->delay_ms) {
      uv_timer_start(&c->timer, on_step_timer, s->delay_ms, 0);
      return;
    }
    if (s->hold && !is_released(s->hold)) {
      if (!c->waiting_hold) {
        c->waiting_hold = 1;
        c->next_holder = holders;
        holders = c;
      }
      return;
    }
    c->steps = s->next;
    s->next = NULL;
    switch (s->kind) {
      case ST_DATA: conn_write(c, s->data, s->len); break;
      case ST_CLOSE: conn_close(c); break;
      case ST_RESET: conn_reset(c); break;
      case ST_HANG: free_steps(c->steps); c->steps = NULL; free_steps(s); return;
    }
    free_steps(s);
    if (!c->steps && !c->closing) {
      c->busy = 0;
      if (!c->keep_alive) conn_close(c);
      else conn_parse(c);
      return;
    }
  }
}

static void release_key(const char *key) {
  if (!is_released(key)) {
    released = realloc(released, (nreleased + 1) * sizeof *released);
    released[nreleased++] = xstrndup(key, strlen(key));
  }
  conn *list = holders;
  holders = NULL;
  while (list) {
    conn *c = list;
    list = c->next_holder;
    c->waiting_hold = 0;
    if (c->steps && c->steps->hold && !strcmp(c->steps->hold, key)) conn_run(c);
    else { c->waiting_hold = 1; c->next_holder = holders; holders = c; }
  }
}

/* ------------------------------------------------------------------ */
/* request helpers                                                     */

static const char *req_header(const request *rq, const char *name) {
  for (size_t i = 0; i < rq->nheaders; i++)
    if (!strcasecmp(rq->headers[i].name, name)) return rq->headers[i].value;
  return NULL;
}

static int unhex(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The decoded value of query parameter `key`, malloc'd, or NULL. */
static char *query_param(const request *rq, const char *key) {
  const char *q = rq->query;
  size_t klen = strlen(key);
  while (q && *q) {
    const char *amp = strchr(q, '&');
    size_t plen = amp ? (size_t)(amp - q) : strlen(q);
    if (plen >= klen && !strncmp(q, key, klen) && (plen == klen || q[klen] == '=')) {
      const char *v = plen == klen ? q + plen : q + klen + 1;
      size_t vlen = (size_t)(q + plen - v);
      sbuf out = { 0 };
      sb_reserve(&out, vlen);
      for (size_t i = 0; i < vlen; i++) {
        if (v[i] == '%' && i + 2 < vlen &&
            unhex(v[i + 1]) >= 0 && unhex(v[i + 2]) >= 0) {
          char ch = (char)(unhex(v[i + 1]) * 16 + unhex(v[i + 2]));
          sb_add(&out, &ch, 1);
          i += 2;
        } else if (v[i] == '+') sb_add(&out, " ", 1);
        else sb_add(&out, &v[i], 1);
      }
      if (!out.p) out.p = xstrndup("", 0);
      return out.p;
    }
    q = amp ? amp + 1 : NULL;
  }
  return NULL;
}

static long query_long(const request *rq, const char *key, long dflt) {
  char *v = query_param(rq, key);
  if (!v) return dflt;
  char *e;
  long n = strtol(v, &e, 10);
  if (*v == 0 || *e) n = dflt;
  free(v);
  return n;
}

static void write_request_json(sbuf *b, const request *rq) {
  sb_puts(b, "{\"method\":");
  jw_cstr(b, rq->method);
  sb_puts(b, ",\"path\":");
  jw_cstr(b, rq->path);
  sb_puts(b, ",\"query\":");
  jw_cstr(b, rq->query ? rq->query : "");
  sb_puts(b, ",\"headers\":{");
  for (size_t i = 0; i < rq->nheaders; i++) {
    if (i) sb_puts(b, ",");
    char *lower = xstrndup(rq->headers[i].name, strlen(rq->headers[i].name));
    for (char *p = lower; *p; p++) *p = (char)tolower((unsigned char)*p);
    jw_cstr(b, lower);
    free(lower);
    sb_puts(b, ":");
    jw_cstr(b, rq->headers[i].value);
  }
  sb_puts(b, "},\"body\":");
  jw_str(b, rq->body ? rq->body : "", rq->body_len);
  sb_puts(b, "}");
}

static void log_request(const request *rq) {
  if (req_logged >= MAX_LOGGED) return;
  if (req_logged) sb_puts(&req_log, ",");
  write_request_json(&req_log, rq);
  req_logged++;
}

/* ------------------------------------------------------------------ */
/* scripts                                                             */

static void script_free(script *s) {
  free(s->method);
  free(s->path);
  jfree(s->reply);
  free(s);
}

static void scripts_clear(void) {
  while (scripts) {
    script *n = scripts->next;
    script_free(scripts);
    scripts = n;
  }
}

/* Takes ownership of reply. Returns NULL or an error message. */
static const char *script_add(jval *reply, long dflt_times) {
  if (reply->t != J_OBJ) { jfree(reply); return "a reply must be an object"; }
  const char *path = jstr(reply, "path");
  const char *method = jstr(reply, "method");
  script *s = calloc(1, sizeof *s);
  s->path = xstrndup(path ? path : "/v1/chat/completions",
                     strlen(path ? path : "/v1/chat/completions"));
  s->method = method ? xstrndup(method, strlen(method)) : NULL;
  s->times = (long)jnum(reply, "times", (double)dflt_times);
  if (s->times < 0) s->times = 0;
  s->reply = reply;
  script **pp = &scripts;
  while (*pp) pp = &(*pp)->next;
  *pp = s;
  return NULL;
}

/* The next scripted reply for this request, detached when used up; the
** caller frees it when *owned is set. */
static jval *script_take(const request *rq, int *owned) {
  *owned = 0;
  for (script **pp = &scripts; *pp; pp = &(*pp)->next) {
    script *s = *pp;
    if (strcmp(s->path, rq->path)) continue;
    if (s->method && strcasecmp(s->method, rq->method)) continue;
    if (s->times == 0) return s->reply;
    if (--s->times > 0) return s->reply;
    *pp = s->next;
    jval *r = s->reply;
    s->reply = NULL;
    script_free(s);
    *owned = 1;
    return r;
  }
  return NULL;
}

/* ------------------------------------------------------------------ */
/* handlers                                                            */

static unsigned reply_delay(const jval *r) {
  double d = jnum(r, "delay_ms", 0);
  return d > 0 ? (unsigned)d : 0;
}

static void extra_headers(sbuf *h, const jval *r) {
  jval *hs = jget(r, "headers");
  if (hs && hs->t == J_OBJ)
    for (size_t i = 0; i < hs->n; i++)
      if (hs->items[i]->t == J_STR)
        sb_printf(h, "%s: %s\r\n", hs->keys[i], hs->items[i]->s);
  jval *ra = jget(r, "retry_after");
  if (ra && ra->t == J_STR) sb_printf(h, "Retry-After: %s\r\n", ra->s);
  else if (ra && ra->t == J_NUM) sb_printf(h, "Retry-After: %g\r\n", ra->num);
}

/* Generic scripted reply: status, headers, body or json, with faults. */
static void serve_raw(resp *r, const jval *rep, int keep_alive) {
  int status = (int)jnum(rep, "status", 200);
  const char *fault = jstr(rep, "fault");
  unsigned delay = reply_delay(rep);
  sbuf body = { 0 }, extra = { 0 };
  const char *ctype = "application/json";
  jval *b = jget(rep, "body"), *j = jget(rep, "json");
  if (b && b->t == J_STR) { sb_add(&body, b->s, b->slen); ctype = "text/plain"; }
  else if (j) jw_value(&body, j);
  else if (status >= 400) {
    sb_puts(&body, "{\"error\":{\"message\":\"scripted failure\",\"code\":");
    sb_printf(&body, "%d}}", status);
  }
  jval *hs = jget(rep, "headers");
  jval *ct = jget(hs, "Content-Type");
  if (ct) ctype = NULL;   /* given explicitly in headers */
  extra_headers(&extra, rep);

  if (fault && !strcmp(fault, "reset")) {
    resp_step(r, ST_RESET)->delay_ms = delay;
  } else if (fault && !strcmp(fault, "close")) {
    resp_step(r, ST_CLOSE)->delay_ms = delay;
  } else if (fault && !strcmp(fault, "hang")) {
    resp_step(r, ST_HANG)->delay_ms = delay;
  } else if (fault && !strcmp(fault, "truncate")) {
    resp_head(r, status, ctype, (long long)body.len + 100, extra.p, 0, delay);
    resp_data(r, body.p ? body.p : "", body.len / 2, 0, NULL);
    resp_step(r, ST_CLOSE);
  } else if ((fault && !strcmp(fault, "drip")) || jget(rep, "hold")) {
    unsigned drip = (unsigned)jnum(rep, "drip_ms", fault ? 20 : 0);
    const char *hold = jstr(rep, "hold");
    resp_head(r, status, ctype, -1, extra.p, keep_alive, delay);
    size_t piece = body.len / 8 + 1, k = 0;
    for (size_t at = 0; at < body.len; at += piece, k++)
      resp_chunk(r, body.p + at, at + piece > body.len ? body.len - at : piece,
                 k ? drip : 0, k == 1 ? hold : NULL);
    resp_end_chunks(r, drip);
    if (k < 2 && hold) r->tail->hold = xstrndup(hold, strlen(hold));
  } else {
    resp_simple(r, status, ctype, body.p ? body.p : "", body.len, extra.p,
                keep_alive, delay);
  }
  sb_free(&body);
  sb_free(&extra);
}

typedef struct {
  const char *model;
  long seq;
  int include_usage;
  const char *eol;
} chat_ctx;

static long chat_seq;

static void chunk_prefix(sbuf *b, const chat_ctx *cx) {
  sb_printf(b, "{\"id\":\"chatcmpl-%ld\",\"object\":\"chat.completion.chunk\","
               "\"created\":1700000000,\"model\":", cx->seq);
  jw_cstr(b, cx->model);
}

static void sse_event(resp *r, const chat_ctx *cx, const sbuf *json,
                      unsigned delay, const char *hold) {
  sbuf e = { 0 };
  sb_puts(&e, "data: ");
  sb_add(&e, json->p, json->len);
  sb_puts(&e, cx->eol);
  sb_puts(&e, cx->eol);
  resp_chunk(r, e.p, e.len, delay, hold);
  sb_free(&e);
}

static void usage_json(sbuf *b, const jval *rep, long prompt, long completion) {
  jval *u = jget(rep, "usage");
  if (u) { jw_value(b, u); return; }
  sb_printf(b, "{\"prompt_tokens\":%ld,\"completion_tokens\":%ld,"
               "\"total_tokens\":%ld}", prompt, completion, prompt + completion);
}

/* The last user message's text, for the default echo reply. */
static const char *last_user_text(const jval *req) {
  jval *msgs = jget(req, "messages");
  if (!msgs || msgs->t != J_ARR) return NULL;
  for (size_t i = msgs->n; i-- > 0;) {
    const char *role = jstr(msgs->items[i], "role");
    const char *content = jstr(msgs->items[i], "content");
    if (role && !strcmp(role, "user") && content) return content;
  }
  return NULL;
}

static void serve_chat(resp *r, const request *rq, const jval *rep,
                       int keep_alive) {
  const char *perr = NULL;
  jval *req = json_parse(rq->body ? rq->body : "", rq->body_len, &perr);
  if (!req || req->t != J_OBJ) {
    sbuf m = { 0 };
    sb_printf(&m, "request body is not a JSON object: %s", perr ? perr : "not an object");
    resp_error(r, 400, m.p, keep_alive);
    sb_free(&m);
    jfree(req);
    return;
  }
  jval *st = jget(req, "stream");
  int stream = st && st->t == J_BOOL && st->b;
  jval *so = jget(req, "stream_options");
  jval *iu = jget(so, "include_usage");
  chat_ctx cx;
  cx.model = jstr(rep, "model") ? jstr(rep, "model")
           : jstr(req, "model") ? jstr(req, "model") : "test-model";
  cx.seq = ++chat_seq;
  cx.include_usage = iu && iu->t == J_BOOL && iu->b;
  cx.eol = jstr(rep, "sse_eol") ? jstr(rep, "sse_eol") : "\n";

  const char *fault = jstr(rep, "fault");
  unsigned delay = reply_delay(rep);
  int status = (int)jnum(rep, "status", 200);

  sbuf content = { 0 };
  int have_content = 1;
  jval *cv = jget(rep, "content");
  if (cv && cv->t == J_STR) sb_add(&content, cv->s, cv->slen);
  else if (cv && cv->t == J_NULL) have_content = 0;
  else if (!rep) {
    const char *u = last_user_text(req);
    sb_puts(&content, "echo: ");
    if (u) sb_puts(&content, u);
  }
  if (fault && !strcmp(fault, "oversize")) {
    long n = (long)jnum(rep, "oversize_bytes", 4 * 1024 * 1024);
    sb_reserve(&content, (size_t)n);
    memset(content.p + content.len, 'x', (size_t)n);
    content.len += (size_t)n;
    content.p[content.len] = 0;
  }
  jval *tools = jget(rep, "tool_calls");
  if (tools && (tools->t != J_ARR || tools->n == 0)) tools = NULL;
  const char *finish = jstr(rep, "finish_reason");
  if (!finish) finish = tools ? "tool_calls" : "stop";
  long prompt_tokens = (long)(rq->body_len / 4);

  sbuf extra = { 0 };
  extra_headers(&extra, rep);

  if (fault && !strcmp(fault, "reset")) {
    resp_step(r, ST_RESET)->delay_ms = delay;
  } else if (fault && !strcmp(fault, "close")) {
    resp_step(r, ST_CLOSE)->delay_ms = delay;
  } else if (fault && !strcmp(fault, "hang")) {
    resp_step(r, ST_HANG)->delay_ms = delay;
  } else if (status != 200) {
    serve_raw(r, rep, keep_alive);
  } else if (!stream) {
    sbuf b = { 0 };
    sb_printf(&b, "{\"id\":\"chatcmpl-%ld\",\"object\":\"chat.completion\","
                  "\"created\":1700000000,\"model\":", cx.seq);
    jw_cstr(&b, cx.model);
    sb_puts(&b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                "\"content\":");
    if (have_content) jw_str(&b, content.p ? content.p : "", content.len);
    else sb_puts(&b, "null");
    if (tools) { sb_puts(&b, ",\"tool_calls\":"); jw_value(&b, tools); }
    sb_puts(&b, "},\"finish_reason\":");
    jw_cstr(&b, finish);
    sb_puts(&b, "}],\"usage\":");
    usage_json(&b, rep, prompt_tokens, (long)(content.len / 4 + 1));
    sb_puts(&b, "}");
    if (fault && !strcmp(fault, "malformed")) {
      b.len = b.len / 2;   /* cut in the middle: not valid JSON */
      resp_simple(r, 200, "application/json", b.p, b.len, extra.p, keep_alive, delay);
    } else if (fault && !strcmp(fault, "truncate")) {
      resp_head(r, 200, "application/json", (long long)b.len, extra.p, 0, delay);
      resp_data(r, b.p, b.len / 2, 0, NULL);
      resp_step(r, ST_CLOSE);
    } else if (fault && !strcmp(fault, "drip")) {
      unsigned drip = (unsigned)jnum(rep, "drip_ms", 20);
      resp_head(r, 200, "application/json", (long long)b.len, extra.p, keep_alive, delay);
      size_t piece = b.len / 8 + 1;
      for (size_t at = 0; at < b.len; at += piece)
        resp_data(r, b.p + at, at + piece > b.len ? b.len - at : piece, drip, NULL);
    } else {
      resp_simple(r, 200, "application/json", b.p, b.len, extra.p, keep_alive, delay);
    }
    sb_free(&b);
  } else {
    int drip = fault && !strcmp(fault, "drip");
    unsigned gap = drip ? (unsigned)jnum(rep, "drip_ms", 20) : 0;
    const char *hold = jstr(rep, "hold");
    long hold_after = (long)jnum(rep, "hold_after", 1);
    int truncate = fault && !strcmp(fault, "truncate");
    int malformed = fault && !strcmp(fault, "malformed");
    long nchunks = 0;   /* content/tool chunks sent so far */
    sbuf e = { 0 };

    resp_head(r, 200, "text/event-stream", -1, extra.p, keep_alive, delay);
    chunk_prefix(&e, &cx);
    sb_puts(&e, ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                "\"content\":\"\"},\"finish_reason\":null}]}");
    sse_event(r, &cx, &e, 0, NULL);

    /* content pieces: scripted chunks, or the content split after spaces */
    jval *chunks = jget(rep, "chunks");
    size_t npieces = 0;
    const char **pieces = NULL;
    size_t *plens = NULL;
    if (chunks && chunks->t == J_ARR) {
      pieces = calloc(chunks->n + 1, sizeof *pieces);
      plens = calloc(chunks->n + 1, sizeof *plens);
      for (size_t i = 0; i < chunks->n; i++)
        if (chunks->items[i]->t == J_STR) {
          pieces[npieces] = chunks->items[i]->s;
          plens[npieces++] = chunks->items[i]->slen;
        }
    } else if (have_content && content.len) {
      pieces = calloc(content.len + 1, sizeof *pieces);
      plens = calloc(content.len + 1, sizeof *plens);
      size_t at = 0;
      while (at < content.len) {
        size_t end = at;
        while (end < content.len && content.p[end] != ' ') end++;
        if (end < content.len) end++;   /* keep the space with its word */
        if (content.len > 64 * 1024 && end - at < 4096)
          end = at + 4096 < content.len ? at + 4096 : content.len;
        pieces[npieces] = content.p + at;
        plens[npieces++] = end - at;
        at = end;
      }
    }
    for (size_t i = 0; i < npieces; i++) {
      e.len = 0;
      chunk_prefix(&e, &cx);
      sb_puts(&e, ",\"choices\":[{\"index\":0,\"delta\":{\"content\":");
      jw_str(&e, pieces[i], plens[i]);
      sb_puts(&e, "},\"finish_reason\":null}]}");
      const char *h = (hold && nchunks == hold_after) ? hold : NULL;
      if (h) hold = NULL;
      sse_event(r, &cx, &e, i ? gap : 0, h);
      nchunks++;
      if (truncate && nchunks == 1) break;
      if (malformed && nchunks == 1) {
        e.len = 0;
        sb_puts(&e, "{\"choices\":[{\"delta\":{\"content\":\"oops");
        sse_event(r, &cx, &e, gap, NULL);
      }
    }
    free(pieces);
    free(plens);
    if (tools && !truncate) {
      for (size_t i = 0; i < tools->n; i++) {
        jval *tc = tools->items[i];
        jval *fn = jget(tc, "function");
        const char *args = jstr(fn, "arguments");
        size_t alen = args ? strlen(args) : 0;
        const char *h = (hold && nchunks == hold_after) ? hold : NULL;
        if (h) hold = NULL;
        e.len = 0;
        chunk_prefix(&e, &cx);
        sb_printf(&e, ",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{"
                      "\"index\":%zu,\"id\":", i);
        jw_cstr(&e, jstr(tc, "id") ? jstr(tc, "id") : "call_0");
        sb_puts(&e, ",\"type\":\"function\",\"function\":{\"name\":");
        jw_cstr(&e, jstr(fn, "name") ? jstr(fn, "name") : "");
        sb_puts(&e, ",\"arguments\":\"\"}}]},\"finish_reason\":null}]}");
        sse_event(r, &cx, &e, gap, h);
        nchunks++;
        /* the arguments arrive in two fragments */
        size_t half = alen / 2;
        for (int part = 0; part < 2; part++) {
          const char *a = part ? args + half : args;
          size_t an = part ? alen - half : half;
          if (!an) continue;
          e.len = 0;
          chunk_prefix(&e, &cx);
          sb_printf(&e, ",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{"
                        "\"index\":%zu,\"function\":{\"arguments\":", i);
          jw_str(&e, a, an);
          sb_puts(&e, "}}]},\"finish_reason\":null}]}");
          sse_event(r, &cx, &e, gap, NULL);
        }
      }
    }
    if (truncate) {
      resp_step(r, ST_CLOSE);
    } else {
      e.len = 0;
      chunk_prefix(&e, &cx);
      sb_puts(&e, ",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":");
      jw_cstr(&e, finish);
      sb_puts(&e, "}]}");
      sse_event(r, &cx, &e, gap, hold);   /* a hold not placed yet */
      if (cx.include_usage || jget(rep, "usage")) {
        e.len = 0;
        chunk_prefix(&e, &cx);
        sb_puts(&e, ",\"choices\":[],\"usage\":");
        usage_json(&e, rep, prompt_tokens, nchunks);
        sb_puts(&e, "}");
        sse_event(r, &cx, &e, gap, NULL);
      }
      sbuf done = { 0 };
      sb_printf(&done, "data: [DONE]%s%s", cx.eol, cx.eol);
      resp_chunk(r, done.p, done.len, gap, NULL);
      sb_free(&done);
      resp_end_chunks(r, 0);
    }
    sb_free(&e);
  }
  sb_free(&content);
  sb_free(&extra);
  jfree(req);
}

static void serve_control(resp *r, const request *rq, int ka) {
  sbuf b = { 0 };
  if (!strcmp(rq->path, "/__script") || !strcmp(rq->path, "/__record")) {
    long dflt = !strcmp(rq->path, "/__script") ? 1 : 0;
    const char *err = NULL;
    jval *v = json_parse(rq->body ? rq->body : "", rq->body_len, &err);
    if (!v) {
      sb_printf(&b, "%s: invalid JSON: %s", rq->path, err);
      resp_error(r, 400, b.p, ka);
      sb_free(&b);
      return;
    }
    long added = 0;
    if (v->t == J_ARR) {
      for (size_t i = 0; i < v->n && !err; i++) {
        err = script_add(v->items[i], dflt);
        v->items[i] = NULL;
        if (!err) added++;
      }
      for (size_t i = 0; i < v->n; i++) jfree(v->items[i]);
      free(v->items);
      v->items = NULL;
      v->n = 0;
      jfree(v);
    } else {
      err = script_add(v, dflt);
      if (!err) added = 1;
    }
    if (err) { resp_error(r, 400, err, ka); return; }
    sb_printf(&b, "{\"added\":%ld}", added);
    resp_json(r, 200, &b, ka);
  } else if (!strcmp(rq->path, "/__requests")) {
    sb_puts(&b, "[");
    if (req_log.len) sb_add(&b, req_log.p, req_log.len);
    sb_puts(&b, "]");
    resp_json(r, 200, &b, ka);
  } else if (!strcmp(rq->path, "/__release")) {
    char *key = query_param(rq, "key");
    if (!key) { resp_error(r, 400, "/__release needs ?key=", ka); return; }
    release_key(key);
    free(key);
    sb_puts(&b, "{\"released\":true}");
    resp_json(r, 200, &b, ka);
  } else if (!strcmp(rq->path, "/__stats")) {
    long held = 0;
    char *key = query_param(rq, "key");
    for (conn *h = holders; h; h = h->next_holder)
      if (!key || (h->steps && h->steps->hold && !strcmp(h->steps->hold, key))) held++;
    free(key);
    sb_printf(&b, "{\"connections_total\":%ld,\"connections_open\":%ld,"
                  "\"requests_total\":%ld,\"held\":%ld}",
              stats.connections_total, stats.connections_open,
              stats.requests_total, held);
    resp_json(r, 200, &b, ka);
  } else if (!strcmp(rq->path, "/__reset")) {
    scripts_clear();
    sb_free(&req_log);
    req_logged = 0;
    for (size_t i = 0; i < nreleased; i++) free(released[i]);
    free(released);
    released = NULL;
    nreleased = 0;
    sb_puts(&b, "{\"reset\":true}");
    resp_json(r, 200, &b, ka);
  } else {
    resp_error(r, 404, "unknown control endpoint", ka);
  }
  sb_free(&b);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

static void handle(conn *c, request *rq) {
  resp r = { 0 };
  int ka = rq->keep_alive;
  stats.requests_total++;
  if (!strncmp(rq->path, "/__", 3)) {
    serve_control(&r, rq, ka);
  } else {
    log_request(rq);
    int owned = 0;
    jval *rep = script_take(rq, &owned);
    if (ends_with(rq->path, "/chat/completions")) {
      serve_chat(&r, rq, rep, ka);
    } else if (rep) {
      serve_raw(&r, rep, ka);
    } else if (!strcmp(rq->path, "/delay")) {
      long ms = query_long(rq, "ms", 0);
      long bytes = query_long(rq, "bytes", -1);
      char *hold = query_param(rq, "hold");
      if (ms < 0) ms = 0;
      if (bytes < 0) {
        resp_simple(&r, 200, "text/plain", "ok\n", 3, NULL, ka, (unsigned)ms);
        if (hold) r.head->hold = hold, hold = NULL;
      } else {
        char *body = malloc((size_t)bytes + 1);
        memset(body, 'x', (size_t)bytes);
        resp_simple(&r, 200, "application/octet-stream", body, (size_t)bytes,
                    NULL, ka, (unsigned)ms);
        if (hold) r.head->hold = hold, hold = NULL;
        free(body);
      }
      free(hold);
    } else if (!strcmp(rq->path, "/status")) {
      int code = (int)query_long(rq, "code", 200);
      if (code < 100 || code > 599) code = 400;
      char msg[64];
      snprintf(msg, sizeof msg, "status %d", code);
      resp_error(&r, code, msg, ka);
    } else if (!strcmp(rq->path, "/echo")) {
      sbuf b = { 0 };
      write_request_json(&b, rq);
      resp_json(&r, 200, &b, ka);
      sb_free(&b);
    } else if (!strcmp(rq->path, "/bytes")) {
      long n = query_long(rq, "n", 0), chunk = query_long(rq, "chunk", 0);
      long drip = query_long(rq, "drip_ms", 0);
      char *hold = query_param(rq, "hold");
      if (n < 0) n = 0;
      if (chunk <= 0 && (drip > 0 || hold)) chunk = n / 4 + 1;
      char *body = malloc((size_t)n + 1);
      for (long i = 0; i < n; i++) body[i] = (char)('a' + i % 26);
      if (chunk <= 0) {
        resp_simple(&r, 200, "application/octet-stream", body, (size_t)n, NULL, ka, 0);
      } else {
        resp_head(&r, 200, "application/octet-stream", -1, NULL, ka, 0);
        long k = 0;
        for (long at = 0; at < n; at += chunk, k++)
          resp_chunk(&r, body + at, (size_t)(at + chunk > n ? n - at : chunk),
                     k ? (unsigned)drip : 0, k == 1 ? hold : NULL);
        resp_end_chunks(&r, (unsigned)drip);
        if (k < 2 && hold) r.tail->hold = xstrndup(hold, strlen(hold));
      }
      free(body);
      free(hold);
    } else if (!strcmp(rq->path, "/redirect")) {
      char *to = query_param(rq, "to");
      int code = (int)query_long(rq, "code", 302);
      sbuf h = { 0 };
      sb_printf(&h, "Location: %s\r\n", to ? to : "/echo");
      resp_simple(&r, code, "text/plain", "", 0, h.p, ka, 0);
      sb_free(&h);
      free(to);
    } else if (!strcmp(rq->path, "/reset")) {
      resp_step(&r, ST_RESET);
    } else if (!strcmp(rq->path, "/truncate")) {
      resp_head(&r, 200, "text/plain", 100, NULL, 0, 0);
      resp_data(&r, "0123456789", 10, 0, NULL);
      resp_step(&r, ST_CLOSE);
    } else {
      sbuf m = { 0 };
      sb_printf(&m, "no route and no scripted reply for %s %s", rq->method, rq->path);
      resp_error(&r, 404, m.p, ka);
      sb_free(&m);
    }
    if (owned) jfree(rep);
    if (!strcasecmp(rq->method, "HEAD") && r.head && r.head->kind == ST_DATA) {
      free_steps(r.head->next);   /* a HEAD reply is the head alone */
      r.head->next = NULL;
      r.tail = r.head;
    }
  }
  c->keep_alive = ka;
  c->busy = 1;
  c->steps = r.head;
  conn_run(c);
}

/* ------------------------------------------------------------------ */
/* HTTP/1.1 request parsing                                            */

static void request_free(request *rq) {
  free(rq->method);
  free(rq->target);
  free(rq->path);
  free(rq->query);
  for (size_t i = 0; i < rq->nheaders; i++) {
    free(rq->headers[i].name);
    free(rq->headers[i].value);
  }
  free(rq->headers);
  free(rq->body);
}

static void bad_request(conn *c, const char *msg) {
  resp r = { 0 };
  resp_error(&r, 400, msg, 0);
  c->keep_alive = 0;
  c->busy = 1;
  c->steps = r.head;
  conn_run(c);
}

/* Decode a complete chunked body starting at s. Returns bytes consumed, 0 if
** incomplete, -1 if malformed. */
static long dechunk(const char *s, size_t n, sbuf *out) {
  size_t at = 0;
  for (;;) {
    const char *crlf = memmem(s + at, n - at, "\r\n", 2);
    if (!crlf) return 0;
    char *e;
    unsigned long size = strtoul(s + at, &e, 16);
    if (e == s + at) return -1;
    at = (size_t)(crlf - s) + 2;
    if (size == 0) {
      /* trailers until an empty line */
      for (;;) {
        const char *l = memmem(s + at, n - at, "\r\n", 2);
        if (!l) return 0;
        size_t len = (size_t)(l - (s + at));
        at += len + 2;
        if (len == 0) return (long)at;
      }
    }
    if (size > MAX_BODY || n - at < size + 2) return size > MAX_BODY ? -1 : 0;
    sb_add(out, s + at, size);
    at += size;
    if (memcmp(s + at, "\r\n", 2)) return -1;
    at += 2;
  }
}

/* Parse and serve requests from c->in while no response is in progress. */
static void conn_parse(conn *c) {
  while (!c->busy && !c->closing && c->in.len) {
    char *end = memmem(c->in.p, c->in.len, "\r\n\r\n", 4);
    if (!end) {
      if (c->in.len > MAX_HEAD) bad_request(c, "request head too large");
      return;
    }
    size_t head_len = (size_t)(end - c->in.p) + 4;
    request rq = { 0 };
    char *line = c->in.p, *eol = memmem(line, head_len, "\r\n", 2);
    char *sp1 = memchr(line, ' ', (size_t)(eol - line));
    char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    if (!sp1 || !sp2) { bad_request(c, "malformed request line"); return; }
    rq.method = xstrndup(line, (size_t)(sp1 - line));
    rq.target = xstrndup(sp1 + 1, (size_t)(sp2 - sp1 - 1));
    int http10 = !strncmp(sp2 + 1, "HTTP/1.0", 8);
    char *q = strchr(rq.target, '?');
    rq.path = xstrndup(rq.target, q ? (size_t)(q - rq.target) : strlen(rq.target));
    rq.query = q ? xstrndup(q + 1, strlen(q + 1)) : NULL;
    size_t cap = 0;
    for (char *h = eol + 2; h < end;) {
      char *he = memmem(h, (size_t)(end + 2 - h), "\r\n", 2);
      char *colon = memchr(h, ':', (size_t)(he - h));
      if (colon) {
        if (rq.nheaders == cap) {
          cap = cap ? cap * 2 : 16;
          rq.headers = realloc(rq.headers, cap * sizeof *rq.headers);
        }
        char *v = colon + 1;
        while (v < he && (*v == ' ' || *v == '\t')) v++;
        char *ve = he;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        rq.headers[rq.nheaders].name = xstrndup(h, (size_t)(colon - h));
        rq.headers[rq.nheaders].value = xstrndup(v, (size_t)(ve - v));
        rq.nheaders++;
      }
      h = he + 2;
    }
    const char *connh = req_header(&rq, "Connection");
    rq.keep_alive = http10 ? (connh && !strcasecmp(connh, "keep-alive"))
                           : !(connh && !strcasecmp(connh, "close"));
    const char *te = req_header(&rq, "Transfer-Encoding");
    const char *cl = req_header(&rq, "Content-Length");
    const char *expect = req_header(&rq, "Expect");
    size_t avail = c->in.len - head_len;
    size_t consumed;
    if (te && strcasestr(te, "chunked")) {
      sbuf body = { 0 };
      long k = dechunk(c->in.p + head_len, avail, &body);
      if (k < 0) { sb_free(&body); request_free(&rq); bad_request(c, "malformed chunked body"); return; }
      if (k == 0) {
        sb_free(&body);
        request_free(&rq);
        if (expect && !strcasecmp(expect, "100-continue") && !c->sent_continue) {
          c->sent_continue = 1;
          conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        }
        return;
      }
      rq.body = body.p;
      rq.body_len = body.len;
      consumed = head_len + (size_t)k;
    } else {
      unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
      if (len > MAX_BODY) { request_free(&rq); bad_request(c, "request body too large"); return; }
      if (avail < len) {
        request_free(&rq);
        if (expect && !strcasecmp(expect, "100-continue") && !c->sent_continue) {
          c->sent_continue = 1;
          conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
        }
        return;
      }
      rq.body = xstrndup(c->in.p + head_len, (size_t)len);
      rq.body_len = (size_t)len;
      consumed = head_len + (size_t)len;
    }
    c->sent_continue = 0;
    memmove(c->in.p, c->in.p + consumed, c->in.len - consumed);
    c->in.len -= consumed;
    handle(c, &rq);
    request_free(&rq);
  }
}

/* ------------------------------------------------------------------ */
/* libuv plumbing                                                      */

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  (void)h;
  (void)hint;
  static char slab[65536];
  *buf = uv_buf_init(slab, sizeof slab);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn *c = (conn *)s->data;
  if (nread < 0) { conn_close(c); return; }
  if (nread == 0 || c->closing) return;
  if (!c->ssl) {
    sb_add(&c->in, buf->base, (size_t)nread);
  } else {
    BIO_write(c->rbio, buf->base, (int)nread);
    if (!SSL_is_init_finished(c->ssl)) {
      int rc = SSL_do_handshake(c->ssl);
      tls_flush(c);
      if (rc <= 0) {
        int e = SSL_get_error(c->ssl, rc);
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) conn_close(c);
        return;
      }
    }
    char tmp[16384];
    int k;
    while ((k = SSL_read(c->ssl, tmp, sizeof tmp)) > 0) sb_add(&c->in, tmp, (size_t)k);
    int e = SSL_get_error(c->ssl, k);
    tls_flush(c);
    if (e == SSL_ERROR_ZERO_RETURN || (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)) {
      conn_close(c);
      return;
    }
  }
  if (c->in.len > MAX_HEAD + MAX_BODY + 64) { conn_close(c); return; }
  conn_parse(c);
}

static void on_connection(uv_stream_t *server, int status) {
  if (status < 0) return;
  conn *c = calloc(1, sizeof *c);
  uv_tcp_init(loop, &c->tcp);
  uv_timer_init(loop, &c->timer);
  c->tcp.data = c->timer.data = c;
  c->handles_open = 2;
  c->keep_alive = 1;
  if (uv_accept(server, (uv_stream_t *)&c->tcp)) {
    c->closing = 1;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    return;
  }
  stats.connections_total++;
  stats.connections_open++;
  uv_tcp_nodelay(&c->tcp, 1);
  if (tls_ctx) {
    c->ssl = SSL_new(tls_ctx);
    c->rbio = BIO_new(BIO_s_mem());
    c->wbio = BIO_new(BIO_s_mem());
    SSL_set_bio(c->ssl, c->rbio, c->wbio);
    SSL_set_accept_state(c->ssl);
  }
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static pid_t parent_pid;

static void on_watchdog(uv_timer_t *t) {
  if (getppid() != parent_pid) uv_stop(t->loop);
}

static void on_signal(uv_signal_t *s, int signum) {
  (void)signum;
  uv_stop(s->loop);
}

static void usage(void) {
  fprintf(stderr, "usage: testserver [PORT] [--host ADDR] [--tls CERT KEY]\n");
  exit(2);
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *cert = NULL, *key = NULL;
  int port = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--host") && i + 1 < argc) host = argv[++i];
    else if (!strcmp(argv[i], "--tls") && i + 2 < argc) { cert = argv[++i]; key = argv[++i]; }
    else if (isdigit((unsigned char)argv[i][0])) port = atoi(argv[i]);
    else usage();
  }
  signal(SIGPIPE, SIG_IGN);
  loop = uv_default_loop();

  if (cert) {
    tls_ctx = SSL_CTX_new(TLS_server_method());
    if (!tls_ctx || SSL_CTX_use_certificate_chain_file(tls_ctx, cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(tls_ctx, key, SSL_FILETYPE_PEM) != 1) {
      fprintf(stderr, "testserver: cannot load %s / %s: ", cert, key);
      ERR_print_errors_fp(stderr);
      return 1;
    }
  }

  uv_tcp_t server;
  struct sockaddr_storage addr;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr)) {
    fprintf(stderr, "testserver: bad address %s\n", host);
    return 1;
  }
  uv_tcp_init(loop, &server);
  int rc = uv_tcp_bind(&server, (struct sockaddr *)&addr, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&server, 4096, on_connection);
  if (rc) {
    fprintf(stderr, "testserver: cannot listen on %s:%d: %s\n", host, port, uv_strerror(rc));
    return 1;
  }
  struct sockaddr_storage bound;
  int len = sizeof bound;
  uv_tcp_getsockname(&server, (struct sockaddr *)&bound, &len);
  int bound_port = ntohs(bound.ss_family == AF_INET6
                             ? ((struct sockaddr_in6 *)&bound)->sin6_port
                             : ((struct sockaddr_in *)&bound)->sin_port);

  /* The stall port: listens with the smallest backlog and never accepts, so
  ** once its queue is full new connections hang in the TCP handshake (for
  ** connect-timeout specs). */
  int stall_port = 0;
  int stall = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t salen = sizeof sa;
  if (stall >= 0 && bind(stall, (struct sockaddr *)&sa, sizeof sa) == 0 &&
      listen(stall, 0) == 0 && getsockname(stall, (struct sockaddr *)&sa, &salen) == 0)
    stall_port = ntohs(sa.sin_port);

  uv_signal_t sigterm, sigint;
  uv_signal_init(loop, &sigterm);
  uv_signal_start(&sigterm, on_signal, SIGTERM);
  uv_signal_init(loop, &sigint);
  uv_signal_start(&sigint, on_signal, SIGINT);
  parent_pid = getppid();
  uv_timer_t watchdog;
  uv_timer_init(loop, &watchdog);
  uv_timer_start(&watchdog, on_watchdog, 500, 500);
  uv_unref((uv_handle_t *)&watchdog);

  printf("testserver listening on %s://%s:%d pid %d stall %d\n",
         tls_ctx ? "https" : "http", host, bound_port, (int)getpid(), stall_port);
  fflush(stdout);
  uv_run(loop, UV_RUN_DEFAULT);
  return 0;
}
