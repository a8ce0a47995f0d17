/*
** http.c — HTTP client: libcurl's multi_socket interface driven by the
** runtime's libuv loop.
**
** One process-wide multi handle owns every transfer, so connections (and
** DNS results) are cached and reused across requests. curl tells us which
** sockets to watch (one uv_poll_t each) and when to call it back (one
** uv_timer_t); completed transfers are collected after each
** curl_multi_socket_action() returns and their tasks are woken. Lua never
** runs inside a curl callback, and transfers are only removed from the multi
** handle outside curl callbacks: on completion, on cancel, or on close/GC.
**
** A transfer is a Lua userdata (`moongraph.http.transfer`):
**
**   core.http.request(opts) -> status, headers, body | nil, err
**       buffered: yields until the whole response is in
**   core.http.open(opts) -> transfer      starts it, never yields
**   transfer:next() -> chunk | nil (end) | nil, err
**       yields until body bytes arrive or the transfer ends
**   transfer:status() -> code|nil   transfer:headers() -> table|nil
**   transfer:close()                aborts (also __close and __gc)
**   core.http.stats() -> { active = transfers in flight, sockets = watched }
**
** opts: url, method, headers ({name = value} or {"Name: value", ...}), body,
** timeout, connect_timeout (seconds), max_body (bytes), follow_redirects
** (boolean or max count), ca_file. TLS peers are always verified.
**
** Error strings name what happened and the host:port, never the URL (query
** strings may carry API keys).
*/
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "curl_api.h"

#include "mg.h"

#define XFER_MT "moongraph.http.transfer"
#define DEFAULT_TIMEOUT_MS 60000L
#define DEFAULT_CONNECT_TIMEOUT_MS 10000L
#define DEFAULT_MAX_BODY (64LL * 1024 * 1024)
#define DEFAULT_MAX_REDIRECTS 5L
/* a streamed transfer pauses when this much is waiting for next() */
#define STREAM_HIGH_WATER (1024 * 1024)

typedef struct {
  char *p;
  size_t len, cap;
} hbuf;

static int hbuf_add(hbuf *b, const char *s, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  return 0;
}

static void hbuf_free(hbuf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

enum { X_IDLE, X_RUNNING, X_DONE };

typedef struct xfer {
  mg_waiter w;
  CURL *easy;
  struct curl_slist *req_headers;
  int state;
  int in_multi;
  int streaming;
  int paused;
  int too_big;
  int oom;
  int cancelled;
  int closed;
  int by_deadline;    /* the caller's deadline, not `timeout`, bounds it */
  CURLcode result;
  long long max_body;
  long long received;
  hbuf body;          /* whole body, or (streaming) bytes not yet taken */
  hbuf head;          /* header lines of the latest response */
  char host[300];     /* host:port for error messages */
  char errbuf[CURL_ERROR_SIZE];
} xfer;

typedef struct {
  uv_poll_t poll;
  curl_socket_t fd;
  int events;         /* what curl asked to hear about (0: removed) */
} sock_ctx;

static CURLM *multi;
static uv_timer_t curl_timer;
static int active_transfers;
static int watched_sockets;

static void check_done(void);

/* ---- curl <-> libuv glue ---- */

static void on_poll(uv_poll_t *p, int status, int events) {
  sock_ctx *sc = (sock_ctx *)p->data;
  int flags = 0;
  /* On a socket error let curl read: it then reports the real cause
  ** (e.g. connection reset) instead of a generic poll failure. */
  if (status < 0) flags = CURL_CSELECT_IN;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  int running;
  curl_multi_socket_action(multi, sc->fd, flags, &running);
  /* libuv stops the handle on an error event, which may belong to an
  ** earlier socket of this number that a child process still holds
  ** between fork and exec: a socket curl still wants is watched again */
  if (status < 0 && sc->events && !uv_is_active((uv_handle_t *)&sc->poll))
    uv_poll_start(&sc->poll, sc->events, on_poll);
  check_done();
}

/* Poll handles are kept per file descriptor and reused when curl opens a new
** socket with the same number: a connection going idle in curl's cache (or
** closing) only stops its handle. This saves a handle setup and teardown per
** request on keep-alive connections. */
static sock_ctx **socks;
static size_t nsocks;

static sock_ctx *sock_for(curl_socket_t s) {
  size_t fd = (size_t)s;
  if (fd >= nsocks) {
    size_t n = nsocks ? nsocks : 64;
    while (n <= fd) n *= 2;
    sock_ctx **t = realloc(socks, n * sizeof *t);
    if (!t) return NULL;
    memset(t + nsocks, 0, (n - nsocks) * sizeof *t);
    socks = t;
    nsocks = n;
  }
  if (!socks[fd]) {
    sock_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) return NULL;
    if (uv_poll_init_socket(mg_loop(), &sc->poll, s) != 0) {
      free(sc);
      return NULL;
    }
    sc->fd = s;
    sc->poll.data = sc;
    socks[fd] = sc;
  }
  return socks[fd];
}

