/*
** codepoints.c — code-point scans of UTF-8 text for hot node paths
** (core.codepoints). UTF-8 is read as Lua's utf8 library reads it by
** default (strict: no overlong forms, no surrogates, nothing above
** U+10FFFF), so a result equals the Lua loop it replaces.
**
**   codepoints.token_estimate(s) -> n
**       nodes/lib/tokens.lua's estimate of a text's LLM tokens
**   codepoints.word_ngrams(s, nmin, nmax, separators) -> { key, ... }
**       the character n-gram keys of nodes/lib/intent_model.lua
**   codepoints.bigram_hits(text, { s, ... }) -> { hits, ... }
**       per string, how many of its code-point bigrams occur in text
**   codepoints.normalize(s, marks) -> normalized | nil
**       valid UTF-8 s with ASCII lower-cased, every run of ASCII
**       punctuation, spacing and code points of `marks` made one space,
**       none at the ends; nil when s is not valid UTF-8
**   codepoints.fold(s, drop) -> folded, n | nil
**       valid UTF-8 s with ASCII lower-cased, then the bytes of `drop`
**       deleted, and the code points left; nil when s is not valid UTF-8
**
** A Lua loop pays a call per character (utf8.codes) or a table of all code
** points (utf8.codepoint), and a rehash each time its result tables grow;
** these scans were most of the CPU of the intent, feedback and summarize
** nodes.
*/
#include "mg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The code point at s[i] (n bytes in all) and its length in *len, or -1
** (and *len = 1) when no valid character starts there. */
static inline int32_t decode(const unsigned char *s, size_t n, size_t i, size_t *len) {
  unsigned c = s[i];
  *len = 1;
  if (c < 0x80) return (int32_t)c;
  size_t count;
  uint32_t res, min;
  if (c >= 0xC0 && c < 0xE0) { count = 1; res = c & 0x1F; min = 0x80; }
  else if (c >= 0xE0 && c < 0xF0) { count = 2; res = c & 0x0F; min = 0x800; }
  else if (c >= 0xF0 && c < 0xF8) { count = 3; res = c & 0x07; min = 0x10000; }
  else return -1;
  if (i + count >= n) return -1;
  for (size_t k = 1; k <= count; k++) {
    unsigned cc = s[i + k];
    if ((cc & 0xC0) != 0x80) return -1;
    res = (res << 6) | (cc & 0x3F);
  }
  if (res < min || res > 0x10FFFF || (res >= 0xD800 && res <= 0xDFFF)) return -1;
  *len = count + 1;
  return (int32_t)res;
}

/* Whether all of s is valid UTF-8 (utf8.len(s) ~= nil). */
static int valid(const unsigned char *s, size_t n) {
  size_t i = 0, len;
  while (i < n) {
    if (s[i] < 0x80) { i++; continue; }
    if (decode(s, n, i, &len) < 0) return 0;
    i += len;
  }
  return 1;
}

#define MAX_SET 64

/* The code points of argument `arg` (s, n bytes) into out[MAX_SET]: how
** many; raises when s is not valid UTF-8 or holds more than MAX_SET. */
static size_t code_point_set(lua_State *L, int arg, const unsigned char *s, size_t n,
                             int32_t *out, const char *what) {
  size_t count = 0;
  for (size_t i = 0, len; i < n; i += len) {
    int32_t c = decode(s, n, i, &len);
    if (c < 0) luaL_argerror(L, arg, lua_pushfstring(L, "%s are not valid UTF-8", what));
    if (count == MAX_SET) luaL_argerror(L, arg, lua_pushfstring(L, "at most %d %s", MAX_SET, what));
    out[count++] = c;
  }
  return count;
}

/* ------------------------------------------------------ token estimate */

