// tcp_exchange: the floor of a 2-rank exchange over loopback TCP, in C.
//
//   gcc -O2 -o tcp_exchange scripts/peers/tcp_exchange.c
//   ./tcp_exchange [-n ITERS] [-b BYTES] [-m readv|read|poll|epoll|block|turns]
//                  [-c CPU0,CPU1] [-s SOCKBUF] [-B] [-M]
//
// Two processes, bound to a core each (default 0 and 1), joined by one TCP
// connection over 127.0.0.1 with TCP_NODELAY. Every iteration both send BYTES
// (default 56: a2a's 48-byte frame header and 8 B of payload) with one
// syscall and then wait for the peer's: what an AllToAllV of 2 ranks does on
// the wire. How they send and receive (-m, default readv):
//   readv  a2a's calls: sendmsg and non-blocking readv in a loop, each with
//          two iovecs (the 48-byte header, then the payload); each try takes
//          the socket's lock, which the peer's delivery into it also takes
//   read   the same with send and non-blocking recv of one contiguous buffer
//   poll   poll(2) with timeout 0 in a loop, then one read (tcp_poll reads
//          the socket's state without its lock)
//   epoll  epoll_wait with timeout 0 in a loop, then one read (Open MPI's
//          progress loop over libevent)
//   block  a blocking read: the kernel parks and wakes the process
//   turns  the two directions in turn, as Open MPI's fast rounds run a 1 MiB
//          exchange: rank 0 sends its whole message in non-blocking sends,
//          then receives; rank 1 receives, then sends
// Above 64 KiB, -m read sends and receives in turn, at most 512 KiB per
// call, as a2a's engine does (the other modes send in one call and would
// fill both socket buffers).
// -M adds a copy of BYTES within the process to every exchange, before it:
// the block a rank sends itself in an AllToAll.
// -B precedes every timed exchange with an untimed one of a 48-byte header,
// as a2ad bench and a2av_bench.c time a call after a barrier.
// -s sets SO_SNDBUF and SO_RCVBUF (a2a's tcp sets 4 MiB); default: the
// kernel's autotuning.
// It prints the median, p10 and p90 over the iterations of the slower rank's
// time (as a2ad bench and a2av_bench.c report), in us. An
// exchange that costs less than this in a2a or Open MPI is not possible on
// this kernel; the gap above it is the library's.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

static double now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void die(const char *what) {
	perror(what);
	exit(1);
}

static void bind_cpu(int cpu) {
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	if (sched_setaffinity(0, sizeof s, &s) != 0)
		die("sched_setaffinity");
}

static void recv_all(int fd, int ep, char *buf, int n, char mode) {
	int got = 0;
	if (mode == 'v' && n > 48) { // header and payload, as a2a reads a frame
		while (got < n) {
			struct iovec iov[2] = {{buf + got, got < 48 ? 48 - got : n - got}, {buf + 48, n - 48}};
			ssize_t r = readv(fd, iov, got < 48 ? 2 : 1);
			if (r > 0)
				got += r;
			else if (r == 0 || (errno != EAGAIN && errno != EINTR))
				die("readv");
		}
		return;
	}
	while (got < n) {
		if (mode == 'e') {
			struct epoll_event ev;
			if (epoll_wait(ep, &ev, 1, 0) < 1)
				continue;
		} else if (mode == 'p') {
			struct pollfd p = {.fd = fd, .events = POLLIN};
			if (poll(&p, 1, 0) < 1)
				continue;
		}
		ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
		if (r > 0) {
			got += r;
		} else if (r == 0) {
			fprintf(stderr, "tcp_exchange: peer closed\n");
			exit(1);
		} else if (errno != EAGAIN && errno != EINTR) {
			die("read");
		}
	}
}

// stream exchanges a large message as a2a's engine does: non-blocking sends
// and receives of at most 512 KiB, alternating.
static void stream(int fd, char *out, char *in, int bytes) {
	int sent = 0, got = 0;
	while (sent < bytes || got < bytes) {
		if (sent < bytes) {
			int n = bytes - sent < 512 << 10 ? bytes - sent : 512 << 10;
			ssize_t r = send(fd, out + sent, n, MSG_NOSIGNAL);
			if (r > 0)
				sent += r;
			else if (r < 0 && errno != EAGAIN && errno != EINTR)
				die("send");
		}
		if (got < bytes) {
			int n = bytes - got < 512 << 10 ? bytes - got : 512 << 10;
			ssize_t r = recv(fd, in + got, n, MSG_DONTWAIT);
			if (r > 0)
				got += r;
			else if (r == 0 || (errno != EAGAIN && errno != EINTR))
				die("recv");
		}
	}
}

// run does the exchanges and returns the iteration times (us).
// rank1: this process is rank 1 (the connecting one); selfcopy: -M.
static int rank1, selfcopy;

// send_all sends bytes in non-blocking sends until all are out.
static void send_all(int fd, char *out, int bytes) {
	for (int sent = 0; sent < bytes;) {
		ssize_t r = send(fd, out + sent, bytes - sent, MSG_NOSIGNAL);
		if (r > 0)
			sent += r;
		else if (r < 0 && errno != EAGAIN && errno != EINTR)
			die("send");
	}
}

