/*
** json.c — core.json.encode: the checkpoint JSON encoder of moongraph.json,
** in C; core.json.copy: the copy encode then decode would give, made
** without the text (core.json.copy_state: the same for a run's state,
** skipping the keys unchanged since the last copy); and core.json.decode:
** its decoder, in C.
**
** It writes exactly the bytes the Lua encoder (moongraph.json) writes, for
** every value it accepts: integers as %lld, floats as the shortest of %.14g
** and %.17g that reads back equal, in digits (%.0f) instead when that has an
** exponent and the float is a whole number of at most 2^63 in size (".0"
** added when the text has no point or exponent), strings byte for byte with
** '"', '\\' and control characters (0x00-0x1f, 0x7f) escaped, object keys
** sorted bytewise, empty tables as {} or [] (the array marker), null for the
** null sentinel, and with `indent` two-space indentation. Anything else — a
** table that contains itself, mixes list and string keys or has holes, a key
** that is neither a string nor a list index, NaN or an infinity, a function,
** userdata other than the null sentinel, a table with a metatable other than
** the array marker (it could change pairs or #), nesting deeper than
** MAX_DEPTH — makes it return nil, and moongraph.json then encodes the value
** in Lua, which either writes it or names the offending path in its error.
**
** The output is built in a buffer owned by one call and freed before it
** returns; nothing is kept between calls.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mg.h"
#include "walk.h"

#define MAX_DEPTH 200

typedef struct {
  char *p;
  size_t len, cap;
  int failed;            /* out of memory */
} buf_t;

typedef struct {
  lua_State *L;
  buf_t b;
  int null_idx, array_idx;   /* stack slots of the null sentinel and the array metatable */
  int indent;
  int depth;
  const void *path[MAX_DEPTH + 1];   /* tables being encoded: a cycle check */
} enc_t;

typedef struct {
  const char *s;
  size_t len;
} key_t_;

static int reserve(buf_t *b, size_t more) {
  if (b->failed) return -1;
  if (b->len + more <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) { b->failed = 1; return -1; }
  b->p = p;
  b->cap = cap;
  return 0;
}

static void put(buf_t *b, const char *s, size_t n) {
  if (reserve(b, n) < 0) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void putc_(buf_t *b, char c) {
  if (reserve(b, 1) < 0) return;
  b->p[b->len++] = c;
}

static void pad(buf_t *b, int levels) {
  putc_(b, '\n');
  for (int i = 0; i < levels; i++) put(b, "  ", 2);
}

static void put_string(buf_t *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  if (reserve(b, n + 2) < 0) return;
  putc_(b, '"');
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f) continue;
    put(b, s + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': put(b, "\\\"", 2); break;
      case '\\': put(b, "\\\\", 2); break;
      case '\b': put(b, "\\b", 2); break;
      case '\f': put(b, "\\f", 2); break;
      case '\n': put(b, "\\n", 2); break;
      case '\r': put(b, "\\r", 2); break;
      case '\t': put(b, "\\t", 2); break;
      default: {
        char u[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };
        put(b, u, 6);
      }
    }
  }
  put(b, s + run, n - run);
  putc_(b, '"');
}

/* The Lua encoder: %.14g, or %.17g when that does not read back equal;
** a whole number up to 2^63 that came out with an exponent in digits
** (PostgreSQL's jsonb reads 1e+15 as the integer 1000000000000000 and
** gives it back so, where 1000000000000000.0 stays a float); ".0" when the
** text has no '.', 'e', 'E' or 'n'. */
static int put_float(buf_t *b, double v) {
  if (isnan(v) || isinf(v)) return -1;
  char s[40];
  snprintf(s, sizeof s, "%.14g", v);
  if (strtod(s, NULL) != v) snprintf(s, sizeof s, "%.17g", v);
  if (strchr(s, 'e') && v == floor(v) && fabs(v) <= 9223372036854775808.0) snprintf(s, sizeof s, "%.0f", v);
  put(b, s, strlen(s));
  if (!strpbrk(s, ".eEn")) put(b, ".0", 2);
  return 0;
}

static int key_cmp(const void *a, const void *b) {
  const key_t_ *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int c = memcmp(x->s, y->s, n);
  if (c) return c;
  return (x->len > y->len) - (x->len < y->len);
}

static int encode_value(enc_t *e, int idx);

