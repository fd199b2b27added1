/*
 * shm_harness.c - the floor of a2ad bench's 8 B shm 2-rank harness: what any
 * library could do in it. a2ad bench times, per iteration, a Barrier and then
 * one call, and reports the p50 of the slower rank's call. Here two processes
 * (fork, pinned to two CPUs) do the same with nothing but cache lines: an
 * LL-style flag barrier, then a timed 8 B exchange (store the payload and the
 * sequence word into this side's line in the peer's window, spin until the
 * peer's line carries the sequence, copy its payload out), with
 * clock_gettime(CLOCK_MONOTONIC) around the exchange only, as the bench reads
 * the monotonic clock around the call.
 * Lines: one per direction and parity, 128-byte aligned, as a2a's LL slots
 * (the barrier and the exchange alternate parities, as a2a's LL epochs do).
 * Before the harness the same run times a ping-pong of one line (the
 * cross-core round trip, as shm_pingpong.c), so the floor and the round trip
 * come from the same run.
 * Usage: shm_harness [-n iters] [-c cpuA,cpuB] [-d ns]
 *   -d  busy work of ns nanoseconds per exchange on each side, half before the
 *       store and half after the load (a calibrated loop, no clock reads):
 *       a library's per-call CPU, to see what a given CPU cost makes of the p50
 * Output: SHMH cpus=.. iters=.. work_ns=.. rtt_med_ns=.. call_p50_ns=.. call_p99_ns=..
 *   a_p50_ns=.. b_p50_ns=.. skew_p50_ns=.. payload_errors=..
 *   call_*: the slower side's exchange, per iteration; skew: |A's start - B's
 *   start| (both clocks are CLOCK_MONOTONIC of one machine).
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

typedef struct { _Alignas(128) uint64_t payload; _Atomic uint64_t seq; char pad[112]; } line_t;

enum { WARM = 2000, PP_BATCH = 100, PP_ITERS = 100000 };

typedef struct {
    line_t slot[2][2]; /* [writer][parity]: writer 0 is A, 1 is B */
    line_t ping, pong, ready;
    _Atomic int errors;
} shm_t;

static int64_t nowns(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec; }
static int cmpl(const void *x, const void *y) { int64_t a = *(const int64_t *)x, b = *(const int64_t *)y; return (a > b) - (a < b); }
/* spin runs k iterations of an empty loop; work spends about ns nanoseconds
 * in it, at the rate calibrate measured (clock reads would cost more than
 * the work at these sizes). */
static double iters_per_ns;
static void spin(long k) { for (volatile long i = 0; i < k; i++) ; }
static void work(long ns) { if (ns > 0) spin((long)(ns * iters_per_ns)); }
static void calibrate(void) { int64_t t0 = nowns(); spin(20000000); iters_per_ns = 20000000.0 / (double)(nowns() - t0); }
static void pin(int cpu) { cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(cpu, &cs); sched_setaffinity(0, sizeof cs, &cs); }

/* put stores v for sequence s into the writer's line of parity s&1; take
 * spins until the peer's line of that parity carries s and returns its
 * payload. */
static void put(shm_t *m, int me, uint64_t s, uint64_t v) {
    line_t *l = &m->slot[me][s & 1];
    l->payload = v;
    atomic_store_explicit(&l->seq, s, memory_order_release);
}
static uint64_t take(shm_t *m, int me, uint64_t s) {
    line_t *l = &m->slot[1 - me][s & 1];
    while (atomic_load_explicit(&l->seq, memory_order_acquire) != s) __builtin_ia32_pause();
    return l->payload;
}

/* run is one side's loop: iteration i is the barrier of sequence 2i+2 and
 * the timed exchange of 2i+3; start[i] and dur[i] are its exchange's. */
static void run(shm_t *m, int me, long iters, long work_ns, int64_t *start, int64_t *dur) {
    int bad = 0;
    for (long i = -WARM; i < iters; i++) {
        uint64_t s = 2 * (uint64_t)(i + WARM) + 2;
        put(m, me, s, 0);
        take(m, me, s);
        int64_t t0 = nowns();
        work(work_ns / 2);
        put(m, me, s + 1, 2 * (s + 1) + me);
        volatile uint64_t got = take(m, me, s + 1);
        work(work_ns - work_ns / 2);
        int64_t t1 = nowns();
        bad += got != 2 * (s + 1) + (1 - me);
        if (i >= 0) start[i] = t0, dur[i] = t1 - t0;
    }
    atomic_fetch_add(&m->errors, bad);
}

