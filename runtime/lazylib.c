/*
** lazylib.c — dlopen and dlsym with the reason for a failure kept.
*/
#include "lazylib.h"

#include <dlfcn.h>
#include <stdio.h>

void *mg_lazylib_open(const char *soname, char *err, size_t errlen) {
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    snprintf(err, errlen, "cannot load %s (%s)", soname, why ? why : "unknown error");
  }
  return h;
}

void *mg_lazylib_sym(void *handle, const char *soname, const char *name,
                     char *err, size_t errlen) {
  dlerror();
  void *p = dlsym(handle, name);
  if (!p) snprintf(err, errlen, "%s has no %s (too old a version?)", soname, name);
  return p;
}
