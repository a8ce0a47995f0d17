/*
** walk.h — what json.c and pack.c check before walking into a Lua table:
** that it is not one of the tables they are inside (a cycle), that the
** nesting limit is not reached, that the stack has room, and that it has
** no metatable but the array marker (another could change pairs or #).
*/
#ifndef MG_WALK_H
#define MG_WALK_H

#include "mg.h"

/* The table at idx (absolute), reached inside the `depth` tables of
** `path`: its pointer (to put on path), or NULL when it is not walked.
** *is_array: whether its metatable is the array marker at array_idx. */
static inline const void *mg_walk_enter(lua_State *L, int idx, const void *const *path,
                                        int depth, int max_depth, int slots, int array_idx,
                                        int *is_array) {
  const void *me = lua_topointer(L, idx);
  for (int i = 0; i < depth; i++)
    if (path[i] == me) return NULL;
  if (depth >= max_depth || !lua_checkstack(L, slots)) return NULL;
  *is_array = 0;
  if (lua_getmetatable(L, idx)) {
    *is_array = lua_rawequal(L, -1, array_idx);
    lua_pop(L, 1);
    if (!*is_array) return NULL;
  }
  return me;
}

#endif
