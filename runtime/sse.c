/*
** sse.c — incremental Server-Sent Events parser and its Lua face.
**
** The parser (see sse.h for the rules it follows) is plain C with no Lua or
** libuv dependency, so the fuzz harness and the HTTP/LLM layers can use it
** directly. The bottom of the file exposes it as `core.sse`:
**
**   local p = core.sse.new([max_bytes])
**   p:feed(chunk) -> { {event=, data=, id=, retry=}, ... } | nil, err
**   p:reset()   p:last_event_id() -> string|nil   p:retry() -> ms|nil
*/
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mg.h"
#include "sse.h"

static const unsigned char bom_bytes[3] = { 0xEF, 0xBB, 0xBF };

static int buf_reserve(mg_sse_buf *b, size_t need) {
  if (need <= b->cap) return MG_SSE_OK;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < need) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) return MG_SSE_ENOMEM;
  b->p = p;
  b->cap = cap;
  return MG_SSE_OK;
}

/* Append n bytes, refusing to grow past max. */
static int buf_append(mg_sse_buf *b, const char *s, size_t n, size_t max) {
  if (n > max || b->len > max - n) return MG_SSE_ETOOBIG;
  int rc = buf_reserve(b, b->len + n);
  if (rc) return rc;
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  return MG_SSE_OK;
}

static int buf_set(mg_sse_buf *b, const char *s, size_t n, size_t max) {
  b->len = 0;
  return buf_append(b, s, n, max);
}

void mg_sse_init(mg_sse *p, size_t max_bytes) {
  memset(p, 0, sizeof *p);
  p->max_bytes = max_bytes ? max_bytes : MG_SSE_DEFAULT_MAX;
  p->retry = -1;
  p->block_retry = -1;
}

void mg_sse_reset(mg_sse *p) {
  p->line.len = p->data.len = p->event.len = p->id.len = 0;
  p->retry = -1;
  p->block_retry = -1;
  p->bom = 0;
  p->cr = 0;
  p->error = MG_SSE_OK;
}

void mg_sse_free(mg_sse *p) {
  free(p->line.p);
  free(p->data.p);
  free(p->event.p);
  free(p->id.p);
  size_t max = p->max_bytes;
  mg_sse_init(p, max);
}

const char *mg_sse_strerror(int code) {
  switch (code) {
    case MG_SSE_OK: return "ok";
    case MG_SSE_ETOOBIG: return "line or event exceeds max_bytes";
    case MG_SSE_ENOMEM: return "out of memory";
    case MG_SSE_ESTOP: return "stopped by callback";
    default: return "unknown error";
  }
}

static int dispatch(mg_sse *p, mg_sse_cb cb, void *ud) {
  int rc = MG_SSE_OK;
  if (p->data.len > 0) {
    mg_sse_event ev;
    ev.event = p->event.len ? p->event.p : "message";
    ev.event_len = p->event.len ? p->event.len : 7;
    ev.data = p->data.p;
    ev.data_len = p->data.len - 1;     /* drop the LF after the last line */
    ev.id = p->id.len ? p->id.p : "";
    ev.id_len = p->id.len;
    ev.retry = p->block_retry;
    if (cb && cb(ud, &ev) != 0) rc = MG_SSE_ESTOP;
  }
  p->data.len = 0;
  p->event.len = 0;
  p->block_retry = -1;
  return rc;
}

static int field_is(const char *f, size_t n, const char *name) {
  size_t k = strlen(name);
  return n == k && memcmp(f, name, k) == 0;
}

/* Interpret one complete line (terminator removed). */
static int process_line(mg_sse *p, const char *s, size_t n,
                        mg_sse_cb cb, void *ud) {
  if (n > p->max_bytes) return MG_SSE_ETOOBIG;
  if (n == 0) return dispatch(p, cb, ud);
  if (s[0] == ':') return MG_SSE_OK;

  const char *colon = memchr(s, ':', n);
  size_t flen = colon ? (size_t)(colon - s) : n;
  const char *v = colon ? colon + 1 : s + n;
  size_t vlen = (size_t)(s + n - v);
  if (vlen > 0 && v[0] == ' ') { v++; vlen--; }

  if (field_is(s, flen, "data")) {
    int rc = buf_append(&p->data, v, vlen, p->max_bytes);
    if (rc) return rc;
    return buf_append(&p->data, "\n", 1, p->max_bytes);
  }
  if (field_is(s, flen, "event"))
    return buf_set(&p->event, v, vlen, p->max_bytes);
  if (field_is(s, flen, "id")) {
    if (memchr(v, '\0', vlen)) return MG_SSE_OK;
    return buf_set(&p->id, v, vlen, p->max_bytes);
  }
  if (field_is(s, flen, "retry")) {
    if (vlen == 0) return MG_SSE_OK;
    long ms = 0;
    for (size_t i = 0; i < vlen; i++) {
      if (v[i] < '0' || v[i] > '9') return MG_SSE_OK;
      int d = v[i] - '0';
      ms = (ms > (LONG_MAX - d) / 10) ? LONG_MAX : ms * 10 + d;
    }
    p->retry = ms;
    p->block_retry = ms;
  }
  return MG_SSE_OK;   /* unknown fields are ignored */
}