static int on_socket(CURL *easy, curl_socket_t s, int what, void *userp,
                     void *socketp) {
  (void)easy;
  (void)userp;
  sock_ctx *sc = (sock_ctx *)socketp;
  if (what == CURL_POLL_REMOVE) {
    if (sc) {
      sc->events = 0;
      uv_poll_stop(&sc->poll);
      curl_multi_assign(multi, s, NULL);
      watched_sockets--;
    }
    return 0;
  }
  if (!sc) {
    sc = sock_for(s);
    if (!sc) return -1;
    curl_multi_assign(multi, s, sc);
    watched_sockets++;
  }
  int events = 0;
  if (what & CURL_POLL_IN) events |= UV_READABLE;
  if (what & CURL_POLL_OUT) events |= UV_WRITABLE;
  sc->events = events;
  uv_poll_start(&sc->poll, events, on_poll);
  return 0;
}

static void on_curl_timer(uv_timer_t *t) {
  (void)t;
  int running;
  curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done();
}

static int on_timer_request(CURLM *m, long timeout_ms, void *userp) {
  (void)m;
  (void)userp;
  if (timeout_ms < 0) uv_timer_stop(&curl_timer);
  else uv_timer_start(&curl_timer, on_curl_timer, (uint64_t)timeout_ms, 0);
  return 0;
}

static int ensure_multi(lua_State *L) {
  if (multi) return 1;
  const char *why = mg_curl_load();
  if (why) return luaL_error(L, "http: %s", why);
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return luaL_error(L, "http: curl_global_init failed");
  /* curl_multi_init opens a wake-up socket pair without FD_CLOEXEC; it takes
  ** the lowest free descriptors, which are marked afterwards */
  int lowest = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (lowest >= 0) close(lowest);
  int was_open[4];
  for (int i = 0; i < 4; i++) was_open[i] = lowest >= 0 && fcntl(lowest + i, F_GETFD) >= 0;
  multi = curl_multi_init();
  if (!multi) return luaL_error(L, "http: curl_multi_init failed");
  for (int i = 0; lowest >= 0 && i < 4; i++) {
    int flags = fcntl(lowest + i, F_GETFD);
    if (!was_open[i] && flags >= 0) fcntl(lowest + i, F_SETFD, flags | FD_CLOEXEC);
  }
  uv_timer_init(mg_loop(), &curl_timer);
  curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, on_timer_request);
  /* keep enough idle connections for wide fan-outs to be reused */
  curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 2048L);
  return 1;
}

/* Finished easy handles are reset and kept for the next requests (up to
** EASY_POOL_MAX), which spares their setup on busy keep-alive traffic. */
#define EASY_POOL_MAX 256
static CURL *easy_pool[EASY_POOL_MAX];
static int easy_pooled;

/* Sockets are not handed to the programs this process starts (io.popen,
** mg.process): a child holding a keep-alive connection would keep it open
** after we close it. */
static int set_cloexec(void *userp, curl_socket_t fd, curlsocktype purpose) {
  (void)userp; (void)purpose;
  int flags = fcntl(fd, F_GETFD);
  if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  return CURL_SOCKOPT_OK;
}

static CURL *easy_get(void) {
  if (easy_pooled > 0) return easy_pool[--easy_pooled];
  return curl_easy_init();
}

