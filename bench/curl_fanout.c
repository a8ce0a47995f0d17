/*
** curl_fanout.c — the baseline for bench/http_fanout.lua: a bare
** libcurl-multi client with no scheduler, no Lua and no per-request objects
** beyond the easy handles.
**
**   build/curl_fanout BASE_URL [ROUNDS] [KEEPALIVE_N]
**
** For K = 1, 10, 100, 1000 it issues K concurrent GETs to BASE_URL/delay?ms=50
** on one multi handle (kept across rounds, like a long-lived process),
** ROUNDS times after one warm-up round, and prints the median and best wall
** time per round. Then it measures the CPU time per request of KEEPALIVE_N
** sequential GETs of BASE_URL/delay?ms=0 over one keep-alive connection.
** Last line: peak RSS of the process.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <curl/curl.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double cpu_us(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
         ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
}

static size_t sink(char *p, size_t size, size_t n, void *ud) {
  (void)p;
  *(size_t *)ud += size * n;
  return size * n;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Run k concurrent GETs of url on multi; returns failures. */
static int fanout(CURLM *multi, const char *url, int k) {
  CURL **easy = calloc((size_t)k, sizeof *easy);
  size_t *bytes = calloc((size_t)k, sizeof *bytes);
  for (int i = 0; i < k; i++) {
    easy[i] = curl_easy_init();
    curl_easy_setopt(easy[i], CURLOPT_URL, url);
    curl_easy_setopt(easy[i], CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(easy[i], CURLOPT_WRITEDATA, &bytes[i]);
    curl_easy_setopt(easy[i], CURLOPT_NOSIGNAL, 1L);
    curl_multi_add_handle(multi, easy[i]);
  }
  int running = 1, failed = 0;
  while (running) {
    curl_multi_perform(multi, &running);
    if (running) curl_multi_poll(multi, NULL, 0, 1000, NULL);
  }
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(multi, &left)))
    if (m->msg == CURLMSG_DONE && m->data.result != CURLE_OK) failed++;
  for (int i = 0; i < k; i++) {
    long status = 0;
    curl_easy_getinfo(easy[i], CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) failed++;
    curl_multi_remove_handle(multi, easy[i]);
    curl_easy_cleanup(easy[i]);
  }
  free(easy);
  free(bytes);
  return failed;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: curl_fanout BASE_URL [ROUNDS] [KEEPALIVE_N]\n");
    return 2;
  }
  const char *base = argv[1];
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  int ka_n = argc > 3 ? atoi(argv[3]) : 5000;
  char url[512];
  snprintf(url, sizeof url, "%s/delay?ms=50", base);

  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURLM *multi = curl_multi_init();
  static const int ks[] = { 1, 10, 100, 1000 };
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
    int k = ks[i];
    double *t = calloc((size_t)rounds, sizeof *t);
    int failed = fanout(multi, url, k);   /* warm-up: opens the connections */
    double c0 = cpu_us();
    for (int r = 0; r < rounds; r++) {
      double t0 = now_ms();
      failed += fanout(multi, url, k);
      t[r] = now_ms() - t0;
    }
    double cpu = (cpu_us() - c0) / ((double)rounds * k);
    qsort(t, (size_t)rounds, sizeof *t, cmp_double);
    printf("curl_multi  K=%-5d median %7.1f ms  best %7.1f ms  (limit 50 ms)  "
           "%6.1f us CPU/request%s\n", k, t[rounds / 2], t[0], cpu,
           failed ? "  FAILURES" : "");
    fflush(stdout);
    free(t);
  }

  /* per-request CPU on one keep-alive connection */
  snprintf(url, sizeof url, "%s/delay?ms=0", base);
  CURL *e = curl_easy_init();
  size_t bytes = 0;
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &bytes);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  int failed = 0;
  for (int i = 0; i < 100; i++) {   /* warm-up */
    curl_multi_add_handle(multi, e);
    int running = 1;
    while (running) {
      curl_multi_perform(multi, &running);
      if (running) curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    curl_multi_remove_handle(multi, e);
  }
  double c0 = cpu_us(), w0 = now_ms();
  for (int i = 0; i < ka_n; i++) {
    curl_multi_add_handle(multi, e);
    int running = 1;
    while (running) {
      curl_multi_perform(multi, &running);
      if (running) curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(multi, &left)))
      if (m->msg == CURLMSG_DONE && m->data.result != CURLE_OK) failed++;
    curl_multi_remove_handle(multi, e);
  }
  double cpu = cpu_us() - c0, wall = now_ms() - w0;
  long conns = 0;
  curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &conns);
  printf("curl_multi  keep-alive %d sequential GETs: %.1f us CPU/request, "
         "%.1f us wall/request%s\n", ka_n, cpu / ka_n, wall * 1e3 / ka_n,
         failed ? "  FAILURES" : "");
  curl_easy_cleanup(e);
  curl_multi_cleanup(multi);
  curl_global_cleanup();

  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("curl_multi  peak RSS %.1f MiB\n", ru.ru_maxrss / 1024.0);
  return 0;
}
