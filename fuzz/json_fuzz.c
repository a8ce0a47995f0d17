/*
** json_fuzz.c — libFuzzer harness for the C JSON encoder (runtime/json.c)
** against the Lua encoder it replaces (runtime/lua/moongraph/json.lua).
**
** The input is a little program that builds one Lua value: each byte picks
** what comes next (a string of the following bytes, an integer or a float
** from the following 8 bytes, true/false, null, a list or an object of the
** following values, an array-marked table, a hole, a key that cannot be
** saved, a reference back to an enclosing table). The value is then
** encoded both ways, compact and indented, and:
**
**   - when the Lua encoder writes it, C must write exactly the same bytes;
**   - when the Lua encoder refuses it, C must refuse it too (return nil).
**
** The rest of the input builds a second value, copied with the first's copy
** as the earlier one to reuse from (core.json.copy's prev): the result must
** be what copying it alone gives, holding prev's own table wherever it equals
** prev's part at the same place, and none of prev's tables elsewhere. And
** core.json.copy_state, on a state holding both values, must give what copy
** gives, keeping the part of a key not written since without a walk.
**
** Any difference aborts, which libFuzzer reports with the input. Run from
** the repository root (the harness loads runtime/lua/moongraph/json.lua).
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_harness.h"

static lua_State *L;

typedef struct {
  const uint8_t *p;
  size_t n, i;
} rd_t;

static int byte(rd_t *r) { return r->i < r->n ? r->p[r->i++] : -1; }

static uint64_t u64(rd_t *r) {
  uint64_t v = 0;
  for (int k = 0; k < 8; k++) { int b = byte(r); v = (v << 8) | (uint64_t)(b < 0 ? 0 : b); }
  return v;
}

/* Push one value built from the input; `depth` bounds nesting. */
static void build(rd_t *r, int depth, int parent) {
  int op = byte(r);
  if (op < 0) { lua_pushinteger(L, 0); return; }
  switch (op % 12) {
    case 0: case 1: {                       /* string of the next n bytes */
      int n = byte(r); if (n < 0) n = 0; n %= 24;
      if ((size_t)n > r->n - r->i) n = (int)(r->n - r->i);
      lua_pushlstring(L, (const char *)r->p + r->i, (size_t)n);
      r->i += (size_t)n;
      return;
    }
    case 2: lua_pushinteger(L, (lua_Integer)u64(r)); return;
    case 3: { uint64_t v = u64(r); double d; memcpy(&d, &v, sizeof d); lua_pushnumber(L, d); return; }
    case 4: lua_pushboolean(L, op & 16); return;
    case 5: lua_getglobal(L, "NULL"); return;
    case 6: lua_getglobal(L, "EMPTY_ARRAY"); lua_call(L, 0, 1); return;
    case 7: case 8: {                        /* a list, possibly with a hole */
      lua_newtable(L);
      if (depth <= 0) return;
      int t = lua_gettop(L), n = byte(r); if (n < 0) n = 0; n %= 6;
      for (int i = 1; i <= n; i++) {
        build(r, depth - 1, t);
        if (op % 12 == 8 && i == 2 && (op & 32)) { lua_pop(L, 1); continue; }   /* hole */
        lua_rawseti(L, t, i);
      }
      return;
    }
    case 9: case 10: {                       /* an object; sometimes a bad key */
      lua_newtable(L);
      if (depth <= 0) return;
      int t = lua_gettop(L), n = byte(r); if (n < 0) n = 0; n %= 6;
      for (int i = 0; i < n; i++) {
        int kb = byte(r); if (kb < 0) kb = 0;
        if (op % 12 == 10 && (kb & 64)) lua_pushnumber(L, 0.5 + kb);   /* a key JSON cannot have */
        else if (kb & 128) lua_pushinteger(L, 1);                        /* mixes with string keys */
        else { char k[3] = { (char)kb, (char)(kb * 7), 0 }; lua_pushlstring(L, k, (size_t)(kb % 3)); }
        build(r, depth - 1, t);
        lua_rawset(L, t);
      }
      return;
    }
    default:                                  /* the enclosing table: a cycle */
      if (parent) lua_pushvalue(L, parent); else lua_pushliteral(L, "x");
      return;
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc; (void)argv;
  L = json_harness_state();
  if (luaL_dostring(L,
        "local json = require 'moongraph.json'\n"
        "NULL = json.null\n"
        "EMPTY_ARRAY = function() return json.array() end\n"
        "ARRAY_MT = getmetatable(json.array())\n"
        "C_ENCODE = require('moongraph.core').json.encode\n"
        "LUA_ENCODE = json.lua_encode\n"
        "local C_COPY = require('moongraph.core').json.copy\n"
        "-- where the copy equals prev's part at the same place it is that\n"
        "-- table of prev, and elsewhere it is none of prev's\n"
        "local function is_table(x) return type(x) == 'table' and not rawequal(x, NULL) end\n"
        "local function REUSE_OK(r, p, a)\n"
        "  if not is_table(a) then return true end\n"
        "  if is_table(p) and SAME(a, p) then return rawequal(r, p) end\n"
        "  if rawequal(r, p) then return false end\n"
        "  for k, x in pairs(a) do\n"
        "    if not REUSE_OK(r[k], is_table(p) and p[k] or nil, x) then return false end\n"
        "  end\n"
        "  return true\n"
        "end\n"
        "-- copy(v2, prev = copy(v1)) is what copy(v2) alone gives\n"
        "COPY_CHECK = function(v1, v2)\n"
        "  local ok1, prev = C_COPY(v1, NULL, ARRAY_MT)\n"
        "  local ok2, alone = C_COPY(v2, NULL, ARRAY_MT)\n"
        "  local ok3, reused = C_COPY(v2, NULL, ARRAY_MT, ok1 and prev or nil)\n"
        "  if ok2 ~= ok3 then return false end\n"
        "  if not ok2 then return true end\n"
        "  return SAME(alone, reused) and (not ok1 or REUSE_OK(reused, prev, alone))\n"
        "end\n"
        "-- copy_state: a state whose key a holds v1, then v2 (written), and\n"
        "-- whose key b holds v2 throughout (kept, not walked again)\n"
        "local C_COPY_STATE = require('moongraph.core').json.copy_state\n"
        "STATE_CHECK = function(v1, v2)\n"
        "  local src, w = {}, {}\n"
        "  local ok1, c1 = C_COPY_STATE({ a = v1, b = v2 }, NULL, ARRAY_MT, nil, src, w)\n"
        "  local okc, alone = C_COPY({ a = v1, b = v2 }, NULL, ARRAY_MT)\n"
        "  if ok1 ~= okc then return false end\n"
        "  if not ok1 then return true end\n"
        "  if not SAME(alone, c1) then return false end\n"
        "  w.a = true\n"
        "  local ok2, c2 = C_COPY_STATE({ a = v2, b = v2 }, NULL, ARRAY_MT, c1, src, w)\n"
        "  local _, alone2 = C_COPY({ a = v2, b = v2 }, NULL, ARRAY_MT)\n"
        "  return ok2 and SAME(alone2, c2) and rawequal(c2.b, c1.b) and next(w) == nil\n"
        "    and rawequal(src.a, v2) and rawequal(src.b, v2)\n"
        "end\n") != LUA_OK) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
    abort();
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  rd_t r = { data, size, 0 };
  int top = lua_gettop(L);
  build(&r, 5, 0);
  int v = lua_gettop(L);
  for (int indent = 0; indent <= 1; indent++) {
    lua_getglobal(L, "LUA_ENCODE");
    lua_pushvalue(L, v);
    lua_createtable(L, 0, 1);
    lua_pushboolean(L, indent);
    lua_setfield(L, -2, "indent");
    if (lua_pcall(L, 2, 1, 0) != LUA_OK) abort();
    lua_getglobal(L, "C_ENCODE");
    lua_pushvalue(L, v);
    lua_getglobal(L, "NULL");
    lua_getglobal(L, "ARRAY_MT");
    lua_pushboolean(L, indent);
    lua_call(L, 4, 1);
    size_t ln, cn;
    const char *ls = lua_tolstring(L, -2, &ln), *cs = lua_tolstring(L, -1, &cn);
    if (ls == NULL && cs != NULL) { fprintf(stderr, "C wrote what Lua refuses: %s\n", cs); abort(); }
    if (ls != NULL && (cs == NULL || ln != cn || memcmp(ls, cs, ln) != 0)) {
      fprintf(stderr, "differ:\n Lua %.*s\n C   %s\n", (int)ln, ls, cs ? cs : "(nil)");
      abort();
    }
    lua_pop(L, 2);
  }
  /* the rest of the input builds a second value: copy it reusing the first's copy */
  build(&r, 5, 0);
  int v2 = lua_gettop(L);
  lua_getglobal(L, "COPY_CHECK");
  lua_pushvalue(L, v);
  lua_pushvalue(L, v2);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK || !lua_toboolean(L, -1)) {
    fprintf(stderr, "copy with an earlier copy differs from a copy alone\n");
    abort();
  }
  lua_getglobal(L, "STATE_CHECK");
  lua_pushvalue(L, v);
  lua_pushvalue(L, v2);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK || !lua_toboolean(L, -1)) {
    fprintf(stderr, "copy_state differs from copy\n");
    abort();
  }
  lua_settop(L, top);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