static void easy_put(CURL *e) {
  if (easy_pooled < EASY_POOL_MAX) {
    curl_easy_reset(e);
    easy_pool[easy_pooled++] = e;
  } else {
    curl_easy_cleanup(e);
  }
}

/* Take the transfer out of the multi handle and release its easy handle. Only
** called outside curl callbacks. */
static void xfer_detach(xfer *x) {
  if (x->easy) {
    if (x->in_multi) {
      curl_multi_remove_handle(multi, x->easy);
      active_transfers--;
    }
    easy_put(x->easy);
    x->easy = NULL;
  }
  x->in_multi = 0;
  if (x->req_headers) {
    curl_slist_free_all(x->req_headers);
    x->req_headers = NULL;
  }
}

static void check_done(void) {
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(multi, &left))) {
    if (m->msg != CURLMSG_DONE) continue;
    xfer *x = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
    x->result = m->data.result;
    x->state = X_DONE;
    curl_multi_remove_handle(multi, x->easy);
    x->in_multi = 0;
    active_transfers--;
    mg_wake(&x->w);
  }
}

/* ---- curl callbacks (no Lua here) ---- */

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
  xfer *x = (xfer *)ud;
  size_t len = size * n;
  if (x->received + (long long)len > x->max_body) {
    x->too_big = 1;
    return 0;   /* fails the transfer with CURLE_WRITE_ERROR */
  }
  if (x->streaming && x->body.len >= STREAM_HIGH_WATER) {
    x->paused = 1;
    return CURL_WRITEFUNC_PAUSE;   /* curl delivers it again on unpause */
  }
  if (hbuf_add(&x->body, p, len)) {
    x->oom = 1;
    return 0;
  }
  x->received += (long long)len;
  if (x->streaming) mg_wake(&x->w);
  return len;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud) {
  xfer *x = (xfer *)ud;
  size_t len = size * n;
  /* a status line starts a new response (redirect, 100 Continue) */
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) x->head.len = 0;
  if (hbuf_add(&x->head, p, len)) {
    x->oom = 1;
    return 0;
  }
  return len;
}

/* ---- options ---- */

static long opt_ms(lua_State *L, int t, const char *name, long dflt) {
  long ms = dflt;
  if (lua_getfield(L, t, name) != LUA_TNIL) {
    if (!lua_isnumber(L, -1))
      luaL_error(L, "bad argument #1 to 'http.request' (%s must be a number of seconds)", name);
    lua_Number s = lua_tonumber(L, -1);
    if (!(s > 0))
      luaL_error(L, "bad argument #1 to 'http.request' (%s must be > 0)", name);
    ms = s * 1000 < 1 ? 1 : (long)(s * 1000);
  }
  lua_pop(L, 1);
  return ms;
}

static int has_crlf(const char *s, size_t n) {
  return memchr(s, '\r', n) != NULL || memchr(s, '\n', n) != NULL;
}

/* Add request headers from the table at index t. Sets *have_expect and
** *have_ua when the caller gave those. */
static void add_headers(lua_State *L, xfer *x, int t, int *have_expect, int *have_ua) {
  lua_pushnil(L);
  while (lua_next(L, t)) {
    const char *line;
    size_t n;
    if (lua_type(L, -2) == LUA_TNUMBER) {
      if (lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "bad argument #1 to 'http.request' (headers[%d] must be a string \"Name: value\")",
                   (int)lua_tointeger(L, -2));
      line = lua_tolstring(L, -1, &n);
      if (!memchr(line, ':', n))
        luaL_error(L, "bad argument #1 to 'http.request' (header \"%s\" has no ':')", line);
      lua_pushvalue(L, -1);
    } else {
      if (lua_type(L, -2) != LUA_TSTRING)
        luaL_error(L, "bad argument #1 to 'http.request' (header names must be strings)");
      int vt = lua_type(L, -1);
      if (vt != LUA_TSTRING && vt != LUA_TNUMBER)
        luaL_error(L, "bad argument #1 to 'http.request' (header '%s' must be a string)",
                   lua_tostring(L, -2));
      lua_pushfstring(L, "%s: %s", lua_tostring(L, -2), lua_tostring(L, -1));
      line = lua_tolstring(L, -1, &n);
    }
    if (has_crlf(line, n))
      luaL_error(L, "bad argument #1 to 'http.request' (header contains CR or LF)");
    if (!strncasecmp(line, "expect:", 7)) *have_expect = 1;
    if (!strncasecmp(line, "user-agent:", 11)) *have_ua = 1;
    struct curl_slist *l = curl_slist_append(x->req_headers, line);
    if (!l) luaL_error(L, "http: out of memory");
    x->req_headers = l;
    lua_pop(L, 2);
  }
}