/* The table at idx (absolute). 0, or -1 to hand the value to Lua. */
static int encode_table(enc_t *e, int idx) {
  lua_State *L = e->L;
  int is_array_mt;
  const void *me = mg_walk_enter(L, idx, e->path, e->depth, MAX_DEPTH, 8, e->array_idx, &is_array_mt);
  if (!me) return -1;
  lua_Integer len = (lua_Integer)lua_rawlen(L, idx);
  size_t count = 0, nkeys = 0, cap = 0;
  key_t_ *keys = NULL;
  int rc = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    count++;
    int kt = lua_type(L, -2);
    if (kt == LUA_TSTRING) {
      if (nkeys == cap) {
        size_t ncap = cap ? cap * 2 : 16;
        key_t_ *k = realloc(keys, ncap * sizeof *k);
        if (!k) { rc = -1; lua_pop(L, 2); break; }
        keys = k;
        cap = ncap;
      }
      /* the key stays anchored by the table while it is not modified */
      keys[nkeys].s = lua_tolstring(L, -2, &keys[nkeys].len);
      nkeys++;
    } else if (!(kt == LUA_TNUMBER && lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1 &&
                 lua_tointeger(L, -2) <= len)) {
      rc = -1;
      lua_pop(L, 2);
      break;
    }
    lua_pop(L, 1);
  }
  if (rc == 0 && nkeys && nkeys != count) rc = -1;        /* list items and string keys */
  if (rc == 0 && !nkeys && count && (lua_Integer)count != len) rc = -1;   /* holes */
  if (rc < 0) { free(keys); return -1; }
  e->path[e->depth++] = me;
  int depth = e->depth;
  buf_t *b = &e->b;
  if (nkeys) {
    if (nkeys > 1) qsort(keys, nkeys, sizeof *keys, key_cmp);
    putc_(b, '{');
    for (size_t i = 0; i < nkeys && rc == 0; i++) {
      if (i) putc_(b, ',');
      if (e->indent) pad(b, depth);
      put_string(b, keys[i].s, keys[i].len);
      if (e->indent) put(b, ": ", 2); else putc_(b, ':');
      lua_pushlstring(L, keys[i].s, keys[i].len);
      lua_rawget(L, idx);
      rc = encode_value(e, lua_gettop(L));
      lua_pop(L, 1);
    }
    if (e->indent && rc == 0) pad(b, depth - 1);
    putc_(b, '}');
  } else if (count == 0) {
    put(b, is_array_mt ? "[]" : "{}", 2);
  } else {
    putc_(b, '[');
    for (lua_Integer i = 1; i <= len && rc == 0; i++) {
      if (i > 1) putc_(b, ',');
      if (e->indent) pad(b, depth);
      lua_rawgeti(L, idx, i);
      rc = encode_value(e, lua_gettop(L));
      lua_pop(L, 1);
    }
    if (e->indent && rc == 0) pad(b, depth - 1);
    putc_(b, ']');
  }
  free(keys);
  e->depth--;
  return rc;
}

static int encode_value(enc_t *e, int idx) {
  lua_State *L = e->L;
  buf_t *b = &e->b;
  switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, idx, &n);
      put_string(b, s, n);
      return 0;
    }
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) {
        char s[32];
        int n = snprintf(s, sizeof s, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, idx));
        put(b, s, (size_t)n);
        return 0;
      }
      return put_float(b, (double)lua_tonumber(L, idx));
    case LUA_TBOOLEAN:
      if (lua_toboolean(L, idx)) put(b, "true", 4); else put(b, "false", 5);
      return 0;
    case LUA_TTABLE:
      if (lua_rawequal(L, idx, e->null_idx)) { put(b, "null", 4); return 0; }
      return encode_table(e, idx);
    default:
      if (lua_rawequal(L, idx, e->null_idx)) { put(b, "null", 4); return 0; }
      return -1;
  }
}

