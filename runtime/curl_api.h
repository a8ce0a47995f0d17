/*
** curl_api.h — libcurl, opened on first use (lazylib.h says why).
**
** Include this instead of <curl/curl.h>: the curl_* functions below become
** calls through the table `mg_curl`, which mg_curl_load() fills. Call it
** before the first of them; it is cheap once loaded.
*/
#ifndef MG_CURL_API_H
#define MG_CURL_API_H

#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>
/* curl.h wraps these in macros named after them (to check the arguments) */
#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_multi_setopt

#define MG_CURL_FUNCS(X) \
  X(curl_global_init) X(curl_free) X(curl_easy_init) X(curl_easy_cleanup) \
  X(curl_easy_reset) X(curl_easy_setopt) X(curl_easy_getinfo) \
  X(curl_easy_pause) X(curl_easy_strerror) X(curl_multi_init) \
  X(curl_multi_add_handle) X(curl_multi_remove_handle) X(curl_multi_assign) \
  X(curl_multi_info_read) X(curl_multi_setopt) X(curl_multi_socket_action) \
  X(curl_multi_strerror) X(curl_slist_append) X(curl_slist_free_all) \
  X(curl_url) X(curl_url_cleanup) X(curl_url_get) X(curl_url_set)

struct mg_curl_api {
#define MG_CURL_SLOT(f) __typeof__(f) *f;
  MG_CURL_FUNCS(MG_CURL_SLOT)
#undef MG_CURL_SLOT
};
extern struct mg_curl_api mg_curl;

/* NULL once libcurl is loaded, else why it cannot be. */
const char *mg_curl_load(void);

#ifndef MG_CURL_API_IMPL
#define curl_global_init mg_curl.curl_global_init
#define curl_free mg_curl.curl_free
#define curl_easy_init mg_curl.curl_easy_init
#define curl_easy_cleanup mg_curl.curl_easy_cleanup
#define curl_easy_reset mg_curl.curl_easy_reset
#define curl_easy_setopt mg_curl.curl_easy_setopt
#define curl_easy_getinfo mg_curl.curl_easy_getinfo
#define curl_easy_pause mg_curl.curl_easy_pause
#define curl_easy_strerror mg_curl.curl_easy_strerror
#define curl_multi_init mg_curl.curl_multi_init
#define curl_multi_add_handle mg_curl.curl_multi_add_handle
#define curl_multi_remove_handle mg_curl.curl_multi_remove_handle
#define curl_multi_assign mg_curl.curl_multi_assign
#define curl_multi_info_read mg_curl.curl_multi_info_read
#define curl_multi_setopt mg_curl.curl_multi_setopt
#define curl_multi_socket_action mg_curl.curl_multi_socket_action
#define curl_multi_strerror mg_curl.curl_multi_strerror
#define curl_slist_append mg_curl.curl_slist_append
#define curl_slist_free_all mg_curl.curl_slist_free_all
#define curl_url mg_curl.curl_url
#define curl_url_cleanup mg_curl.curl_url_cleanup
#define curl_url_get mg_curl.curl_url_get
#define curl_url_set mg_curl.curl_url_set
#endif

#endif
