/* alloc.h — the Lua state's allocator (alloc.c). */
#ifndef MG_ALLOC_H
#define MG_ALLOC_H

#include <stddef.h>

typedef struct mg_alloc mg_alloc;

mg_alloc *mg_alloc_new(void);
/* A lua_Alloc: lua_newstate(mg_alloc_f, a). */
void *mg_alloc_f(void *ud, void *ptr, size_t osize, size_t nsize);
/* After lua_close: give the slabs back. */
void mg_alloc_free(mg_alloc *a);

#endif
