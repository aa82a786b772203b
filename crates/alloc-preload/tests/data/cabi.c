/* The C allocation ABI as programs use it, run with LD_PRELOAD=libloci_malloc.so (and under
 * valgrind memcheck). Exits non-zero with a message on the first broken contract. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "cabi: " __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

enum { THREADS = 4, SLOTS = 512, ROUNDS = 20000 };
static void *slots[THREADS][SLOTS];
static size_t sizes[THREADS][SLOTS];

static void fill(unsigned char *p, size_t n, unsigned char v) { memset(p, v, n); }
static void check(unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i += (n > 4096 ? 509 : 1)) CHECK(p[i] == v, "block %p byte %zu changed", (void *)p, i);
}

/* each thread allocates into its row and frees from its neighbour's row: cross-thread frees */
static void *worker(void *arg) {
  long t = (long)arg;
  unsigned x = 12345u + (unsigned)t;
  for (int r = 0; r < ROUNDS; r++) {
    x = x * 1103515245u + 12345u;
    int s = (x >> 8) % SLOTS;
    size_t n = (x >> 4) % 3 == 0 ? 8192 + (x % 200000) : 1 + (x % 3000);
    if (slots[t][s]) { check(slots[t][s], sizes[t][s], (unsigned char)s); free(slots[t][s]); }
    slots[t][s] = (x & 1) ? malloc(n) : calloc(1, n);
    CHECK(slots[t][s] != NULL, "allocation of %zu failed", n);
    sizes[t][s] = n;
    fill(slots[t][s], n, (unsigned char)s);
  }
  return NULL;
}

int main(void) {
  CHECK(dlsym(RTLD_DEFAULT, "loci_alloc_task_finished") != NULL, "libloci_malloc.so is not preloaded");
  /* calloc zeroes (also reused memory) */
  for (int k = 0; k < 3; k++) {
    size_t n = k == 0 ? 40 : k == 1 ? 20000 : 2000000;
    unsigned char *p = malloc(n); fill(p, n, 0xee); free(p);
    unsigned char *z = calloc(n, 1);
    for (size_t i = 0; i < n; i++) CHECK(z[i] == 0, "calloc(%zu) byte %zu not zero", n, i);
    free(z);
  }
  errno = 0;
  CHECK(calloc(SIZE_MAX / 2, 3) == NULL && errno == ENOMEM, "calloc overflow must fail with ENOMEM");
  /* realloc keeps the contents across classes and the large path */
  unsigned char *p = NULL; size_t have = 0;
  size_t steps[] = {1, 33, 5000, 9000, 300000, 3000000, 100, 7};
  for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
    size_t n = steps[k];
    p = realloc(p, n);
    CHECK(p != NULL, "realloc to %zu failed", n);
    for (size_t i = 0; i < (have < n ? have : n); i++) CHECK(p[i] == (unsigned char)(i * 7), "realloc to %zu lost byte %zu", n, i);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7);
    have = n;
    CHECK(malloc_usable_size(p) >= n, "usable size below %zu", n);
  }
  CHECK(realloc(p, 0) == NULL, "realloc(p, 0) returns NULL after freeing");
  /* alignment entry points */
  void *a = NULL;
  CHECK(posix_memalign(&a, 3, 8) == EINVAL, "posix_memalign(3) must be EINVAL");
  for (size_t al = sizeof(void *); al <= (1u << 21); al <<= 1) {
    CHECK(posix_memalign(&a, al, 100) == 0 && ((uintptr_t)a % al) == 0, "posix_memalign %zu", al);
    memset(a, 1, 100); free(a);
    a = aligned_alloc(al, 3 * al);
    CHECK(a && ((uintptr_t)a % al) == 0, "aligned_alloc %zu", al);
    memset(a, 1, 3 * al); free(a);
    a = memalign(al, 10);
    CHECK(a && ((uintptr_t)a % al) == 0, "memalign %zu", al);
    free(a);
  }
  long pg = sysconf(_SC_PAGESIZE);
  a = valloc(10); CHECK(((uintptr_t)a % pg) == 0, "valloc"); free(a);
  a = pvalloc(10); CHECK(((uintptr_t)a % pg) == 0 && malloc_usable_size(a) >= (size_t)pg, "pvalloc"); free(a);
  CHECK(malloc_usable_size(NULL) == 0, "malloc_usable_size(NULL)");
  free(NULL);
  void *z0 = malloc(0); CHECK(z0 != NULL, "malloc(0) must return a unique pointer"); free(z0);
  /* strdup and friends allocate inside libc: they must come back to our free */
  char *s = strdup("numa"); CHECK(strcmp(s, "numa") == 0, "strdup"); free(s);
  /* threads with cross-thread frees */
  pthread_t th[THREADS];
  for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (long t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < THREADS; t++)
    for (int s2 = 0; s2 < SLOTS; s2++)
      if (slots[t][s2]) { check(slots[t][s2], sizes[t][s2], (unsigned char)s2); free(slots[t][s2]); }
  puts("cabi ok");
  return 0;
}
