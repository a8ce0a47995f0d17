/*
** pack.c — core.pack: a state value as one compact binary string, and back.
**
** pack(null, array_mt, v [, v2...]) takes what the JSON encoder (json.c)
** takes and nothing else; unpack(s, null, array_mt) gives, for each value
** packed, what decoding its JSON would give (json.copy's value): integers and floats kept apart, floats
** bit for bit, strings byte for byte, the array marker on empty arrays only,
** new tables throughout. A store that keeps values in-process holds one
** string per value: no text to write or parse, and nothing for the
** collector to walk.
**
** pack returns nil for a value it does not take (moongraph.json then copies
** it through the codec, or names what cannot be saved); packer(null,
** array_mt, fallback) makes a pack(v [, v2...]) that hands such values to
** fallback itself.
**
** The form, one tag byte per value, sizes and numbers in host order:
**   'n' null   't' true   'f' false   'a' empty array   'e' empty object
**   'i' int64  'd' double   's' u32 length, bytes
**   'l' u32 count, values   'm' u32 count, (u32 length, key bytes, value)...
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "mg.h"
#include "walk.h"

#define MAX_DEPTH 200
#define STACK_BUF 2048

typedef struct {
  lua_State *L;
  char *p;
  size_t len, cap;
  int null_idx, array_idx;
  int depth;
  const void *path[MAX_DEPTH + 1];   /* tables being packed: a cycle check */
  char first[STACK_BUF];
} pack_t;

static inline int room(pack_t *k, size_t n) {
  return mg_buf_room(&k->p, &k->cap, k->len, k->first, n);
}

static inline int put_tag(pack_t *k, char tag) {
  if (room(k, 1) < 0) return -1;
  k->p[k->len++] = tag;
  return 0;
}

/* a tag and 8 bytes (an integer or a double) */
static inline int put_tag8(pack_t *k, char tag, const void *v) {
  if (room(k, 9) < 0) return -1;
  k->p[k->len] = tag;
  memcpy(k->p + k->len + 1, v, 8);
  k->len += 9;
  return 0;
}

static inline int put_u32(pack_t *k, size_t n) {
  if (n > UINT32_MAX || room(k, 4) < 0) return -1;
  uint32_t v = (uint32_t)n;
  memcpy(k->p + k->len, &v, 4);
  k->len += 4;
  return 0;
}

static inline int put_bytes(pack_t *k, const char *s, size_t n) {
  if (n > UINT32_MAX || room(k, 4 + n) < 0) return -1;
  uint32_t v = (uint32_t)n;
  memcpy(k->p + k->len, &v, 4);
  memcpy(k->p + k->len + 4, s, n);
  k->len += 4 + n;
  return 0;
}

static int pack_value(pack_t *k, int idx);

/* The table at idx (absolute): 0, or -1 when it cannot be packed. */
static int pack_table(pack_t *k, int idx) {
  lua_State *L = k->L;
  int is_array_mt;
  const void *me = mg_walk_enter(L, idx, k->path, k->depth, MAX_DEPTH, 8, k->array_idx, &is_array_mt);
  if (!me) return -1;
  lua_Integer len = (lua_Integer)lua_rawlen(L, idx);
  k->path[k->depth++] = me;
  int rc = 0;
  if (len == 0) {
    /* string keys only (or none), written as they come; the count after */
    size_t start = k->len, count = 0;
    if (put_tag(k, 'm') < 0 || put_u32(k, 0) < 0) rc = -1;
    int value_idx = lua_gettop(L) + 2;   /* where lua_next leaves each value */
    lua_pushnil(L);
    while (rc == 0 && lua_next(L, idx)) {
      if (lua_type(L, -2) != LUA_TSTRING) {
        rc = -1;
      } else {
        size_t n;
        const char *s = lua_tolstring(L, -2, &n);
        rc = put_bytes(k, s, n);
        if (rc == 0) rc = pack_value(k, value_idx);
        count++;
      }
      lua_pop(L, 1);
    }
    if (rc < 0) {
      lua_pop(L, 1);   /* the key lua_next left */
    } else if (count == 0) {
      k->len = start;
      rc = put_tag(k, is_array_mt ? 'a' : 'e');
    } else if (count > UINT32_MAX) {
      rc = -1;
    } else {
      uint32_t c = (uint32_t)count;
      memcpy(k->p + start + 1, &c, sizeof c);
    }
  } else {
    /* a list: len keys in all, and each of 1..len holds a value (a nil
    ** one fails below), so no other key */
    lua_Integer count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
      count++;
      lua_pop(L, 1);
    }
    if (count != len) rc = -1;
    if (rc == 0 && (put_tag(k, 'l') < 0 || put_u32(k, (size_t)len) < 0)) rc = -1;
    int item_idx = lua_gettop(L) + 1;
    for (lua_Integer i = 1; i <= len && rc == 0; i++) {
      lua_rawgeti(L, idx, i);
      rc = pack_value(k, item_idx);
      lua_pop(L, 1);
    }
  }
  k->depth--;
  return rc;
}