static double *run(int fd, int iters, int bytes, char mode, int cpu, int sockbuf, int barrier) {
	bind_cpu(cpu);
	if (sockbuf > 0 && (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf) ||
	                    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf)))
		die("setsockopt");
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (mode != 'b')
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	char *out = calloc(1, bytes), *in = calloc(1, bytes > 48 ? bytes : 48);
	char *self_src = calloc(1, bytes), *self_dst = calloc(1, bytes);
	memset(self_src, 1, bytes); memset(self_dst, 2, bytes); memset(out, 3, bytes);
	double *t = calloc(iters, sizeof *t);
	int warm = iters / 10;
	char hdr[48] = {0};
	for (int i = -warm; i < iters; i++) {
		if (barrier) {
			if (send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) != sizeof hdr)
				die("send");
			recv_all(fd, ep, in, sizeof hdr, mode);
		}
		double t0 = now_us();
		if (selfcopy)
			memcpy(self_dst, self_src, bytes);
		if (mode == 't') {
			if (!rank1) {
				send_all(fd, out, bytes);
				recv_all(fd, ep, in, bytes, 'r');
			} else {
				recv_all(fd, ep, in, bytes, 'r');
				send_all(fd, out, bytes);
			}
			if (i >= 0)
				t[i] = now_us() - t0;
			continue;
		}
		if (bytes > 64 << 10 && mode == 'r') {
			stream(fd, out, in, bytes);
		} else if (mode == 'v' && bytes > 48) {
			struct iovec iov[2] = {{out, 48}, {out + 48, bytes - 48}};
			struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
			if (sendmsg(fd, &msg, MSG_NOSIGNAL) != bytes)
				die("sendmsg");
		} else if (send(fd, out, bytes, MSG_NOSIGNAL) != bytes) {
			die("send");
		}
		if (!(bytes > 64 << 10 && mode == 'r'))
			recv_all(fd, ep, in, bytes, mode);
		if (i >= 0)
			t[i] = now_us() - t0;
	}
	return t;
}

static const char *modes[] = {"readv", "read", "poll", "epoll", "block", "turns", NULL};

int main(int argc, char **argv) {
	int iters = 20000, bytes = 56, cpu0 = 0, cpu1 = 1, sockbuf = 0, barrier = 0, opt;
	char mode = 'v';
	while ((opt = getopt(argc, argv, "n:b:m:c:s:BM")) != -1) {
		switch (opt) {
		case 'n': iters = atoi(optarg); break;
		case 'b': bytes = atoi(optarg); break;
		case 'm':
			mode = 0;
			for (int i = 0; modes[i]; i++)
				if (strcmp(optarg, modes[i]) == 0)
					mode = "vrpebt"[i];
			break;
		case 'c': sscanf(optarg, "%d,%d", &cpu0, &cpu1); break;
		case 's': sockbuf = atoi(optarg); break;
		case 'B': barrier = 1; break;
		case 'M': selfcopy = 1; break;
		default:
			fprintf(stderr, "usage: %s [-n ITERS] [-b BYTES] [-m readv|read|poll|epoll|block|turns] [-c CPU0,CPU1] [-s SOCKBUF] [-B] [-M]\n", argv[0]);
			return 2;
		}
	}
	if (iters < 10 || bytes < 1 || mode == 0) {
		fprintf(stderr, "tcp_exchange: bad arguments\n");
		return 2;
	}
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t alen = sizeof a;
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)&a, &alen))
		die("listen");
	int pp[2];
	if (pipe(pp))
		die("pipe");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		close(l);
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a))
			die("connect");
		close(pp[0]);
		rank1 = 1;
		double *t = run(fd, iters, bytes, mode, cpu1, sockbuf, barrier);
		char *p = (char *)t, *end = p + iters * sizeof *t;
		for (ssize_t w; p < end; p += w)
			if ((w = write(pp[1], p, end - p)) <= 0)
				die("write");
		_exit(0);
	}
	int fd = accept(l, NULL, NULL);
	if (fd < 0)
		die("accept");
	close(l);
	close(pp[1]);
	double *t = run(fd, iters, bytes, mode, cpu0, sockbuf, barrier), *u = calloc(iters, sizeof *u);
	char *p = (char *)u, *end = p + iters * sizeof *u;
	for (ssize_t r; p < end; p += r)
		if ((r = read(pp[0], p, end - p)) <= 0)
			die("read from rank 1");
	for (int i = 0; i < iters; i++)
		t[i] = t[i] > u[i] ? t[i] : u[i];
	qsort(t, iters, sizeof *t, cmp);
	printf("tcp_exchange mode=%s barrier=%d bytes=%d iters=%d p10_us=%.2f p50_us=%.2f p90_us=%.2f\n",
	       modes[strchr("vrpebt", mode) - "vrpebt"], barrier, bytes,
	       iters, t[iters / 10], t[iters / 2], t[iters * 9 / 10]);
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
