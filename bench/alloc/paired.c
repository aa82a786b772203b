// Paired, in-process comparison of allocators on seed 002's `general` loop (the loop of
// `loci bench alloc`'s `general` case: a table of slots per thread; an empty slot gets a block
// of a size whose power-of-two class 16 B..2^HI is drawn with probability ~ 1/class size, the
// whole block written; a full slot's block is checked and freed).
//
// Each allocator is a shared library opened with RTLD_LOCAL, so several live in one process
// side by side, each with its own heaps, and its malloc/free are called through pointers (the
// same indirect call for every allocator). Every allocator gets its own worker threads and slot
// tables. The run is a series of rounds; in each, every allocator runs one short block of the
// loop on all its threads at once, in an order shuffled per round. A block's time is set
// against the first allocator's block of the same round: the machine's drift moves both alike,
// which separate processes seconds apart (`loci bench alloc`) cannot cancel on a shared VM.
//
// Written by hand: no benchmark harness compares allocators inside one process this way.
//
// Usage: paired [-t THREADS] [-k HI] [-n OPS] [-s LOGSLOTS] [-r ROUNDS] LIB:MALLOC:FREE ...
//   e.g. paired target/release/libloci_malloc.so:malloc:free
//               /usr/lib/x86_64-linux-gnu/libmimalloc.so.2:mi_malloc:mi_free (one command line)
// Prints per allocator: the median block time, and the median of its per-round ratios to the
// first allocator with their quartiles (below 1: faster than the first).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIBS 8
#define MAX_THREADS 8
#define MAX_ROUNDS 4096

typedef struct { char *p; size_t n; } slot;
typedef void *(*malloc_fn)(size_t);
typedef void (*free_fn)(void *);

static inline uint64_t next(uint64_t *s) {  // xorshift64*, as the Rust workload's Rng
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

static inline size_t size_draw(uint64_t *s, unsigned lo, unsigned hi) {
    for (;;) {
        uint64_t x = next(s);
        unsigned k = lo + __builtin_ctzll(x);
        if (k <= hi) { size_t half = ((size_t)1 << k) / 2; return half + 1 + (x >> 40) % half; }
    }
}

static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
    malloc_fn m; free_fn f; slot *t; size_t slots; long ops; unsigned hi; uint64_t rng;
    pthread_barrier_t *go, *done; int blocks; uint64_t sum;
} worker;

static void block(worker *w) {
    for (long o = 0; o < w->ops; o++) {
        size_t i = next(&w->rng) & (w->slots - 1);
        slot *s = &w->t[i];
        if (!s->p) {
            size_t n = size_draw(&w->rng, 4, w->hi);
            char *p = w->m(n);
            if (!p) { fprintf(stderr, "paired: malloc(%zu) failed\n", n); exit(1); }
            memset(p, (int)((n & 255) | 1), n);
            s->p = p; s->n = n;
        } else {
            char c = (char)((s->n & 255) | 1);
            if (s->p[0] != c || s->p[s->n - 1] != c) { fprintf(stderr, "paired: block corrupted\n"); exit(1); }
            w->sum += (unsigned char)s->p[0];
            w->f(s->p); s->p = NULL;
        }
    }
}

static void *work(void *a) {
    worker *w = a;
    for (int b = 0; b < w->blocks; b++) {
        pthread_barrier_wait(w->go); block(w); pthread_barrier_wait(w->done);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y);
}

static double quantile(double *v, int n, double q) {  // v sorted
    return v[(int)(q * (n - 1) + 0.5)];
}

