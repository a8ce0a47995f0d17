/*
** tls.c — TLS for server connections (see tls.h): one SSL_CTX per server,
** one SSL per connection with a memory BIO on each side. No socket, no
** loop: the connection code moves the bytes.
*/
#include "tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

struct mg_tls_ctx {
  SSL_CTX *ssl;
};

struct mg_tls_conn {
  SSL *ssl;
  BIO *in, *out;    /* owned by ssl */
};

static void last_error(char *err, size_t errlen, const char *what, const char *path) {
  unsigned long e = ERR_get_error();
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  snprintf(err, errlen, "tls: %s '%s': %s", what, path, e ? buf : "failed");
  ERR_clear_error();
}

static int select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg) {
  (void)ssl;
  (void)arg;
  static const unsigned char h11[] = "\x08http/1.1";
  unsigned char *sel;
  if (SSL_select_next_proto(&sel, outlen, h11, sizeof h11 - 1, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_NOACK;
  *out = sel;
  return SSL_TLSEXT_ERR_OK;
}

mg_tls_ctx *mg_tls_ctx_new(const char *cert, const char *key, char *err, size_t errlen) {
  if (!cert || !key) {
    snprintf(err, errlen, "tls: both cert and key files are needed");
    return NULL;
  }
  mg_tls_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    snprintf(err, errlen, "tls: out of memory");
    return NULL;
  }
  ctx->ssl = SSL_CTX_new(TLS_server_method());
  if (!ctx->ssl) {
    last_error(err, errlen, "context", "-");
    free(ctx);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx->ssl, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx->ssl, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_mode(ctx->ssl, SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_use_certificate_chain_file(ctx->ssl, cert) != 1) {
    last_error(err, errlen, "cannot use certificate", cert);
    goto fail;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx->ssl, key, SSL_FILETYPE_PEM) != 1) {
    last_error(err, errlen, "cannot use key", key);
    goto fail;
  }
  if (SSL_CTX_check_private_key(ctx->ssl) != 1) {
    last_error(err, errlen, "key does not match certificate", cert);
    goto fail;
  }
  SSL_CTX_set_alpn_select_cb(ctx->ssl, select_alpn, NULL);
  return ctx;
fail:
  SSL_CTX_free(ctx->ssl);
  free(ctx);
  return NULL;
}

void mg_tls_ctx_free(mg_tls_ctx *ctx) {
  if (!ctx) return;
  SSL_CTX_free(ctx->ssl);
  free(ctx);
}

mg_tls_conn *mg_tls_conn_new(mg_tls_ctx *ctx) {
  mg_tls_conn *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ssl = SSL_new(ctx->ssl);
  t->in = BIO_new(BIO_s_mem());
  t->out = BIO_new(BIO_s_mem());
  if (!t->ssl || !t->in || !t->out) {
    if (t->ssl) SSL_free(t->ssl);
    if (t->in) BIO_free(t->in);
    if (t->out) BIO_free(t->out);
    free(t);
    return NULL;
  }
  BIO_set_mem_eof_return(t->in, -1);
  SSL_set_bio(t->ssl, t->in, t->out);
  SSL_set_accept_state(t->ssl);
  return t;
}

void mg_tls_conn_free(mg_tls_conn *t) {
  if (!t) return;
  SSL_free(t->ssl);   /* frees both BIOs */
  free(t);
}

int mg_tls_feed(mg_tls_conn *t, const char *data, size_t n) {
  return BIO_write(t->in, data, (int)n) == (int)n ? 0 : -1;
}

ssize_t mg_tls_read(mg_tls_conn *t, char *out, size_t cap) {
  int n = SSL_read(t->ssl, out, (int)cap);
  if (n > 0) return n;
  int e = SSL_get_error(t->ssl, n);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
  ERR_clear_error();
  return -1;
}

int mg_tls_write(mg_tls_conn *t, const char *data, size_t n) {
  while (n > 0) {
    int w = SSL_write(t->ssl, data, (int)(n > 1 << 30 ? 1 << 30 : n));
    if (w <= 0) {
      ERR_clear_error();
      return -1;
    }
    data += w;
    n -= (size_t)w;
  }
  return 0;
}

size_t mg_tls_pull(mg_tls_conn *t, char *out, size_t cap) {
  int n = BIO_read(t->out, out, (int)cap);
  return n > 0 ? (size_t)n : 0;
}

void mg_tls_close_notify(mg_tls_conn *t) {
  if (SSL_is_init_finished(t->ssl)) SSL_shutdown(t->ssl);
  ERR_clear_error();
}