/* Hangul, CJK, kana and every other non-ASCII character: 1 token; a run
** of ASCII letters: ceil(length / 4); of digits: ceil(length / 3); ASCII
** punctuation: 1 each; whitespace and control bytes: free. Text that is
** not valid UTF-8: 1 per byte above 127, ceil(k / 4) for the k bytes
** from 33 to 127. */
static int l_token_estimate(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  lua_Integer total = 0;
  if (!valid(s, n)) {
    lua_Integer other = 0;
    for (size_t i = 0; i < n; i++) {
      if (s[i] >= 128) total++;
      else if (s[i] > 32) other++;
    }
    lua_pushinteger(L, total + (other + 3) / 4);
    return 1;
  }
  lua_Integer letters = 0, digits = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned c = s[i];
    if (c >= 128) {
      if (c < 0xC0) continue;            /* inside the character counted */
      total += (letters + 3) / 4 + (digits + 2) / 3 + 1;
      letters = digits = 0;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      total += (digits + 2) / 3;
      digits = 0;
      letters++;
    } else if (c >= '0' && c <= '9') {
      total += (letters + 3) / 4;
      letters = 0;
      digits++;
    } else {
      total += (letters + 3) / 4 + (digits + 2) / 3;
      letters = digits = 0;
      if (c > 32 && c != 127) total++;
    }
  }
  total += (letters + 3) / 4 + (digits + 2) / 3;
  lua_pushinteger(L, total);
  return 1;
}

/* ------------------------------------------------------- bigram hits */

#define NO_KEY UINT64_MAX

/* The code point at s[*i], advancing *i; raises on invalid UTF-8. */
static int32_t next_char(lua_State *L, const unsigned char *s, size_t n, size_t *i, int arg) {
  size_t len;
  int32_t c = decode(s, n, *i, &len);
  if (c < 0) luaL_error(L, "bad argument #%d to 'bigram_hits' (invalid UTF-8 at byte %d)", arg, (int)(*i + 1));
  *i += len;
  return c;
}

static uint64_t *slot_of(uint64_t *set, size_t mask, uint64_t key) {
  size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
  while (set[h] != NO_KEY && set[h] != key) h = (h + 1) & mask;
  return &set[h];
}

/* bigram_hits(text, list) -> counts: for each string of list, how many of
** its neighbouring code-point pairs (position by position) are also a pair
** somewhere in text. Raises on text that is not valid UTF-8. */
static int l_bigram_hits(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_Integer count = luaL_len(L, 2);
  for (lua_Integer k = 1; k <= count; k++) {
    if (lua_rawgeti(L, 2, k) != LUA_TSTRING)
      return luaL_error(L, "bad argument #2 to 'bigram_hits' (item %d is not a string)", (int)k);
    lua_pop(L, 1);
  }
  size_t cap = 16;
  while (cap < n) cap <<= 1;          /* at most n pairs: load <= 1/2 */
  cap <<= 1;
  uint64_t *set = lua_newuserdatauv(L, cap * sizeof *set, 0);
  memset(set, 0xFF, cap * sizeof *set);
  size_t i = 0;
  int64_t prev = -1;
  while (i < n) {
    int32_t c = next_char(L, s, n, &i, 1);
    if (prev >= 0) {
      uint64_t key = ((uint64_t)prev << 21) | (uint64_t)c;
      *slot_of(set, cap - 1, key) = key;
    }
    prev = c;
  }
  lua_createtable(L, count > 0 ? (int)count : 0, 0);
  for (lua_Integer k = 1; k <= count; k++) {
    size_t m;
    lua_rawgeti(L, 2, k);
    const unsigned char *t = (const unsigned char *)lua_tolstring(L, -1, &m);
    lua_Integer hits = 0;
    size_t j = 0;
    prev = -1;
    while (j < m) {
      int32_t c = next_char(L, t, m, &j, 2);
      if (prev >= 0) {
        uint64_t key = ((uint64_t)prev << 21) | (uint64_t)c;
        if (*slot_of(set, cap - 1, key) == key) hits++;
      }
      prev = c;
    }
    lua_pop(L, 1);
    lua_pushinteger(L, hits);
    lua_rawseti(L, -2, k);
  }
  return 1;
}