/* "host:port" of the transfer's (last) URL for messages, computed only when
** needed: never the whole URL, whose query may hold keys. */
static const char *xfer_host(xfer *x) {
  if (x->host[0]) return x->host;
  char *url = NULL;
  CURLU *u = curl_url();
  char *host = NULL, *port = NULL;
  snprintf(x->host, sizeof x->host, "%s", "?");
  if (x->easy) curl_easy_getinfo(x->easy, CURLINFO_EFFECTIVE_URL, &url);
  if (u && url && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
    if (curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK)
      snprintf(x->host, sizeof x->host, "%s:%s", host, port);
    else
      snprintf(x->host, sizeof x->host, "%s", host);
  }
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  return x->host;
}

/* Build and start a transfer from the options table at index 1; pushes the
** transfer userdata. */
static xfer *xfer_start(lua_State *L, int streaming) {
  luaL_checktype(L, 1, LUA_TTABLE);
  ensure_multi(L);

  lua_getfield(L, 1, "url");
  const char *url = lua_tostring(L, -1);
  if (!url || lua_type(L, -1) != LUA_TSTRING)
    luaL_error(L, "bad argument #1 to 'http.request' (url must be a string)");
  if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
    luaL_error(L, "bad argument #1 to 'http.request' (url must start with http:// or https://)");
  int url_idx = lua_gettop(L);

  xfer *x = (xfer *)lua_newuserdatauv(L, sizeof *x, 1);
  memset(x, 0, sizeof *x);
  x->state = X_IDLE;
  x->streaming = streaming;
  luaL_setmetatable(L, XFER_MT);
  int xi = lua_gettop(L);

  x->easy = easy_get();
  if (!x->easy) luaL_error(L, "http: curl_easy_init failed");
  CURL *e = x->easy;
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)x);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, set_cloexec);

  const char *method = NULL;
  if (lua_getfield(L, 1, "method") != LUA_TNIL) {
    method = lua_tostring(L, -1);
    if (!method || lua_type(L, -1) != LUA_TSTRING || !*method)
      luaL_error(L, "bad argument #1 to 'http.request' (method must be a string)");
    for (const char *c = method; *c; c++)
      if (!isupper((unsigned char)*c))
        luaL_error(L, "bad argument #1 to 'http.request' (method '%s' must be upper-case letters)", method);
  }
  size_t body_len = 0;
  const char *body = NULL;
  int bt = lua_getfield(L, 1, "body");
  if (bt != LUA_TNIL) {
    if (bt != LUA_TSTRING)
      luaL_error(L, "bad argument #1 to 'http.request' (body must be a string)");
    body = lua_tolstring(L, -1, &body_len);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, xi, 1);   /* keep the body alive for curl */
  }
  if (!method) method = body ? "POST" : "GET";
  if (!strcmp(method, "HEAD")) {
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else if (body) {
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    if (strcmp(method, "POST")) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  } else if (!strcmp(method, "POST")) {
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
  } else if (strcmp(method, "GET")) {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  }

  int have_expect = 0, have_ua = 0;
  int ht = lua_getfield(L, 1, "headers");
  if (ht == LUA_TTABLE) add_headers(L, x, lua_gettop(L), &have_expect, &have_ua);
  else if (ht != LUA_TNIL)
    luaL_error(L, "bad argument #1 to 'http.request' (headers must be a table)");
  /* no "Expect: 100-continue" round trip before sending a body */
  if (body && !have_expect) x->req_headers = curl_slist_append(x->req_headers, "Expect:");
  if (!have_ua) curl_easy_setopt(e, CURLOPT_USERAGENT, "moongraph/" MG_VERSION);
  if (x->req_headers) curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->req_headers);

  long timeout_ms = opt_ms(L, 1, "timeout", DEFAULT_TIMEOUT_MS);
  long connect_ms = opt_ms(L, 1, "connect_timeout", DEFAULT_CONNECT_TIMEOUT_MS);
  double budget = mg_call_budget(L);
  if (budget >= 0 && budget * 1000 < timeout_ms) {
    timeout_ms = budget * 1000 < 1 ? 1 : (long)(budget * 1000);
    x->by_deadline = 1;
  }
  if (connect_ms > timeout_ms) connect_ms = timeout_ms;
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);

  x->max_body = DEFAULT_MAX_BODY;
  if (lua_getfield(L, 1, "max_body") != LUA_TNIL) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0)
      luaL_error(L, "bad argument #1 to 'http.request' (max_body must be an integer >= 0)");
    x->max_body = (long long)lua_tointeger(L, -1);
  }
  curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->max_body);

  int rt = lua_getfield(L, 1, "follow_redirects");
  if (rt == LUA_TNIL || (rt == LUA_TBOOLEAN && lua_toboolean(L, -1))) {
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, DEFAULT_MAX_REDIRECTS);
  } else if (rt == LUA_TNUMBER && lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 0) {
    long n = (long)lua_tointeger(L, -1);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, n > 0 ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, n);
  } else if (rt != LUA_TBOOLEAN) {
    luaL_error(L, "bad argument #1 to 'http.request' (follow_redirects must be a boolean or a count)");
  }

  int ct = lua_getfield(L, 1, "ca_file");
  if (ct != LUA_TNIL) {
    if (ct != LUA_TSTRING)
      luaL_error(L, "bad argument #1 to 'http.request' (ca_file must be a path string)");
    curl_easy_setopt(e, CURLOPT_CAINFO, lua_tostring(L, -1));
  }

  lua_settop(L, xi);
  lua_remove(L, url_idx);   /* leave the transfer on top */

  CURLMcode mc = curl_multi_add_handle(multi, e);
  if (mc != CURLM_OK) luaL_error(L, "http: %s", curl_multi_strerror(mc));
  x->in_multi = 1;
  x->state = X_RUNNING;
  active_transfers++;
  return x;
}