/* encode(value, null, array_mt [, indent]) -> string | nil
** null: the sentinel written as null; array_mt: the metatable of tables
** written as [] when empty. nil: hand the value to the Lua encoder. */
static int l_encode(lua_State *L) {
  luaL_checkany(L, 1);
  luaL_checkany(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  enc_t *e = malloc(sizeof *e);
  if (!e) return luaL_error(L, "out of memory");
  memset(e, 0, sizeof *e);
  e->L = L;
  e->null_idx = 2;
  e->array_idx = 3;
  e->indent = lua_toboolean(L, 4);
  lua_settop(L, 4);
  int rc = encode_value(e, 1);
  if (rc == 0 && !e->b.failed) lua_pushlstring(L, e->b.p ? e->b.p : "", e->b.len);
  else lua_pushnil(L);
  free(e->b.p);
  free(e);
  return 1;
}

/* copy: the value decode(encode(v)) gives, built without the text. The
** same values are accepted as by encode; the copy shares nothing with v
** (the null sentinel aside): tables are new, a table met twice is copied
** twice, and only an empty table with the array marker keeps the marker
** (decode marks the empty arrays it reads). */
typedef struct {
  lua_State *L;
  int null_idx, array_idx;
  int depth;
  const void *path[MAX_DEPTH + 1];
} copy_t;

static int copy_value(copy_t *c, int idx, int prev);

/* Whether a copied part (at a) is prev's part (at b): the same table, or an
** equal string, boolean or number of the same subtype (and, for floats,
** sign: -0.0 equals 0.0 but is written "-0.0"). */
static int same_part(lua_State *L, int a, int b) {
  if (!lua_rawequal(L, a, b)) return 0;
  if (lua_type(L, a) != LUA_TNUMBER) return 1;
  if (lua_isinteger(L, a) != lua_isinteger(L, b)) return 0;
  return lua_isinteger(L, a) || !signbit(lua_tonumber(L, a)) == !signbit(lua_tonumber(L, b));
}

static size_t count_keys(lua_State *L, int t) {
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, t)) {
    n++;
    lua_pop(L, 1);
  }
  return n;
}

/* prev[key], key at stack index k, pushed; returns its index, or 0 (and
** nothing pushed) when there is no earlier copy to reuse from. */
static int prev_child(lua_State *L, int prev, int k) {
  if (!prev) return 0;
  lua_pushvalue(L, k);
  lua_rawget(L, prev);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return 0;
  }
  return lua_gettop(L);
}

/* Set out[key] = prev[key] for the keys of the table at idx that lua_next
** gives before the key at stack index stop (0: all of them). */
static void take_prev_parts(lua_State *L, int idx, int prev, int out, int stop) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (stop && lua_rawequal(L, -1, stop)) {
      lua_pop(L, 1);
      return;
    }
    lua_pushvalue(L, -1);
    lua_pushvalue(L, -1);
    lua_rawget(L, prev);
    lua_rawset(L, out);
  }
}

/* Set t[j] = prev[j] for j in 1..upto, t on the top of the stack. */
static void take_prev_items(lua_State *L, int prev, lua_Integer upto) {
  for (lua_Integer j = 1; j <= upto; j++) {
    lua_rawgeti(L, prev, j);
    lua_rawseti(L, -2, j);
  }
}

