// Command soak runs random a2a operations for a while on several ranks, each
// a process of its own, verifies every byte they deliver, and ends by
// checking each rank for leaks.
//
//	soak [--n 4] [--duration 30s] [--seed S] [--transport mix|auto|tcp|shm]
//
// Every rank draws the same sequence from the seed (printed first, so a
// failure reproduces with --seed): sessions, each a fresh Join with a drawn
// data plane (one posed host on shared memory or TCP, or two posed hosts:
// shared memory inside, TCP between), AllToAllV algorithm (auto or forced,
// as A2A_ALGO does), AllReduce algorithm, streams, window and LL cutoff, and
// in each session 50-399 operations drawn from every collective and
// point-to-point call with random sizes (0 B to 1.2 MiB), roots, reductions
// and AllToAllV counts that change every call. After warm-up (the first
// fifth of the run) each rank samples its goroutines, descriptors, live heap
// and shared-memory mappings between sessions; at the end they must not have
// grown (the live heap by less than 2%), and no segment of the run may be left in
// /dev/shm.
//
// Without --worker, soak is the launcher: it starts an embedded NATS server
// and the ranks as processes (as `a2ad run` does) and fails if any rank
// fails. With --worker it is one rank, configured by the A2A_* environment,
// which is how scripts/testbed.sh --soak runs it across network namespaces
// (each namespace then is one host, and the sessions mix auto and TCP).
//
// --link-cut makes a worker the rank of the link-cut test (linkcut.go).
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/a2a-moe/a2a/a2a/transport/shm"
	"github.com/a2a-moe/a2a/internal/launch"
	"github.com/a2a-moe/a2a/internal/natsd"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	n := fs.Int("n", 4, "ranks to start (launcher)")
	duration := fs.Duration("duration", 30*time.Second, "how long to run operations (sessions finish the one in progress)")
	seed := fs.Uint64("seed", 0, "seed of the random operations (0: a random one, printed)")
	transport := fs.String("transport", "mix", "data planes to draw from: mix, auto (shm inside a host, tcp between), tcp, shm")
	opTimeout := fs.Duration("op-timeout", 60*time.Second, "deadline of one operation: longer is a hang")
	inject := fs.String("inject", "", "make the soak fail on purpose: corrupt (rank 1 sends a wrong byte) or leak (a goroutine and a descriptor after warm-up)")
	verbose := fs.Bool("v", false, "log the library's warnings (forced algorithms that fall back, ...)")
	worker := fs.Bool("worker", false, "run as one rank, configured by the A2A_* environment (what the launcher starts)")
	linkCut := fs.Bool("link-cut", false, "with --worker: be a rank of the link-cut test (scripts/testbed.sh --link-cut)")
	linkCutRounds := fs.Int("rounds", 20, "with --link-cut: verified rounds after joining again")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	level := slog.LevelError
	if *verbose {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch *transport {
	case "mix", "auto", "tcp", "shm":
	default:
		fmt.Fprintf(os.Stderr, "soak: --transport %q: mix, auto, tcp or shm\n", *transport)
		return 2
	}
	switch *inject {
	case "", "corrupt", "leak":
	default:
		fmt.Fprintf(os.Stderr, "soak: --inject %q: corrupt or leak\n", *inject)
		return 2
	}
	if *seed == 0 {
		*seed = randomSeed()
	}
	o := workerOptions{seed: *seed, duration: *duration, transport: *transport, inject: *inject, opTimeout: *opTimeout}
	if *linkCut {
		if !*worker {
			fmt.Fprintln(os.Stderr, "soak: --link-cut is a worker mode (scripts/testbed.sh --link-cut starts it)")
			return 2
		}
		if err := runLinkCut(ctx, log, o, *linkCutRounds); err != nil {
			fmt.Fprintln(os.Stderr, "soak: link-cut:", err)
			return 1
		}
		return 0
	}
	if *worker {
		res, err := runWorker(ctx, log, o)
		if err != nil {
			fmt.Fprintf(os.Stderr, "soak: FAIL seed=%d: %v\n", o.seed, err)
			return 1
		}
		fmt.Println("soak:", res.summary(rankFromEnv()))
		return 0
	}
	if *n < 2 {
		fmt.Fprintln(os.Stderr, "soak: -n: at least 2 ranks")
		return 2
	}
	fmt.Printf("soak: seed %d: %d ranks for %v, transports %s (reproduce: soak --seed %d --n %d --duration %v --transport %s)\n",
		o.seed, *n, o.duration, o.transport, o.seed, *n, o.duration, o.transport)
	t0 := time.Now()
	if err := launchRanks(ctx, *n, fs); err != nil {
		fmt.Fprintf(os.Stderr, "soak: FAIL seed %d after %.1fs: %v\n", o.seed, time.Since(t0).Seconds(), err)
		return 1
	}
	fmt.Printf("soak: PASS seed %d: %d ranks, %.1fs, every byte verified, no leaks\n", o.seed, *n, time.Since(t0).Seconds())
	return 0
}

// launchRanks starts n ranks of this executable with --worker and the
// launcher's own flags (the seed made explicit) on an embedded NATS server
// that lets in only them.
func launchRanks(ctx context.Context, n int, fs *flag.FlagSet) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	user := natsd.NewUser("soak", nil)
	srv, err := natsd.StartServer(natsd.Config{Listen: "127.0.0.1:0", Users: []natsd.User{user}})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	// Segments of ranks killed in an earlier run stay until swept.
	_, _ = shm.Sweep(shm.DefaultDir)
	wargs := []string{"--worker", "--seed", fs.Lookup("seed").Value.String()}
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "seed" && f.Name != "n" {
			wargs = append(wargs, "--"+f.Name+"="+f.Value.String())
		}
	})
	return launch.Run(ctx, launch.Spec{
		N: n, NATSURL: srv.ClientURL(), Group: "soak-" + randomHex(4), Secret: randomHex(16),
		Env: user.Env(), Prog: self, Args: wargs, Prefix: true,
	})
}

func randomSeed() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("crypto/rand: %v", err))
		}
		if s := binary.LittleEndian.Uint64(b[:]) >> 1; s != 0 { // fits an int64 flag too
			return s
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}

// rankFromEnv is A2A_RANK, for messages.
func rankFromEnv() int {
	var r int
	if _, err := fmt.Sscan(os.Getenv("A2A_RANK"), &r); err != nil {
		return -1
	}
	return r
}
