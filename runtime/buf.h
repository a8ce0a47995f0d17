/*
** buf.h — a byte buffer that starts in storage its owner provides (on the
** stack, inside a struct) and moves to the heap only when it outgrows it:
** pack.c's packed strings and redis.c's protocol commands.
*/
#ifndef MG_BUF_H
#define MG_BUF_H

#include <stdlib.h>
#include <string.h>

/* Room for `more` bytes after the `len` held at *p (capacity *cap; the
** buffer began as `first`): 0, or -1 (out of memory, *p unchanged). */
static inline int mg_buf_room(char **p, size_t *cap, size_t len, char *first, size_t more) {
  if (*cap - len >= more) return 0;
  size_t c = *cap * 2;
  while (c - len < more) c *= 2;
  char *n = *p == first ? malloc(c) : realloc(*p, c);
  if (!n) return -1;
  if (*p == first) memcpy(n, first, len);
  *p = n;
  *cap = c;
  return 0;
}

/* Free what mg_buf_room took from the heap. */
static inline void mg_buf_free(char *p, const char *first) {
  if (p != first) free(p);
}

#endif