/* -------------------------------------------------------------- fold */

/* One pass: each character checked as it is copied (a dropped byte is
** ASCII, so a multi-byte character goes whole); text found invalid on the
** way leaves the buffer unused. */
static int l_fold(lua_State *L) {
  size_t n, m;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  const unsigned char *drop = (const unsigned char *)luaL_checklstring(L, 2, &m);
  for (size_t i = 0; i < m; i++)
    luaL_argcheck(L, drop[i] < 0x80, 2, "bytes to drop must be ASCII");
  unsigned char out_of[128];
  memset(out_of, 0, sizeof out_of);
  for (size_t i = 0; i < m; i++) out_of[drop[i]] = 1;
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, n);
  size_t k = 0;
  lua_Integer chars = 0;
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    if (c < 0x80) {
      if (c >= 'A' && c <= 'Z') c += 32;   /* lower-cased first: a dropped letter goes in either case */
      i++;
      if (out_of[c]) continue;
      out[k++] = (char)c;
    } else {
      size_t len;
      if (decode(s, n, i, &len) < 0) {
        luaL_pushfail(L);
        return 1;
      }
      memcpy(out + k, s + i, len);
      k += len;
      i += len;
    }
    chars++;
  }
  luaL_pushresultsize(&b, k);
  lua_pushinteger(L, chars);
  return 2;
}

/* --------------------------------------------------------- normalize */

