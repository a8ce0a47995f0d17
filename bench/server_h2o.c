/*
** server_h2o.c — the bare C baseline of bench/server.lua: libh2o on a libuv
** loop answering every request with the same hello-world JSON as the
** moongraph and node handlers. No Lua, no routing, no tasks.
**
**   build/server_h2o PORT      serves 127.0.0.1:PORT (0: any free port)
**                              until killed; prints "listening on URL pid N"
*/
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <h2o.h>

static h2o_globalconf_t config;
static h2o_context_t ctx;
static h2o_accept_ctx_t accept_ctx;

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
  (void)self;
  static h2o_generator_t generator = {NULL, NULL};
  static h2o_iovec_t body = {H2O_STRLIT("{\"hello\":\"world\"}")};
  req->res.status = 200;
  req->res.reason = "OK";
  req->res.content_length = body.len;
  h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                 H2O_STRLIT("application/json"));
  h2o_start_response(req, &generator);
  h2o_send(req, &body, 1, H2O_SEND_STATE_FINAL);
  return 0;
}

static void on_accept(uv_stream_t *listener, int status) {
  if (status != 0) return;
  uv_tcp_t *conn = malloc(sizeof *conn);
  uv_tcp_init(listener->loop, conn);
  if (uv_accept(listener, (uv_stream_t *)conn) != 0) {
    uv_close((uv_handle_t *)conn, (uv_close_cb)free);
    return;
  }
  h2o_accept(&accept_ctx, h2o_uv_socket_create((uv_stream_t *)conn, (uv_close_cb)free));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PORT\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  h2o_config_init(&config);
  h2o_hostconf_t *host = h2o_config_register_host(&config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
  h2o_pathconf_t *path = h2o_config_register_path(host, "/", 0);
  h2o_create_handler(path, sizeof(h2o_handler_t))->on_req = on_req;

  uv_loop_t *loop = uv_default_loop();
  h2o_context_init(&ctx, loop, &config);
  accept_ctx.ctx = &ctx;
  accept_ctx.hosts = config.hosts;

  static uv_tcp_t listener;
  struct sockaddr_in addr;
  uv_tcp_init(loop, &listener);
  uv_ip4_addr("127.0.0.1", atoi(argv[1]), &addr);
  int r = uv_tcp_bind(&listener, (struct sockaddr *)&addr, 0);
  if (r == 0) r = uv_listen((uv_stream_t *)&listener, 1024, on_accept);
  if (r != 0) {
    fprintf(stderr, "server_h2o: %s\n", uv_strerror(r));
    return 1;
  }
  int len = sizeof addr;
  uv_tcp_getsockname(&listener, (struct sockaddr *)&addr, &len);
  printf("listening on http://127.0.0.1:%d pid %d\n", ntohs(addr.sin_port), (int)getpid());
  fflush(stdout);
  return uv_run(loop, UV_RUN_DEFAULT);
}
