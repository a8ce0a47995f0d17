/*
** alloc.c — the Lua state's allocator: free lists for small blocks.
**
** Most of what a run allocates is small and short-lived: strings, tables,
** closures, coroutine frames, each freed at the next GC cycle. glibc serves
** them well enough one by one, but a worker moving thousands of them per job
** keeps falling past its per-thread cache into the general bins (and their
** consolidation). Lua always tells the allocator the size of a block it
** frees or resizes, so blocks need no header: each size class (multiples of
** ALIGN up to SMALL_MAX bytes) keeps a list of free blocks, carved from
** SLAB-byte slabs. Larger blocks go to malloc.
**
** Freed small blocks stay on their lists for reuse; the slabs go back to the
** system when the state is closed. Under AddressSanitizer every block goes
** to malloc, so use-after-free and overflows are still caught.
*/
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define MG_POOL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MG_POOL 0
#endif
#endif
#ifndef MG_POOL
#define MG_POOL 1
#endif

#define ALIGN 16
#define SMALL_MAX 512
#define NCLASS (SMALL_MAX / ALIGN)
#define SLAB (64 * 1024)

typedef struct freeblock { struct freeblock *next; } freeblock;

typedef struct slab { struct slab *next; } slab;

struct mg_alloc {
  freeblock *free[NCLASS];
  char *cur, *end;            /* the slab being carved */
  slab *slabs;
};

static size_t class_of(size_t n) { return (n - 1) / ALIGN; }

static void *small_alloc(mg_alloc *a, size_t c) {
  freeblock *b = a->free[c];
  if (b) {
    freeblock *next = b->next;
    a->free[c] = next;
    /* the next block of this class was freed long ago, its line cold:
    ** fetched now, it is in cache when the next allocation takes it */
    if (next) __builtin_prefetch(next, 1);
    return b;
  }
  size_t size = (c + 1) * ALIGN;
  if ((size_t)(a->end - a->cur) < size) {
    /* the rest of the old slab (less than one block of this class) is
    ** left unused; a slab's first ALIGN bytes link it to the others */
    slab *s = malloc(SLAB);
    if (!s) return NULL;
    s->next = a->slabs;
    a->slabs = s;
    a->cur = (char *)s + ALIGN;
    a->end = (char *)s + SLAB;
  }
  void *p = a->cur;
  a->cur += size;
  return p;
}

static void small_free(mg_alloc *a, void *p, size_t c) {
  freeblock *b = p;
  b->next = a->free[c];
  a->free[c] = b;
}

void *mg_alloc_f(void *ud, void *ptr, size_t osize, size_t nsize) {
  mg_alloc *a = ud;
  if (!MG_POOL) {
    if (nsize == 0) { free(ptr); return NULL; }
    return realloc(ptr, nsize);
  }
  /* with ptr NULL, osize names the kind of object, not a size */
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    if (old > SMALL_MAX) free(ptr);
    else if (ptr) small_free(a, ptr, class_of(old));
    return NULL;
  }
  if (nsize > SMALL_MAX) {
    if (old > SMALL_MAX) return realloc(ptr, nsize);
    void *p = malloc(nsize);
    if (p && ptr) {
      memcpy(p, ptr, old);
      small_free(a, ptr, class_of(old));
    }
    return p;
  }
  size_t c = class_of(nsize);
  if (ptr && old <= SMALL_MAX && class_of(old) == c) return ptr;
  void *p = small_alloc(a, c);
  if (!p) return NULL;          /* Lua keeps the old block on failure */
  if (ptr) {
    memcpy(p, ptr, old < nsize ? old : nsize);
    if (old > SMALL_MAX) free(ptr);
    else small_free(a, ptr, class_of(old));
  }
  return p;
}

mg_alloc *mg_alloc_new(void) {
  return calloc(1, sizeof(mg_alloc));
}

void mg_alloc_free(mg_alloc *a) {
  if (!a) return;
  for (slab *s = a->slabs, *next; s; s = next) {
    next = s->next;
    free(s);
  }
  free(a);
}