static int pack_value(pack_t *k, int idx) {
  lua_State *L = k->L;
  switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, idx, &n);
      if (n > UINT32_MAX || room(k, 5 + n) < 0) return -1;
      uint32_t v = (uint32_t)n;
      k->p[k->len] = 's';
      memcpy(k->p + k->len + 1, &v, 4);
      memcpy(k->p + k->len + 5, s, n);
      k->len += 5 + n;
      return 0;
    }
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) {
        lua_Integer v = lua_tointeger(L, idx);
        return put_tag8(k, 'i', &v);
      } else {
        lua_Number v = lua_tonumber(L, idx);
        if (isnan(v) || isinf(v)) return -1;
        return put_tag8(k, 'd', &v);
      }
    case LUA_TBOOLEAN:
      return put_tag(k, lua_toboolean(L, idx) ? 't' : 'f');
    case LUA_TTABLE:
      if (lua_rawequal(L, idx, k->null_idx)) return put_tag(k, 'n');
      return pack_table(k, idx);
    default:
      if (lua_rawequal(L, idx, k->null_idx)) return put_tag(k, 'n');
      return -1;
  }
}

/* Pushes the values at first..top packed into one string: 0, or -1 (nothing
** pushed). null_idx, array_idx: stack slots or upvalue pseudo-indices. */
static int pack_range(lua_State *L, int first, int top, int null_idx, int array_idx) {
  pack_t kk, *k = &kk;
  k->L = L;
  k->p = k->first;
  k->len = 0;
  k->cap = STACK_BUF;
  k->null_idx = null_idx;
  k->array_idx = array_idx;
  k->depth = 0;
  int rc = 0;
  for (int i = first; i <= top && rc == 0; i++) rc = pack_value(k, i);
  if (rc == 0) lua_pushlstring(L, k->p, k->len);
  mg_buf_free(k->p, k->first);
  return rc;
}