/* ---- results ---- */

/* Push the error message for a failed transfer; push_error makes it an
** error value with its code. */
static const char *push_message(lua_State *L, xfer *x, int *retryable) {
  CURLcode rc = x->result;
  const char *eb = x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc);
  *retryable = 1;
  if (x->cancelled) { lua_pushliteral(L, "cancelled"); return NULL; }
  if (x->too_big || rc == CURLE_FILESIZE_EXCEEDED) {
    lua_pushfstring(L, "body exceeds max_body (%I bytes) from %s",
                    (lua_Integer)x->max_body, xfer_host(x));
    *retryable = 0;
    return "too_large";
  }
  if (x->oom) { lua_pushliteral(L, "out of memory reading the response"); return "unavailable"; }
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT: {
      const char *why = x->by_deadline ? ", at the caller's deadline" : "";
      if (strstr(eb, "onnect"))   /* still in the TCP/TLS handshake */
        lua_pushfstring(L, "timeout connecting to %s%s", xfer_host(x), why);
      else
        lua_pushfstring(L, "timeout (%s%s)", xfer_host(x), why);
      return "timeout";
    }
    case CURLE_COULDNT_CONNECT: {
      long oserr = 0;
      if (x->easy) curl_easy_getinfo(x->easy, CURLINFO_OS_ERRNO, &oserr);
      if (oserr == ECONNREFUSED || strstr(eb, "refused"))
        lua_pushfstring(L, "connection refused to %s", xfer_host(x));
      else
        lua_pushfstring(L, "could not connect to %s: %s", xfer_host(x), eb);
      return "unavailable";
    }
    case CURLE_COULDNT_RESOLVE_HOST:
      lua_pushfstring(L, "could not resolve host %s", xfer_host(x));
      *retryable = 0;            /* a name that does not resolve is rarely a blip */
      return "unavailable";
    case CURLE_PEER_FAILED_VERIFICATION:
      lua_pushfstring(L, "TLS certificate verification failed for %s: %s", xfer_host(x), eb);
      *retryable = 0;
      return "tls";
    case CURLE_SSL_CACERT_BADFILE:
      lua_pushfstring(L, "TLS: cannot use ca_file: %s", eb);
      *retryable = 0;
      return "tls";
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_USE_SSL_FAILED:
      lua_pushfstring(L, "TLS error with %s: %s", xfer_host(x), eb);
      *retryable = 0;
      return "tls";
    case CURLE_TOO_MANY_REDIRECTS:
      lua_pushfstring(L, "too many redirects from %s", xfer_host(x));
      *retryable = 0;
      return "protocol";
    case CURLE_GOT_NOTHING:
      lua_pushfstring(L, "empty reply from %s", xfer_host(x));
      return "unavailable";
    case CURLE_PARTIAL_FILE:
      lua_pushfstring(L, "truncated response from %s: %s", xfer_host(x), eb);
      return "unavailable";
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
      if (strstr(eb, "reset by peer"))
        lua_pushfstring(L, "connection reset by %s", xfer_host(x));
      else
        lua_pushfstring(L, "network error with %s: %s", xfer_host(x), eb);
      return "unavailable";
    default:
      lua_pushfstring(L, "http error with %s: %s", xfer_host(x), eb);
      *retryable = 0;
      return "failed";
  }
}