/* The copy of the table at idx (absolute) pushed: 0, or -1 (nothing pushed).
** prev (0: none) is an earlier copy of the same place: a part of the value
** equal to its counterpart there is that part of prev, not a new table, and
** a table equal to prev is prev itself. One walk: the new table is made
** only at the first part that differs (or when prev has other keys). */
static int copy_table(copy_t *c, int idx, int prev) {
  lua_State *L = c->L;
  int is_array_mt;
  const void *me = mg_walk_enter(L, idx, c->path, c->depth, MAX_DEPTH, 12, c->array_idx, &is_array_mt);
  if (!me) return -1;
  /* the shape, as encode_table checks it: string keys only, or a list */
  lua_Integer len = (lua_Integer)lua_rawlen(L, idx);
  size_t count = 0, nkeys = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    count++;
    int kt = lua_type(L, -2);
    if (kt == LUA_TSTRING) {
      nkeys++;
    } else if (!(kt == LUA_TNUMBER && lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1 &&
                 lua_tointeger(L, -2) <= len)) {
      lua_pop(L, 2);
      return -1;
    }
    lua_pop(L, 1);
  }
  if (nkeys && nkeys != count) return -1;
  if (!nkeys && count && (lua_Integer)count != len) return -1;
  /* prev, when it can be reused from: a table with no metatable but the
  ** array marker (p_arr) */
  int pl = 0, p_arr = 0;
  if (prev && lua_type(L, prev) == LUA_TTABLE && !lua_rawequal(L, prev, c->null_idx)) {
    pl = prev;
    if (lua_getmetatable(L, pl)) {
      p_arr = lua_rawequal(L, -1, c->array_idx);
      lua_pop(L, 1);
      if (!p_arr) pl = 0;
    }
  }
  if (count == 0) {
    if (pl && p_arr == is_array_mt && count_keys(L, pl) == 0) {
      lua_pushvalue(L, pl);
      return 0;
    }
    lua_createtable(L, 0, 0);
    if (is_array_mt) {
      lua_pushvalue(L, c->array_idx);
      lua_setmetatable(L, -2);
    }
    return 0;
  }
  int base = lua_gettop(L);
  int out = 0;   /* the new table's index, once made */
  if (!pl) {
    lua_createtable(L, nkeys ? 0 : (int)len, (int)nkeys);
    out = lua_gettop(L);
  }
  c->path[c->depth++] = me;
  int rc = 0;
  if (nkeys) {
    lua_pushnil(L);
    while (rc == 0 && lua_next(L, idx)) {
      int k = lua_gettop(L) - 1;
      int pv = prev_child(L, pl, k);
      rc = copy_value(c, k + 1, pv);
      if (rc < 0) break;
      int cp = lua_gettop(L);
      if (!out && !(pv && same_part(L, cp, pv))) {
        /* the first part that differs: the new table, below the key,
        ** with prev's parts for the keys before it */
        lua_createtable(L, 0, (int)nkeys);
        take_prev_parts(L, idx, pl, lua_gettop(L), k);
        lua_insert(L, k);
        out = k++;
        cp++;
      }
      if (out) {
        lua_pushvalue(L, k);
        lua_pushvalue(L, cp);
        lua_rawset(L, out);
      }
      lua_settop(L, k);   /* the key stays for lua_next */
    }
  } else {
    for (lua_Integer i = 1; i <= len; i++) {
      lua_rawgeti(L, idx, i);
      int v = lua_gettop(L);
      int pv = 0;
      if (pl) {
        if (lua_rawgeti(L, pl, i) == LUA_TNIL) lua_pop(L, 1);
        else pv = lua_gettop(L);
      }
      rc = copy_value(c, v, pv);
      if (rc < 0) break;
      int cp = lua_gettop(L);
      if (!out && !(pv && same_part(L, cp, pv))) {
        lua_createtable(L, (int)len, 0);
        take_prev_items(L, pl, i - 1);
        lua_insert(L, v);
        out = v++;
        cp++;
      }
      if (out) {
        lua_pushvalue(L, cp);
        lua_rawseti(L, out, i);
      }
      lua_settop(L, v - 1);
    }
  }
  c->depth--;
  if (rc < 0) {
    lua_settop(L, base);
    return -1;
  }
  if (!out) {
    /* every part is prev's: prev itself, unless it has more */
    if (!p_arr && count_keys(L, pl) == count) {
      lua_pushvalue(L, pl);
      return 0;
    }
    if (nkeys) {
      lua_createtable(L, 0, (int)nkeys);
      take_prev_parts(L, idx, pl, lua_gettop(L), 0);
    } else {
      lua_createtable(L, (int)len, 0);
      take_prev_items(L, pl, len);
    }
  }
  return 0;
}

/* The copy of the value at idx (absolute) pushed: 0, or -1 (nothing pushed). */
static int copy_value(copy_t *c, int idx, int prev) {
  lua_State *L = c->L;
  switch (lua_type(L, idx)) {
    case LUA_TSTRING:
    case LUA_TBOOLEAN:
      lua_pushvalue(L, idx);
      return 0;
    case LUA_TNUMBER:
      if (!lua_isinteger(L, idx)) {
        lua_Number v = lua_tonumber(L, idx);
        if (isnan(v) || isinf(v)) return -1;
      }
      lua_pushvalue(L, idx);
      return 0;
    case LUA_TTABLE:
      if (lua_rawequal(L, idx, c->null_idx)) { lua_pushvalue(L, idx); return 0; }
      return copy_table(c, idx, prev);
    default:
      if (lua_rawequal(L, idx, c->null_idx)) { lua_pushvalue(L, idx); return 0; }
      return -1;
  }
}

