/*
** lazylib.h — shared libraries opened on first use.
**
** Linking libcurl and libpq pulls in some thirty more libraries (TLS, LDAP,
** Kerberos, SSH, IDN...) whose loading and relocation cost about 5 ms at
** every start: most of a short command's time, for commands that make no
** HTTP request and open no Postgres connection. Their functions are reached
** through tables (curl_api.h, pq_api.h) that are filled the first time a
** component needs them.
*/
#ifndef MG_LAZYLIB_H
#define MG_LAZYLIB_H

#include <stddef.h>

/* dlopen(soname); NULL and why not (in err) when it cannot be opened. */
void *mg_lazylib_open(const char *soname, char *err, size_t errlen);

/* dlsym(handle, name); NULL and why not (in err) when it is missing. */
void *mg_lazylib_sym(void *handle, const char *soname, const char *name,
                     char *err, size_t errlen);

#endif