/* pingpong returns the median of PP_ITERS/PP_BATCH batch means of a
 * one-line round trip (A pings, B echoes). */
static double pingpong(shm_t *m, int me) {
    long nb = PP_ITERS / PP_BATCH;
    double *bt = me ? NULL : malloc(sizeof(double) * nb);
    uint64_t s = 1;
    for (long b = -10; b < nb; b++) {
        int64_t t0 = nowns();
        for (int i = 0; i < PP_BATCH; i++, s++) {
            if (me == 0) {
                atomic_store_explicit(&m->ping.seq, s, memory_order_release);
                while (atomic_load_explicit(&m->pong.seq, memory_order_acquire) != s) __builtin_ia32_pause();
            } else {
                while (atomic_load_explicit(&m->ping.seq, memory_order_acquire) != s) __builtin_ia32_pause();
                atomic_store_explicit(&m->pong.seq, s, memory_order_release);
            }
        }
        if (me == 0 && b >= 0) bt[b] = (double)(nowns() - t0) / PP_BATCH;
    }
    if (me) return 0;
    int64_t *v = malloc(sizeof(int64_t) * nb);
    for (long b = 0; b < nb; b++) v[b] = (int64_t)(bt[b] * 10); /* tenths of ns */
    qsort(v, nb, sizeof(int64_t), cmpl);
    double med = v[nb / 2] / 10.0;
    free(v); free(bt);
    return med;
}

static int64_t pct(int64_t *v, long n, double p) { long i = (long)(p * n); return v[i < n ? i : n - 1]; }

int main(int argc, char **argv) {
    long iters = 100000, work_ns = 0; int cpuA = 0, cpuB = 1, opt;
    while ((opt = getopt(argc, argv, "n:c:d:")) != -1) {
        if (opt == 'n') iters = atol(optarg);
        else if (opt == 'd') work_ns = atol(optarg);
        else if (opt == 'c') sscanf(optarg, "%d,%d", &cpuA, &cpuB);
    }
    if (iters < 1) iters = 1;
    calibrate();
    /* The shared mapping also holds both sides' stamps, for the parent. */
    size_t stamps = sizeof(int64_t) * (size_t)iters, size = sizeof(shm_t) + 4 * stamps;
    shm_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    int64_t *sa = (int64_t *)(m + 1), *da = sa + iters, *sb = da + iters, *db = sb + iters;
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) { /* B */
        pin(cpuB);
        atomic_store_explicit(&m->ready.seq, 1, memory_order_release);
        pingpong(m, 1);
        run(m, 1, iters, work_ns, sb, db);
        _exit(0);
    }
    pin(cpuA);
    while (!atomic_load_explicit(&m->ready.seq, memory_order_acquire)) sched_yield();
    double rtt = pingpong(m, 0);
    run(m, 0, iters, work_ns, sa, da);
    int status = 0;
    waitpid(pid, &status, 0);
    int64_t *slow = malloc(stamps), *skew = malloc(stamps);
    for (long i = 0; i < iters; i++) {
        slow[i] = da[i] > db[i] ? da[i] : db[i];
        skew[i] = sa[i] > sb[i] ? sa[i] - sb[i] : sb[i] - sa[i];
    }
    qsort(slow, iters, sizeof(int64_t), cmpl);
    qsort(skew, iters, sizeof(int64_t), cmpl);
    qsort(da, iters, sizeof(int64_t), cmpl);
    qsort(db, iters, sizeof(int64_t), cmpl);
    int errors = atomic_load(&m->errors);
    printf("SHMH cpus=%d,%d iters=%ld work_ns=%ld rtt_med_ns=%.1f call_p50_ns=%lld call_p99_ns=%lld a_p50_ns=%lld b_p50_ns=%lld skew_p50_ns=%lld payload_errors=%d\n",
           cpuA, cpuB, iters, work_ns, rtt, (long long)pct(slow, iters, 0.5), (long long)pct(slow, iters, 0.99),
           (long long)pct(da, iters, 0.5), (long long)pct(db, iters, 0.5), (long long)pct(skew, iters, 0.5), errors);
    free(slow); free(skew);
    munmap(m, size);
    return errors != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