static void push_error(lua_State *L, xfer *x) {
  int retryable;
  const char *code = push_message(L, x, &retryable);
  if (!code) return;                /* "cancelled" stays a word */
  mg_error_new(L, code, retryable);
  lua_pushstring(L, xfer_host(x));
  mg_error_detail(L, "host");
}

static long xfer_status(xfer *x) {
  long status = 0;
  if (x->easy) curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
  return status;
}

/* Push the response headers as a table with lower-case names; repeated
** headers are joined with ", ". */
static void push_headers(lua_State *L, xfer *x) {
  lua_createtable(L, 0, 8);
  const char *p = x->head.p, *end = p + x->head.len;
  if (!p) return;
  char small[128];
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    const char *line_end = eol;
    if (line_end > p && line_end[-1] == '\r') line_end--;
    const char *colon = memchr(p, ':', (size_t)(line_end - p));
    if (colon && colon > p && memcmp(p, "HTTP/", 5) != 0) {
      const char *v = colon + 1;
      while (v < line_end && (*v == ' ' || *v == '\t')) v++;
      const char *ve = line_end;
      while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
      size_t nlen = (size_t)(colon - p);
      if (nlen <= sizeof small) {
        for (size_t i = 0; i < nlen; i++) small[i] = (char)tolower((unsigned char)p[i]);
        lua_pushlstring(L, small, nlen);
      } else {
        luaL_Buffer name;
        luaL_buffinit(L, &name);
        for (const char *c = p; c < colon; c++)
          luaL_addchar(&name, (char)tolower((unsigned char)*c));
        luaL_pushresult(&name);
      }
      lua_pushvalue(L, -1);
      if (lua_rawget(L, -3) == LUA_TSTRING) {
        lua_pushliteral(L, ", ");
        lua_pushlstring(L, v, (size_t)(ve - v));
        lua_concat(L, 3);
      } else {
        lua_pop(L, 1);
        lua_pushlstring(L, v, (size_t)(ve - v));
      }
      lua_rawset(L, -3);
    }
    p = eol + 1;
  }
}

/* Free what the transfer holds (GC, close, or after a buffered result). */
static void xfer_release(xfer *x) {
  xfer_detach(x);
  hbuf_free(&x->body);
  hbuf_free(&x->head);
}

static int request_done(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  xfer *x = (xfer *)ctx;
  if (x->result != CURLE_OK || x->too_big || x->oom) {
    luaL_pushfail(L);
    push_error(L, x);
    xfer_release(x);
    return 2;
  }
  lua_pushinteger(L, xfer_status(x));
  push_headers(L, x);
  lua_pushlstring(L, x->body.p ? x->body.p : "", x->body.len);
  xfer_release(x);
  return 3;
}