static int process(mg_sse *p, const char *s, const char *end,
                   mg_sse_cb cb, void *ud) {
  while (s < end) {
    if (p->cr) {
      p->cr = 0;
      if (*s == '\n') { s++; continue; }
    }
    const char *q = s;
    while (q < end && *q != '\n' && *q != '\r') q++;
    if (q == end) return buf_append(&p->line, s, (size_t)(q - s), p->max_bytes);
    int rc;
    if (p->line.len == 0) {
      rc = process_line(p, s, (size_t)(q - s), cb, ud);
    } else {
      rc = buf_append(&p->line, s, (size_t)(q - s), p->max_bytes);
      if (rc == MG_SSE_OK) rc = process_line(p, p->line.p, p->line.len, cb, ud);
      p->line.len = 0;
    }
    if (*q == '\r') p->cr = 1;
    s = q + 1;
    if (rc) return rc;
  }
  return MG_SSE_OK;
}

int mg_sse_feed(mg_sse *p, const char *buf, size_t len,
                mg_sse_cb cb, void *ud) {
  if (p->error) return p->error;
  const char *s = buf, *end = buf + len;
  int rc = MG_SSE_OK;
  while (p->bom < 3 && s < end) {
    if ((unsigned char)*s == bom_bytes[p->bom]) {
      p->bom++;
      s++;
      continue;
    }
    /* Not a BOM after all: the bytes matched so far are content. */
    unsigned k = p->bom;
    p->bom = 3;
    rc = process(p, (const char *)bom_bytes, (const char *)bom_bytes + k, cb, ud);
    if (rc) goto out;
  }
  if (s < end) rc = process(p, s, end, cb, ud);
out:
  /* A stop from the callback is not sticky: the rest of the chunk is lost,
  ** but the parser stays usable. Errors of the input or memory are. */
  if (rc && rc != MG_SSE_ESTOP) p->error = rc;
  return rc;
}

/* ---- Lua binding ---- */

#define SSE_MT "moongraph.sse"

typedef struct {
  mg_sse p;
} lsse;

static lsse *check_sse(lua_State *L) {
  return (lsse *)luaL_checkudata(L, 1, SSE_MT);
}

/* Append the event as a table to the list at stack index -1. */
static int push_event(void *ud, const mg_sse_event *ev) {
  lua_State *L = (lua_State *)ud;
  lua_createtable(L, 0, 4);
  lua_pushlstring(L, ev->event, ev->event_len);
  lua_setfield(L, -2, "event");
  lua_pushlstring(L, ev->data, ev->data_len);
  lua_setfield(L, -2, "data");
  if (ev->id_len) {
    lua_pushlstring(L, ev->id, ev->id_len);
    lua_setfield(L, -2, "id");
  }
  if (ev->retry >= 0) {
    lua_pushinteger(L, (lua_Integer)ev->retry);
    lua_setfield(L, -2, "retry");
  }
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  return 0;
}

static int l_new(lua_State *L) {
  lua_Integer max = luaL_optinteger(L, 1, 0);
  luaL_argcheck(L, max >= 0, 1, "max_bytes must be >= 0");
  lsse *s = (lsse *)lua_newuserdatauv(L, sizeof *s, 0);
  mg_sse_init(&s->p, (size_t)max);
  luaL_setmetatable(L, SSE_MT);
  return 1;
}

static int l_feed(lua_State *L) {
  lsse *s = check_sse(L);
  size_t n;
  const char *chunk = luaL_checklstring(L, 2, &n);
  lua_newtable(L);
  int rc = mg_sse_feed(&s->p, chunk, n, push_event, L);
  if (rc != MG_SSE_OK) {
    luaL_pushfail(L);
    if (rc == MG_SSE_ETOOBIG)
      lua_pushfstring(L, "sse: line or event exceeds %I bytes",
                      (lua_Integer)s->p.max_bytes);
    else
      lua_pushfstring(L, "sse: %s", mg_sse_strerror(rc));
    return 2;
  }
  return 1;
}

static int l_reset(lua_State *L) {
  mg_sse_reset(&check_sse(L)->p);
  return 0;
}

static int l_last_event_id(lua_State *L) {
  lsse *s = check_sse(L);
  if (s->p.id.len) lua_pushlstring(L, s->p.id.p, s->p.id.len);
  else lua_pushnil(L);
  return 1;
}

static int l_retry(lua_State *L) {
  lsse *s = check_sse(L);
  if (s->p.retry >= 0) lua_pushinteger(L, (lua_Integer)s->p.retry);
  else lua_pushnil(L);
  return 1;
}

static int l_gc(lua_State *L) {
  mg_sse_free(&check_sse(L)->p);
  return 0;
}

static int l_tostring(lua_State *L) {
  lua_pushfstring(L, "sse parser (%p)", lua_touserdata(L, 1));
  return 1;
}

static const luaL_Reg sse_methods[] = {
  { "feed", l_feed },
  { "reset", l_reset },
  { "last_event_id", l_last_event_id },
  { "retry", l_retry },
  { NULL, NULL }
};

static const luaL_Reg sse_funcs[] = {
  { "new", l_new },
  { NULL, NULL }
};

int mg_open_sse(lua_State *L) {
  if (luaL_newmetatable(L, SSE_MT)) {
    luaL_newlib(L, sse_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, sse_funcs);
  return 1;
}
