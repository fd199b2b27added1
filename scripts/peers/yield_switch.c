/*
 * yield_switch: the cost of one context switch by sched_yield, the way crowded ranks wait
 * (more ranks than CPUs: a2a's engine and Open MPI's yield_when_idle both yield instead of
 * spinning). Two processes pinned to one CPU call sched_yield in turns; each call of one is
 * two switches (to the other and back). Then one process alone: the syscall without a switch.
 *
 *   gcc -O2 -o yield_switch yield_switch.c && ./yield_switch [-n calls] [-c cpu]
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long n = 1000000;
    int cpu = 0, opt;
    while ((opt = getopt(argc, argv, "n:c:")) != -1) {
        switch (opt) {
        case 'n': n = atol(optarg); break;
        case 'c': cpu = atoi(optarg); break;
        default: fprintf(stderr, "usage: %s [-n calls] [-c cpu]\n", argv[0]); return 2;
        }
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) { perror("sched_setaffinity"); return 1; }
    pid_t child = fork(); /* inherits the affinity */
    if (child < 0) { perror("fork"); return 1; }
    double t0 = now();
    for (long i = 0; i < n; i++) sched_yield();
    double pair = now() - t0;
    if (child == 0) return 0;
    waitpid(child, NULL, 0);
    t0 = now();
    for (long i = 0; i < n; i++) sched_yield();
    double alone = now() - t0;
    printf("RESULT cpu=%d calls=%ld switch_ns=%.0f yield_alone_ns=%.0f\n", cpu, n, pair / n / 2 * 1e9, alone / n * 1e9);
    return 0;
}
