/*
** sentences.c — the sentences of a text's lines, in one pass (core.sentences).
**
**   sentences.split(text [, skip]) -> { sentence, ... }
**
** Lines end at "\n". A line is left out when it is blank or when its first
** byte that is not a space begins one of the strings of the list `skip`.
** Before the first sentence of a line go its leading spaces, then one
** bullet byte ("-", "*" or a byte of "•") and the spaces after it, then a
** number ("1." or "1)") and the spaces after it. A sentence ends after a
** run of marks (".", "!" or "?") that spaces follow, keeping the run's
** first mark; the spaces are not part of the next one. Marks inside a word
** ("1.5km") stay. Spaces are the bytes of Lua's %s: "\t\n\v\f\r ".
**
** The Lua equivalent (find and sub per mark and per line) made the split
** the largest part of scoring an answer.
*/
#include "mg.h"

#include <string.h>

static int is_space(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

static int is_mark(unsigned char c) {
  return c == '.' || c == '!' || c == '?';
}

static int is_bullet(unsigned char c) {
  /* "•" is E2 80 A2: like the pattern class [%-%*•], any one of its bytes */
  return c == '-' || c == '*' || c == 0xE2 || c == 0x80 || c == 0xA2;
}

/* Whether s[at..end) begins with one of the strings of the list at index
** `skip` (0: no list). */
static int skipped(lua_State *L, int skip, const char *s, size_t at, size_t end) {
  if (!skip) return 0;
  lua_Integer count = (lua_Integer)lua_rawlen(L, skip);
  for (lua_Integer k = 1; k <= count; k++) {
    size_t m;
    lua_rawgeti(L, skip, k);
    const char *p = lua_tolstring(L, -1, &m);
    lua_pop(L, 1);            /* still referenced by the list */
    if (m <= end - at && memcmp(s + at, p, m) == 0) return 1;
  }
  return 0;
}

static void add(lua_State *L, lua_Integer *n, const char *s, size_t len) {
  lua_pushlstring(L, s, len);
  lua_rawseti(L, -2, ++*n);
}

/* The sentences of s[from..end) (a line without its "\n"). */
static void split_line(lua_State *L, lua_Integer *n, const unsigned char *s,
                       size_t from, size_t end) {
  size_t at = from;
  while (at < end) {
    if (!is_mark(s[at])) {
      at++;
      continue;
    }
    size_t m = at, e = at;
    while (e < end && is_mark(s[e])) e++;
    if (e < end && is_space(s[e])) {
      add(L, n, (const char *)s + from, m + 1 - from);
      while (e < end && is_space(s[e])) e++;
      from = e;
    }
    at = e;
  }
  if (from < end) add(L, n, (const char *)s + from, end - from);
}

static int l_split(lua_State *L) {
  size_t size;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &size);
  int skip = 0;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    skip = 2;
    lua_Integer count = (lua_Integer)lua_rawlen(L, 2);
    for (lua_Integer k = 1; k <= count; k++) {
      if (lua_rawgeti(L, 2, k) != LUA_TSTRING)
        return luaL_error(L, "bad argument #2 to 'split' (item %d is not a string)", (int)k);
      lua_pop(L, 1);
    }
  }
  lua_newtable(L);
  lua_Integer n = 0;
  size_t pos = 0;
  while (pos <= size) {
    const unsigned char *nl = memchr(s + pos, '\n', size - pos);
    size_t end = nl ? (size_t)(nl - s) : size;
    size_t at = pos;
    while (at < end && is_space(s[at])) at++;
    if (at < end && !skipped(L, skip, (const char *)s, at, end)) {
      if (is_bullet(s[at])) {
        at++;
        while (at < end && is_space(s[at])) at++;
      }
      size_t d = at;
      while (d < end && s[d] >= '0' && s[d] <= '9') d++;
      if (d > at && d < end && (s[d] == '.' || s[d] == ')')) {
        at = d + 1;
        while (at < end && is_space(s[at])) at++;
      }
      split_line(L, &n, s, at, end);
    }
    pos = end + 1;
  }
  return 1;
}

int mg_open_sentences(lua_State *L) {
  const luaL_Reg funcs[] = {
    {"split", l_split},
    {NULL, NULL},
  };
  luaL_newlib(L, funcs);
  return 1;
}