/* pack(null, array_mt, value [, value...]) -> string | nil */
static int l_pack(lua_State *L) {
  luaL_checkany(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checkany(L, 3);
  if (pack_range(L, 3, lua_gettop(L), 1, 2) < 0) lua_pushnil(L);
  return 1;
}

/* pack_pairs(null, array_mt, head, list) -> string | nil, i
** head and list packed as pack(null, array_mt, head, list) packs them, once
** each item 1..#list is a table whose [1] is a string (a {channel, value}
** pair): else nil and the index of the first that is not. nil, 0: a value
** pack does not take. */
static int l_pack_pairs(lua_State *L) {
  luaL_checkany(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checkany(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  lua_Integer n = luaL_len(L, 4);
  for (lua_Integer i = 1; i <= n; i++) {
    int ok = lua_geti(L, 4, i) == LUA_TTABLE && lua_geti(L, -1, 1) == LUA_TSTRING;
    lua_settop(L, 4);
    if (!ok) {
      lua_pushnil(L);
      lua_pushinteger(L, i);
      return 2;
    }
  }
  if (pack_range(L, 3, 4, 1, 2) == 0) return 1;
  lua_pushnil(L);
  lua_pushinteger(L, 0);
  return 2;
}

/* The function packer() makes: pack(value [, value...]) with its null and
** array marker as upvalues 1 and 2; what it does not take goes to upvalue
** 3, fallback(value [, value...]), whose results it returns. */
static int l_pack_bound(lua_State *L) {
  int top = lua_gettop(L);
  luaL_checkany(L, 1);
  if (pack_range(L, 1, top, lua_upvalueindex(1), lua_upvalueindex(2)) == 0) return 1;
  lua_pushvalue(L, lua_upvalueindex(3));
  lua_insert(L, 1);
  lua_call(L, top, LUA_MULTRET);
  return lua_gettop(L);
}

/* packer(null, array_mt, fallback) -> pack(value [, value...]) */
static int l_packer(lua_State *L) {
  luaL_checkany(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TFUNCTION);
  lua_settop(L, 3);
  lua_pushcclosure(L, l_pack_bound, 3);
  return 1;
}

typedef struct {
  lua_State *L;
  const char *p, *end;
  int null_idx, array_idx;
  int depth;
} unpack_t;

static void bad(unpack_t *u) {
  luaL_error(u->L, "unpack: not a packed value");
}

static void take(unpack_t *u, void *out, size_t n) {
  if ((size_t)(u->end - u->p) < n) bad(u);
  memcpy(out, u->p, n);
  u->p += n;
}

static size_t take_u32(unpack_t *u) {
  uint32_t v;
  take(u, &v, sizeof v);
  return v;
}

static const char *take_bytes(unpack_t *u, size_t *n) {
  *n = take_u32(u);
  if ((size_t)(u->end - u->p) < *n) bad(u);
  const char *s = u->p;
  u->p += *n;
  return s;
}

/* Pushes the next value. */
static void unpack_value(unpack_t *u) {
  lua_State *L = u->L;
  char tag;
  take(u, &tag, 1);
  switch (tag) {
    case 'n': lua_pushvalue(L, u->null_idx); return;
    case 't': lua_pushboolean(L, 1); return;
    case 'f': lua_pushboolean(L, 0); return;
    case 'e': lua_createtable(L, 0, 0); return;
    case 'a':
      lua_createtable(L, 0, 0);
      lua_pushvalue(L, u->array_idx);
      lua_setmetatable(L, -2);
      return;
    case 'i': {
      lua_Integer v;
      take(u, &v, sizeof v);
      lua_pushinteger(L, v);
      return;
    }
    case 'd': {
      lua_Number v;
      take(u, &v, sizeof v);
      lua_pushnumber(L, v);
      return;
    }
    case 's': {
      size_t n;
      const char *s = take_bytes(u, &n);
      lua_pushlstring(L, s, n);
      return;
    }
    case 'l':
    case 'm': {
      size_t n = take_u32(u);
      if (n > (size_t)(u->end - u->p) || u->depth >= MAX_DEPTH || !lua_checkstack(L, 4)) bad(u);
      u->depth++;
      if (tag == 'l') {
        lua_createtable(L, (int)n, 0);
        for (size_t i = 1; i <= n; i++) {
          unpack_value(u);
          lua_rawseti(L, -2, (lua_Integer)i);
        }
      } else {
        lua_createtable(L, 0, (int)n);
        for (size_t i = 0; i < n; i++) {
          size_t kn;
          const char *ks = take_bytes(u, &kn);
          lua_pushlstring(L, ks, kn);
          unpack_value(u);
          lua_rawset(L, -3);
        }
      }
      u->depth--;
      return;
    }
    default:
      bad(u);
  }
}

/* unpack(string, null, array_mt) -> the values packed, in order */
static int l_unpack(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  luaL_checkany(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_settop(L, 3);
  unpack_t u = { L, s, s + n, 2, 3, 0 };
  int count = 0;
  do {
    if (!lua_checkstack(L, 4)) bad(&u);
    unpack_value(&u);
    count++;
  } while (u.p != u.end);
  return count;
}

static const luaL_Reg pack_fns[] = {
  {"pack", l_pack},
  {"packer", l_packer},
  {"pack_pairs", l_pack_pairs},
  {"unpack", l_unpack},
  {NULL, NULL},
};

int mg_open_pack(lua_State *L) {
  luaL_newlib(L, pack_fns);
  return 1;
}
