/*
 * shm_exchange.c - cross-process shared-memory exchange with spinning flags, the
 * pattern of a 2-rank LL AllToAllV (both ranks store, then both load), where
 * shm_pingpong.c times a ping-pong (one stores while the other waits).
 * Two processes (fork) map the same /dev/shm file (MAP_SHARED). Each owns one
 * 128-byte-aligned line. In exchange s each writes an 8-byte payload and then s
 * into its own line (release), and spins until the peer's line carries s, as an
 * LL slot's payload and length word. Neither waits for the other to start an
 * exchange, so one exchange costs about one one-way hop when the two stay in step.
 * Usage: shm_exchange [-n iters] [-b batch] [-c cpuA,cpuB] [-w window_ms]
 *   -c  pin the two processes (default 0,1)
 * Exchanges are timed in batches of -b (default 20) on process A; reported: the
 * median / p99 / min of the per-batch mean, and the lowest and highest median of
 * windows of -w ms (default 10), which show a change of state during the run.
 * On the 2-vCPU VMs: ~45-60 ns with the vCPUs sharing a cache, ~190-250 ns apart
 * (docs/PERFORMANCE.md, "Fast and slow periods of the 8 B shm cells").
 * Output: SHMEX cpus=.. iters=.. ex_med_ns=.. ex_p99_ns=.. ex_min_ns=.. win_med_lo_ns=.. win_med_hi_ns=.. windows=.. payload_errors=..
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { _Alignas(128) _Atomic uint64_t seq; uint64_t payload; char pad[112]; } line_t;
typedef struct { line_t a; line_t b; line_t ready; } shm_t;

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }
static int cmpd(const void *x, const void *y) { double a = *(const double *)x, b = *(const double *)y; return (a > b) - (a < b); }
static void pin(int cpu) { if (cpu < 0) return; cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(cpu, &cs); sched_setaffinity(0, sizeof cs, &cs); }

/* exchange stores s (and its payload) into own, then waits for the peer's s;
 * it returns 1 when the peer's payload is neither what the peer wrote for s nor
 * for s+1 (the peer may be one exchange ahead, never two). */
static int exchange(line_t *own, line_t *peer, uint64_t s, uint64_t mine, uint64_t theirs) {
    own->payload = mine;
    atomic_store_explicit(&own->seq, s, memory_order_release);
    while (atomic_load_explicit(&peer->seq, memory_order_acquire) < s) __builtin_ia32_pause();
    uint64_t p = peer->payload;
    return p != theirs && p != theirs + 2;
}

int main(int argc, char **argv) {
    long iters = 2000000; int batch = 20, cpuA = 0, cpuB = 1, opt; double win = 10;
    while ((opt = getopt(argc, argv, "n:b:c:w:")) != -1) {
        if (opt == 'n') iters = atol(optarg);
        else if (opt == 'b') batch = atoi(optarg);
        else if (opt == 'c') sscanf(optarg, "%d,%d", &cpuA, &cpuB);
        else if (opt == 'w') win = atof(optarg);
    }
    if (batch < 1) batch = 1;
    long nb = iters / batch; if (nb < 1) nb = 1;
    char path[64]; snprintf(path, sizeof path, "/dev/shm/shm_exchange.%d", getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(shm_t)) != 0) { perror("shm"); return 1; }
    shm_t *m = mmap(NULL, sizeof(shm_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); unlink(path); return 1; }
    unlink(path); /* the mapping keeps it; nothing is left behind if a process dies */
    memset(m, 0, sizeof *m);
    uint64_t total = (uint64_t)nb * batch + 1000; /* +1000 warm-up */
    pid_t pid = fork();
    if (pid == 0) { /* B */
        pin(cpuB);
        atomic_store_explicit(&m->ready.seq, 1, memory_order_release);
        for (uint64_t s = 1; s <= total; s++) exchange(&m->b, &m->a, s, 2 * s + 1, 2 * s);
        _exit(0);
    }
    pin(cpuA);
    while (!atomic_load_explicit(&m->ready.seq, memory_order_acquire)) sched_yield();
    double *bt = malloc(sizeof(double) * nb), *bend = malloc(sizeof(double) * nb);
    uint64_t s = 1, bad = 0;
    for (; s <= 1000; s++) bad += exchange(&m->a, &m->b, s, 2 * s, 2 * s + 1);
    for (long b = 0; b < nb; b++) {
        double t0 = now();
        for (int i = 0; i < batch; i++, s++) bad += exchange(&m->a, &m->b, s, 2 * s, 2 * s + 1);
        bend[b] = now();
        bt[b] = (bend[b] - t0) / batch;
    }
    waitpid(pid, NULL, 0);
    munmap(m, sizeof *m); close(fd);
    /* Medians of the windows of win ms, in time order, before bt is sorted. */
    double lo = 0, hi = 0, *w = malloc(sizeof(double) * nb); long nw = 0;
    for (long b0 = 0; b0 < nb;) {
        long b1 = b0;
        while (b1 < nb && bend[b1] - bend[b0] < win * 1e-3) b1++;
        long n = b1 - b0;
        memcpy(w, bt + b0, sizeof(double) * n);
        qsort(w, n, sizeof(double), cmpd);
        double med = w[n / 2];
        if (nw == 0 || med < lo) lo = med;
        if (nw == 0 || med > hi) hi = med;
        nw++;
        b0 = b1;
    }
    qsort(bt, nb, sizeof(double), cmpd);
    long p99 = (long)(0.99 * nb); if (p99 >= nb) p99 = nb - 1;
    printf("SHMEX cpus=%d,%d iters=%ld batch=%d ex_med_ns=%.1f ex_p99_ns=%.1f ex_min_ns=%.1f win_med_lo_ns=%.1f win_med_hi_ns=%.1f windows=%ld payload_errors=%llu\n",
           cpuA, cpuB, nb * batch, batch, bt[nb / 2] * 1e9, bt[p99] * 1e9, bt[0] * 1e9, lo * 1e9, hi * 1e9, nw, (unsigned long long)bad);
    return bad != 0;
}