static void xfer_cancel(mg_waiter *w) {
  xfer *x = (xfer *)w;
  x->cancelled = 1;
  if (x->state == X_RUNNING) x->state = X_DONE;
  x->result = CURLE_ABORTED_BY_CALLBACK;
  xfer_detach(x);
}

static int l_request(lua_State *L) {
  mg_check_yieldable(L, "http.request");
  xfer *x = xfer_start(L, 0);
  return mg_await(L, &x->w, xfer_cancel, request_done, (lua_KContext)x);
}

static int l_open(lua_State *L) {
  xfer_start(L, 1);
  return 1;
}

static xfer *check_xfer(lua_State *L) {
  return (xfer *)luaL_checkudata(L, 1, XFER_MT);
}

/* Hand out buffered bytes, the end, or the error; 0 when nothing yet. */
static int next_result(lua_State *L, xfer *x) {
  if (x->body.len) {
    lua_pushlstring(L, x->body.p, x->body.len);
    x->body.len = 0;
    if (x->paused && x->easy && x->in_multi) {
      x->paused = 0;
      curl_easy_pause(x->easy, CURLPAUSE_CONT);   /* may deliver more now */
    }
    return 1;
  }
  if (x->state == X_DONE) {
    if (x->result != CURLE_OK || x->too_big || x->oom || x->cancelled) {
      luaL_pushfail(L);
      push_error(L, x);
      return 2;
    }
    lua_pushnil(L);
    return 1;
  }
  return 0;
}

static int next_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  xfer *x = (xfer *)ctx;
  int n = next_result(L, x);
  if (n) return n;
  return mg_await(L, &x->w, xfer_cancel, next_k, ctx);
}

static int l_next(lua_State *L) {
  xfer *x = check_xfer(L);
  if (!x->streaming)
    return luaL_error(L, "bad argument #1 to 'next' (not a streamed transfer)");
  if (x->closed)
    return luaL_error(L, "bad argument #1 to 'next' (transfer is closed)");
  int n = next_result(L, x);
  if (n) return n;
  mg_check_yieldable(L, "transfer:next");
  return mg_await(L, &x->w, xfer_cancel, next_k, (lua_KContext)x);
}

static int l_status(lua_State *L) {
  xfer *x = check_xfer(L);
  long s = xfer_status(x);
  if (s > 0) lua_pushinteger(L, s);
  else lua_pushnil(L);
  return 1;
}

static int l_headers(lua_State *L) {
  xfer *x = check_xfer(L);
  if (x->head.len == 0) { lua_pushnil(L); return 1; }
  push_headers(L, x);
  return 1;
}

/* Abort a running transfer; a task waiting in next() gets nil, "cancelled". */
static int l_close(lua_State *L) {
  xfer *x = check_xfer(L);
  if (x->state == X_RUNNING) {
    x->cancelled = 1;
    x->state = X_DONE;
  }
  x->closed = 1;
  xfer_release(x);
  mg_wake(&x->w);
  return 0;
}

/* Collected: no task can be waiting on it (a waiting task's stack holds it),
** except while the whole state closes, so never touch the waiter here. */
static int l_gc(lua_State *L) {
  xfer *x = (xfer *)lua_touserdata(L, 1);
  x->closed = 1;
  xfer_release(x);
  return 0;
}

static int l_tostring(lua_State *L) {
  xfer *x = check_xfer(L);
  lua_pushfstring(L, "http transfer to %s (%s)", xfer_host(x),
                  x->closed ? "closed" : x->state == X_RUNNING ? "running" : "done");
  return 1;
}

static int l_stats(lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, active_transfers);
  lua_setfield(L, -2, "active");
  lua_pushinteger(L, watched_sockets);
  lua_setfield(L, -2, "sockets");
  return 1;
}

static const luaL_Reg xfer_methods[] = {
  { "next", l_next },
  { "status", l_status },
  { "headers", l_headers },
  { "close", l_close },
  { NULL, NULL }
};

static const luaL_Reg http_funcs[] = {
  { "request", l_request },
  { "open", l_open },
  { "stats", l_stats },
  { NULL, NULL }
};

int mg_open_http(lua_State *L) {
  mg_register_class(L, XFER_MT, xfer_methods, l_gc, l_close, l_tostring);
  luaL_newlib(L, http_funcs);
  return 1;
}