int main(int argc, char **argv) {
    int threads = 2, rounds = 301, logslots = 18, opt; unsigned hi = 19; long ops = 500000;
    while ((opt = getopt(argc, argv, "t:k:n:s:r:")) != -1) {
        switch (opt) {
        case 't': threads = atoi(optarg); break;
        case 'k': hi = (unsigned)atoi(optarg); break;
        case 'n': ops = atol(optarg); break;
        case 's': logslots = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        default: goto usage;
        }
    }
    int n = argc - optind;
    if (n < 1 || n > MAX_LIBS || threads < 1 || threads > MAX_THREADS || rounds < 3 ||
        rounds > MAX_ROUNDS || hi < 4 || hi > 24 || ops < 1 || logslots < 4 || logslots > 26) {
    usage:
        fprintf(stderr, "usage: paired [-t THREADS 1..%d] [-k HI 4..24] [-n OPS] [-s LOGSLOTS 4..26] "
                        "[-r ROUNDS 3..%d] LIB:MALLOC:FREE ... (1..%d libraries)\n",
                MAX_THREADS, MAX_ROUNDS, MAX_LIBS);
        return 2;
    }
    size_t slots = (size_t)1 << logslots;
    static worker W[MAX_LIBS][MAX_THREADS];
    static pthread_barrier_t go[MAX_LIBS], done[MAX_LIBS];
    static double T[MAX_LIBS][MAX_ROUNDS];
    char *name[MAX_LIBS];
    for (int k = 0; k < n; k++) {
        char *spec = strdup(argv[optind + k]);
        char *lib = strtok(spec, ":"), *ms = strtok(NULL, ":"), *fs = strtok(NULL, ":");
        if (!lib || !ms || !fs) { fprintf(stderr, "paired: %s is not LIB:MALLOC:FREE\n", argv[optind + k]); return 2; }
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) { fprintf(stderr, "paired: %s\n", dlerror()); return 1; }
        malloc_fn m = (malloc_fn)dlsym(h, ms); free_fn f = (free_fn)dlsym(h, fs);
        if (!m || !f) { fprintf(stderr, "paired: %s has no %s or %s\n", lib, ms, fs); return 1; }
        name[k] = lib;
        pthread_barrier_init(&go[k], NULL, threads + 1);
        pthread_barrier_init(&done[k], NULL, threads + 1);
        for (int q = 0; q < threads; q++) {
            worker *w = &W[k][q];
            *w = (worker){m, f, calloc(slots, sizeof(slot)), slots, ops, hi,
                          0x9e3779b97f4a7c15ULL ^ ((uint64_t)(q + 1) * 0xdeadbeefULL), &go[k], &done[k],
                          rounds + 1, 0};
            if (!w->t) { fprintf(stderr, "paired: no memory for the slot table\n"); return 1; }
            pthread_t th;
            if (pthread_create(&th, NULL, work, w)) { fprintf(stderr, "paired: pthread_create failed\n"); return 1; }
            pthread_detach(th);
        }
    }
    uint64_t shuffle = 12345;
    for (int r = -1; r < rounds; r++) {  // round -1 warms every allocator's heaps up, untimed
        int order[MAX_LIBS];
        for (int k = 0; k < n; k++) order[k] = k;
        for (int k = n - 1; k > 0; k--) { int j = next(&shuffle) % (k + 1); int t = order[k]; order[k] = order[j]; order[j] = t; }
        for (int i = 0; i < n; i++) {
            int k = order[i]; double t0 = now();
            pthread_barrier_wait(&go[k]); pthread_barrier_wait(&done[k]);
            if (r >= 0) T[k][r] = now() - t0;
        }
    }
    printf("paired: %d round(s) of %ld operations per thread, %d thread(s) each, 2^%d slots, sizes 16 B..2^%u\n",
           rounds, ops, threads, logslots, hi);
    for (int k = 0; k < n; k++) {
        static double ratio[MAX_ROUNDS], t[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) { ratio[r] = T[k][r] / T[0][r]; t[r] = T[k][r]; }
        qsort(ratio, rounds, sizeof(double), cmp); qsort(t, rounds, sizeof(double), cmp);
        printf("%-48s median %.4f s  time vs first: %.3f (quartiles %.3f..%.3f)\n", name[k],
               quantile(t, rounds, 0.5), quantile(ratio, rounds, 0.5), quantile(ratio, rounds, 0.25),
               quantile(ratio, rounds, 0.75));
    }
    return 0;
}
