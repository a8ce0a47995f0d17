/*
** tls.h — TLS for server connections: OpenSSL driven through memory BIOs,
** so the connection code keeps its sockets and its loop and only passes
** bytes through (tls.c).
**
**   ciphertext from the socket  -> mg_tls_feed, then mg_tls_read until it
**                                  returns 0 (plaintext for the parser; the
**                                  handshake advances on the way)
**   plaintext to send           -> mg_tls_write
**   after either                -> mg_tls_pull until 0, and send those bytes
**
** The server offers ALPN "http/1.1" only.
*/
#ifndef MG_TLS_H
#define MG_TLS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct mg_tls_ctx mg_tls_ctx;
typedef struct mg_tls_conn mg_tls_conn;

/* Load a PEM certificate (chain) and key; NULL with a message in err. */
mg_tls_ctx *mg_tls_ctx_new(const char *cert, const char *key, char *err, size_t errlen);
void mg_tls_ctx_free(mg_tls_ctx *ctx);

mg_tls_conn *mg_tls_conn_new(mg_tls_ctx *ctx);
void mg_tls_conn_free(mg_tls_conn *t);
/* 0, or -1 when the bytes cannot be taken. */
int mg_tls_feed(mg_tls_conn *t, const char *data, size_t n);
/* Plaintext bytes (> 0), 0 when none are ready, -1 on a TLS error or when
** the peer closed the session. */
ssize_t mg_tls_read(mg_tls_conn *t, char *out, size_t cap);
/* 0, or -1 on a TLS error. */
int mg_tls_write(mg_tls_conn *t, const char *data, size_t n);
/* Ciphertext waiting to be sent: copies up to cap bytes, returns how many. */
size_t mg_tls_pull(mg_tls_conn *t, char *out, size_t cap);
/* Queue a close_notify alert (then pull and send it). */
void mg_tls_close_notify(mg_tls_conn *t);

#endif