/* copy(value, null, array_mt [, prev]) -> true, copy | false
** false: a value encode leaves to the Lua encoder (moongraph.json then
** copies it through the text, or names what cannot be saved). prev, an
** earlier copy of a value at the same place: every part of the new copy
** equal to prev's part there is prev's table itself (shared, never changed
** by copy), so a caller can tell unchanged parts by identity. */
static int l_copy(lua_State *L) {
  luaL_checkany(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_settop(L, 4);
  copy_t cc, *c = &cc;
  c->L = L;
  c->null_idx = 2;
  c->array_idx = 3;
  c->depth = 0;
  lua_pushboolean(L, 1);
  int rc = copy_value(c, 1, lua_istable(L, 4) ? 4 : 0);
  if (rc < 0) {
    lua_pushboolean(L, 0);
    return 1;
  }
  return 2;
}

/* copy_state(values, null, array_mt, prev, src [, written]) -> true, copy | false
** The copy of a run's state table (string keys, no metatable) that copy
** would make against prev, the last such copy, without walking the keys
** that cannot have changed since: a key whose value is the very one src
** (the state's values when prev was made) holds for it, that `written` (the
** keys a write reached since) does not hold and that prev has, takes prev's
** part as it is. src gets the value of every key walked; written is
** emptied. The copy is always a new table. false: as copy's, and src may
** then be part updated. */
static int l_copy_state(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkany(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TTABLE);
  lua_settop(L, 6);
  int prev = lua_istable(L, 4) ? 4 : 0;
  int written = lua_istable(L, 6) ? 6 : 0;
  copy_t cc, *c = &cc;
  c->L = L;
  c->null_idx = 2;
  c->array_idx = 3;
  c->depth = 0;
  int is_array_mt;
  const void *me = mg_walk_enter(L, 1, c->path, 0, MAX_DEPTH, 12, 3, &is_array_mt);
  if (!me || is_array_mt) {
    lua_pushboolean(L, 0);
    return 1;
  }
  size_t nkeys = 0;
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING) {
      lua_pop(L, 1);
      lua_pushboolean(L, 0);
      return 1;
    }
    nkeys++;
  }
  lua_pushboolean(L, 1);                  /* 7 */
  lua_createtable(L, 0, (int)nkeys);      /* 8: the copy */
  c->path[c->depth++] = me;
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    int k = lua_gettop(L) - 1, v = k + 1;
    int pv = prev_child(L, prev, k);
    int reuse = 0;
    if (pv) {
      lua_pushvalue(L, k);
      lua_rawget(L, 5);
      reuse = lua_rawequal(L, -1, v);
      lua_pop(L, 1);
      if (reuse && written) {
        lua_pushvalue(L, k);
        reuse = lua_rawget(L, written) == LUA_TNIL || !lua_toboolean(L, -1);
        lua_pop(L, 1);
      }
    }
    if (reuse) {
      lua_pushvalue(L, pv);
    } else {
      if (copy_value(c, v, pv) < 0) {
        lua_pushboolean(L, 0);
        return 1;
      }
      lua_pushvalue(L, k);
      lua_pushvalue(L, v);
      lua_rawset(L, 5);
    }
    lua_pushvalue(L, k);
    lua_insert(L, -2);
    lua_rawset(L, 8);
    lua_settop(L, k);
  }
  if (written) {
    lua_pushnil(L);
    while (lua_next(L, written)) {
      lua_pop(L, 1);
      lua_pushvalue(L, -1);
      lua_pushnil(L);
      lua_rawset(L, written);
    }
  }
  lua_settop(L, 8);
  return 2;
}

/* ---------------------------------------------------------------- decode */

/* decode gives what moongraph.json's Lua decoder gives, value for value and
** error for error (the message and its byte position): integers stay
** integers (one too large for an integer becomes a float), a number written
** with '.', 'e' or 'E' is a float, strings are taken byte for byte (escapes
** decoded; a \u escape pair of surrogates joined, a lone one written as its
** three bytes; a raw control character refused), an empty array gets the
** array marker and other tables
** none, null is the null sentinel, and nesting stops at MAX_DEPTH. Numbers
** are read as the Lua decoder reads them: the longest run matching
** -?digits[.digits][eE][+-]digits, converted as tonumber converts. It is
** stricter in one place: a \u escape takes exactly four hex digits. */
typedef struct {
  lua_State *L;
  const char *s;
  size_t n;
  int null_idx, array_idx;
  const char *err;
  size_t err_at;             /* 0-based offset the error names */
} dec_t;

static size_t dec_fail(dec_t *d, const char *msg, size_t at) {
  d->err = msg;
  d->err_at = at;
  return (size_t)-1;
}

