// Command a2ad is the a2a daemon and CLI:
//
//	a2ad serve  [--listen HOST:PORT] [--nats URL]      control plane: embedded NATS + rendezvous/counts service
//	a2ad run    -n N [--nats URL] [--group G] -- PROG [ARGS]   start N local ranks (like mpirun/torchrun)
//	a2ad bench  --op alltoallv -n N --sizes 8:1M ...   nccl-tests style benchmark
//	a2ad demo   [-n 4]                               a verified AllToAllV demo on local ranks
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/internal/launch"
)

const usage = `a2ad: the a2a all-to-all service

usage:
  a2ad serve [--listen HOST:PORT] [--nats URL]
  a2ad run -n N [--nats URL] [--group G] [--world W --rank-offset R] -- PROG [ARGS...]
  a2ad bench [--op alltoallv|alltoall] [-n N] [--algo A] [--sizes MIN:MAX] [--dist D]
             [--iters I] [--warmup W] [--check] [--json] [--nats URL]
  a2ad demo [-n N] [--steps S]
  a2ad plan [--algo A] [-n N] [--dist D] [--sizes S] [--hosts H] [--links FILE]
             print schedules and estimated times, run nothing
  a2ad tune [-n N] [--out FILE]   measure the link table (alpha, beta per link class)

Run "a2ad COMMAND -h" for a command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signalContext()
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))
	cmds := map[string]func(context.Context, *slog.Logger, []string) error{
		"serve": cmdServe,
		"run":   cmdRun,
		"bench": cmdBench,
		"demo":  cmdDemo,
		"pin":   cmdPin,
		"plan":  cmdPlan,
		"tune":  cmdTune,
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		fmt.Print(usage)
		return
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "a2ad: unknown command %q\n\n%s", name, usage)
		os.Exit(2)
	}
	if err := cmd(ctx, log, os.Args[2:]); err != nil {
		// After a signal the error is its consequence (the ranks were
		// stopped, a call was aborted): say so, with the shell's status.
		var sig signalCause
		if errors.As(context.Cause(ctx), &sig) {
			log.Debug("a2ad: "+name+" stopped by a signal", "err", err)
			fmt.Fprintf(os.Stderr, "a2ad %s: %v\n", name, sig)
			os.Exit(128 + int(sig.sig))
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(os.Stderr, "a2ad %s: %v\n", name, err)
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "a2ad %s: %v\n", name, err)
		os.Exit(1)
	}
}

// signalCause is the cause of the main context's end when SIGINT or SIGTERM
// arrived.
type signalCause struct{ sig syscall.Signal }

func (s signalCause) Error() string { return "interrupted by " + unix.SignalName(s.sig) }

// signalContext is a context cancelled with a signalCause by the first
// SIGINT or SIGTERM, so the exit status can name the signal as shells do
// (130 for SIGINT). Later signals are caught too: the first one already
// stops the ranks, in their grace period.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-ch:
			cancel(signalCause{s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(ch); cancel(nil) }
}

// usageError is a bad command line (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// cmdPin is the hidden trampoline of `--bind core`: a2ad pin CPU PROG ARGS.
func cmdPin(_ context.Context, _ *slog.Logger, args []string) error {
	if len(args) < 2 {
		return usagef("pin CPU PROG [ARGS]")
	}
	cpu, err := strconv.Atoi(args[0])
	if err != nil {
		return usagef("pin: cpu %q", args[0])
	}
	return launch.ExecPinned(cpu, args[1], args[2:])
}

func logLevel() slog.Level {
	var l slog.Level
	if s := os.Getenv("A2A_LOG"); s != "" && l.UnmarshalText([]byte(s)) == nil {
		return l
	}
	return slog.LevelWarn
}