/* ASCII punctuation and spacing as Lua's %p and %s read them (C locale). */
static int punct_or_space(unsigned c) {
  return (c >= 9 && c <= 13) || c == 32 || (c >= 33 && c <= 47) || (c >= 58 && c <= 64) ||
         (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

static int l_normalize(lua_State *L) {
  size_t n, m;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  const unsigned char *marks = (const unsigned char *)luaL_checklstring(L, 2, &m);
  int32_t mark[MAX_SET];
  size_t nmarks = code_point_set(L, 2, marks, m, mark, "marks");
  if (!valid(s, n)) {
    luaL_pushfail(L);
    return 1;
  }
  luaL_Buffer b;
  char *out = luaL_buffinitsize(L, &b, n);
  size_t k = 0;
  int gap = 0;                    /* a run to stand for by one space */
  for (size_t i = 0, len; i < n; i += len) {
    int32_t c = decode(s, n, i, &len);
    int space = c < 128 ? punct_or_space((unsigned)c) : 0;
    for (size_t j = 0; !space && c >= 128 && j < nmarks; j++) space = mark[j] == c;
    if (space) {
      gap = 1;
      continue;
    }
    if (gap && k > 0) out[k++] = ' ';
    gap = 0;
    if (c >= 'A' && c <= 'Z') c += 32;
    memcpy(out + k, s + i, len);
    if (len == 1) out[k] = (char)c;
    k += len;
  }
  luaL_pushresultsize(&b, k);
  return 1;
}

/* ------------------------------------------------------- word n-grams */

#define SHIFT 2097152             /* 2^21: room for any code point */
#define WORD_BEGIN 1
#define WORD_END 2

typedef struct {
  uint64_t *set;                  /* keys + 1 (0 = free), open addressing */
  size_t mask;
  lua_Integer *list;              /* keys in order of first occurrence */
  size_t count;
  int nmin, nmax;
} ngrams;

static void add_key(ngrams *g, lua_Integer key) {
  uint64_t k = (uint64_t)key + 1;
  size_t h = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & g->mask;
  while (g->set[h]) {
    if (g->set[h] == k) return;
    h = (h + 1) & g->mask;
  }
  g->set[h] = k;
  g->list[g->count++] = key;
}

/* The n-grams of one word w[1..n], w[0] and w[n + 1] its boundary marks. */
static void add_word(ngrams *g, int32_t *w, size_t n) {
  w[0] = WORD_BEGIN;
  w[n + 1] = WORD_END;
  for (size_t i = 0; i <= n + 1; i++) {
    lua_Integer a = w[i];
    if (g->nmin <= 1 && i >= 1 && i <= n) add_key(g, a);
    if (i <= n) {
      lua_Integer f = a * SHIFT + w[i + 1];
      if (g->nmin <= 2 && g->nmax >= 2) add_key(g, f);
      if (g->nmax >= 3 && i < n) add_key(g, f * SHIFT + w[i + 2]);
    }
  }
}

static int is_separator(int32_t c, const int32_t *extra, size_t nextra) {
  if (c < 128)
    return !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'));
  for (size_t k = 0; k < nextra; k++)
    if (extra[k] == c) return 1;
  return 0;
}

/* word_ngrams(s, nmin, nmax, separators) -> keys: words are the runs of
** code points between separators (ASCII other than letters and digits,
** the code points of the string `separators`, and every byte that does
** not start a valid character); ASCII letters are lower-cased. Each word,
** between the marks 1 (begin) and 2 (end), gives its 1-grams (nmin <= 1),
** 2-grams with the marks (nmin <= 2 <= nmax) and 3-grams with the marks
** (nmax >= 3), an n-gram being the integer c1 * 2^21 + c2 (* 2^21 + c3).
** Keys are listed once, in order of first occurrence. */
static int l_word_ngrams(lua_State *L) {
  size_t n, m;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  lua_Integer nmin = luaL_checkinteger(L, 2);
  lua_Integer nmax = luaL_checkinteger(L, 3);
  const unsigned char *sep = (const unsigned char *)luaL_checklstring(L, 4, &m);
  luaL_argcheck(L, nmin >= 1 && nmin <= 3, 2, "n-gram sizes are 1 to 3");
  luaL_argcheck(L, nmax >= nmin && nmax <= 3, 3, "n-gram sizes are 1 to 3");
  if (n > ((size_t)1 << 28)) return luaL_argerror(L, 1, "text too long");
  int32_t extra[MAX_SET];
  size_t nextra = code_point_set(L, 4, sep, m, extra, "separators");
  /* a word of k characters has at most 3k + 1 n-grams */
  size_t most = 3 * n + n / 2 + 2, cap = 16;
  while (cap < 2 * most) cap <<= 1;
  size_t bytes = cap * sizeof(uint64_t) + most * sizeof(lua_Integer) + (n + 2) * sizeof(int32_t);
  char *mem = lua_newuserdatauv(L, bytes, 0);
  ngrams g = { (uint64_t *)mem, cap - 1, (lua_Integer *)(mem + cap * sizeof(uint64_t)), 0,
               (int)nmin, (int)nmax };
  int32_t *w = (int32_t *)(mem + cap * sizeof(uint64_t) + most * sizeof(lua_Integer));
  memset(g.set, 0, cap * sizeof(uint64_t));
  size_t k = 0;                   /* characters in the open word */
  for (size_t i = 0, len; i < n; i += len) {
    int32_t c = decode(s, n, i, &len);
    if (c < 0 || is_separator(c, extra, nextra)) {
      if (k) add_word(&g, w, k);
      k = 0;
      continue;
    }
    if (c >= 'A' && c <= 'Z') c += 32;
    w[++k] = c;
  }
  if (k) add_word(&g, w, k);
  lua_createtable(L, (int)g.count, 0);
  for (size_t i = 0; i < g.count; i++) {
    lua_pushinteger(L, g.list[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

int mg_open_codepoints(lua_State *L) {
  const luaL_Reg funcs[] = {
    {"token_estimate", l_token_estimate},
    {"bigram_hits", l_bigram_hits},
    {"word_ngrams", l_word_ngrams},
    {"fold", l_fold},
    {"normalize", l_normalize},
    {NULL, NULL},
  };
  luaL_newlib(L, funcs);
  return 1;
}