#define DEC_FAILED ((size_t)-1)

static size_t skip_ws(const dec_t *d, size_t i) {
  while (i < d->n && (d->s[i] == ' ' || d->s[i] == '\t' || d->s[i] == '\r' || d->s[i] == '\n')) i++;
  return i;
}

static int hex4(const char *p, unsigned *out) {
  unsigned v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p[k];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return 0;
  }
  *out = v;
  return 1;
}

static void add_utf8(luaL_Buffer *b, unsigned cp) {
  char u[4];
  int len;
  if (cp < 0x80) { u[0] = (char)cp; len = 1; }
  else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); len = 2; }
  else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F)); len = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); len = 4;
  }
  luaL_addlstring(b, u, (size_t)len);
}

/* The string whose opening quote is at i: pushed; returns the offset after
** its closing quote. */
/* A byte that ends a run of plain string bytes: a quote, a backslash, or a
** control character (RFC 8259: those must be escaped). */
#define STRING_STOP(c) ((c) == '"' || (c) == '\\' || (unsigned char)(c) < 0x20)

static size_t dec_string(dec_t *d, size_t i) {
  const char *s = d->s;
  size_t n = d->n, j = i + 1;
  while (j < n && !STRING_STOP(s[j])) j++;
  if (j >= n) return dec_fail(d, "unterminated string", i);
  if ((unsigned char)s[j] < 0x20) return dec_fail(d, "control character in string", j);
  if (s[j] == '"') {                          /* no escape: the bytes as they are */
    lua_pushlstring(d->L, s + i + 1, j - i - 1);
    return j + 1;
  }
  luaL_Buffer b;
  luaL_buffinit(d->L, &b);
  luaL_addlstring(&b, s + i + 1, j - i - 1);
  while (1) {
    if (j >= n) return dec_fail(d, "unterminated string", i);
    char c = s[j];
    if (c == '"') {
      luaL_pushresult(&b);
      return j + 1;
    }
    if ((unsigned char)c < 0x20) return dec_fail(d, "control character in string", j);
    if (c != '\\') {
      size_t k = j;
      while (k < n && !STRING_STOP(s[k])) k++;
      luaL_addlstring(&b, s + j, k - j);
      j = k;
      continue;
    }
    char e = j + 1 < n ? s[j + 1] : '\0';
    const char *simple = NULL;
    switch (e) {
      case '"': simple = "\""; break;
      case '\\': simple = "\\"; break;
      case '/': simple = "/"; break;
      case 'b': simple = "\b"; break;
      case 'f': simple = "\f"; break;
      case 'n': simple = "\n"; break;
      case 'r': simple = "\r"; break;
      case 't': simple = "\t"; break;
      default: break;
    }
    if (simple) {
      luaL_addchar(&b, simple[0]);
      j += 2;
      continue;
    }
    if (e != 'u') return dec_fail(d, "bad escape", j);
    unsigned cp, lo;
    if (j + 6 > n || !hex4(s + j + 2, &cp)) return dec_fail(d, "bad \\u escape", j);
    j += 6;
    if (cp >= 0xD800 && cp <= 0xDBFF && j + 6 <= n && s[j] == '\\' && s[j + 1] == 'u' &&
        hex4(s + j + 2, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      j += 6;
    }
    add_utf8(&b, cp);
  }
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static size_t dec_number(dec_t *d, size_t i) {
  const char *s = d->s;
  size_t n = d->n, j = i;
  if (j < n && s[j] == '-') j++;
  if (j >= n || !is_digit(s[j])) return dec_fail(d, "unexpected character", i);
  while (j < n && is_digit(s[j])) j++;
  int fractional = 0;
  if (j < n && s[j] == '.') { j++; fractional = 1; }
  while (j < n && is_digit(s[j])) j++;
  if (j < n && (s[j] == 'e' || s[j] == 'E')) { j++; fractional = 1; }
  if (j < n && (s[j] == '-' || s[j] == '+')) j++;
  while (j < n && is_digit(s[j])) j++;
  lua_State *L = d->L;
  char small[64];
  const char *text;
  size_t len = j - i;
  if (len < sizeof small) {
    memcpy(small, s + i, len);
    small[len] = '\0';
    text = small;
  } else {
    lua_pushlstring(L, s + i, len);         /* kept below the number */
    text = lua_tostring(L, -1);
  }
  if (lua_stringtonumber(L, text) == 0) {
    if (text != small) lua_pop(L, 1);
    return dec_fail(d, "bad number", i);
  }
  if (text != small) lua_remove(L, -2);
  if (fractional) {
    if (lua_isinteger(L, -1)) {               /* as v + 0.0 makes it */
      lua_Number f = (lua_Number)lua_tointeger(L, -1);
      lua_pop(L, 1);
      lua_pushnumber(L, f);
    }
  } else if (!lua_isinteger(L, -1)) {         /* math.tointeger(v) or v */
    lua_Number f = lua_tonumber(L, -1);
    lua_Integer k;
    if (f == floor(f) && lua_numbertointeger(f, &k)) {
      lua_pop(L, 1);
      lua_pushinteger(L, k);
    }
  }
  return j;
}

static size_t dec_value(dec_t *d, size_t i, int depth) {
  lua_State *L = d->L;
  const char *s = d->s;
  size_t n = d->n;
  i = skip_ws(d, i);
  if (i >= n) return dec_fail(d, "unexpected end of input", i);
  char c = s[i];
  if (c == '{') {
    if (depth > MAX_DEPTH) return dec_fail(d, "nesting too deep", i);
    luaL_checkstack(L, 4, "JSON nesting");
    lua_newtable(L);
    i = skip_ws(d, i + 1);
    if (i < n && s[i] == '}') return i + 1;
    while (1) {
      if (i >= n || s[i] != '"') return dec_fail(d, "object key expected", i);
      i = dec_string(d, i);
      if (i == DEC_FAILED) return i;
      i = skip_ws(d, i);
      if (i >= n || s[i] != ':') return dec_fail(d, "':' expected", i);
      i = dec_value(d, i + 1, depth + 1);
      if (i == DEC_FAILED) return i;
      lua_rawset(L, -3);
      i = skip_ws(d, i);
      if (i < n && s[i] == ',') i = skip_ws(d, i + 1);
      else if (i < n && s[i] == '}') return i + 1;
      else return dec_fail(d, "',' or '}' expected", i);
    }
  }
  if (c == '[') {
    if (depth > MAX_DEPTH) return dec_fail(d, "nesting too deep", i);
    luaL_checkstack(L, 4, "JSON nesting");
    lua_newtable(L);
    i = skip_ws(d, i + 1);
    if (i < n && s[i] == ']') {
      lua_pushvalue(L, d->array_idx);
      lua_setmetatable(L, -2);
      return i + 1;
    }
    lua_Integer k = 0;
    while (1) {
      i = dec_value(d, i, depth + 1);
      if (i == DEC_FAILED) return i;
      lua_rawseti(L, -2, ++k);
      i = skip_ws(d, i);
      if (i < n && s[i] == ',') i = i + 1;
      else if (i < n && s[i] == ']') return i + 1;
      else return dec_fail(d, "',' or ']' expected", i);
    }
  }
  if (c == '"') return dec_string(d, i);
  if (c == 't' && n - i >= 4 && memcmp(s + i, "true", 4) == 0) { lua_pushboolean(L, 1); return i + 4; }
  if (c == 'f' && n - i >= 5 && memcmp(s + i, "false", 5) == 0) { lua_pushboolean(L, 0); return i + 5; }
  if (c == 'n' && n - i >= 4 && memcmp(s + i, "null", 4) == 0) { lua_pushvalue(L, d->null_idx); return i + 4; }
  return dec_number(d, i);
}

/* decode(s, null, array_mt) -> value | nil, err ("invalid JSON: ... at byte N") */
static int l_decode(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_checkany(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_settop(L, 3);
  dec_t d = { L, s, n, 2, 3, NULL, 0 };
  size_t i = dec_value(&d, 0, 0);
  if (i != DEC_FAILED) {
    i = skip_ws(&d, i);
    if (i >= n) return 1;
    dec_fail(&d, "trailing data", i);
  }
  lua_settop(L, 3);
  lua_pushnil(L);
  lua_pushfstring(L, "invalid JSON: %s at byte %I", d.err, (lua_Integer)(d.err_at + 1));
  return 2;
}

static const luaL_Reg json_fns[] = {
  {"encode", l_encode},
  {"copy", l_copy},
  {"copy_state", l_copy_state},
  {"decode", l_decode},
  {NULL, NULL},
};

int mg_open_json(lua_State *L) {
  luaL_newlib(L, json_fns);
  return 1;
}
