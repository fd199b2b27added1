// Command a2ad is the a2a daemon and CLI:
//
//	a2ad serve  [--listen HOST:PORT] [--nats URL]      control plane: embedded NATS + rendezvous/counts service
//	a2ad job new [--group G] [--out FILE]              a job's own credentials from a2ad serve, for a launcher
//	a2ad run    -n N [--nats URL] [--group G] -- PROG [ARGS]   start N local ranks (like mpirun/torchrun)
//	a2ad bench  --op alltoallv -n N --sizes 8:1M ...   nccl-tests style benchmark
//	a2ad demo   [-n 4]                               a verified AllToAllV demo on local ranks
//	a2ad plan   [--algo A] [-n N] [--rounds R] ...     AllToAllV estimates and auto's pick (--rounds: schedules)
//	a2ad tune   [-n N] [--out FILE]                    measure the link table
//	a2ad devices [--require]                           RDMA devices verbs would use, or why none
//
// "a2ad COMMAND -h" prints a command's flags and their valid values.
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

// cmdFunc runs a subcommand with its arguments.
type cmdFunc func(context.Context, *slog.Logger, []string) error

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		usage(os.Stderr)
		os.Exit(2)
	}
	name := args[0]
	switch {
	case name == "-h" || name == "--help" || name == "help" && len(args) == 1:
		usage(os.Stdout)
		return
	case name == "help": // a2ad help CMD: CMD's help
		name, args = args[1], []string{args[1], "-h"}
	case name == "pin": // internal: the trampoline of --bind core
		if err := cmdPin(args[1:]); err != nil {
			fmt.Fprintf(os.Stderr, "a2ad pin: %v\n", err)
			os.Exit(2)
		}
		return
	}
	var c command
	for _, cc := range commands() {
		if cc.name == name {
			c = cc
		}
	}
	if c.run == nil {
		fmt.Fprintf(os.Stderr, "a2ad: unknown command %q\n\n", name)
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := signalContext()
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()}))
	err := c.run(ctx, log, args[1:])
	if err == nil {
		return
	}
	var hr helpRequested
	if errors.As(err, &hr) {
		help(os.Stdout, c, hr.fs)
		return
	}
	// After a signal the error is its consequence (the ranks were stopped, a
	// call was aborted): say so, with the shell's status.
	var sig signalCause
	if errors.As(context.Cause(ctx), &sig) {
		log.Debug("a2ad: "+name+" stopped by a signal", "err", err)
		fmt.Fprintf(os.Stderr, "a2ad %s: %v\n", name, sig)
		os.Exit(128 + int(sig.sig))
	}
	fmt.Fprintf(os.Stderr, "a2ad %s: %v\n", name, err)
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(os.Stderr, "Run \"a2ad %s -h\" for its flags and their valid values.\n", name)
		os.Exit(2)
	}
	os.Exit(1)
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

func (e usageError) Unwrap() error { return e.error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// cmdPin is the hidden trampoline of `--bind core`: a2ad pin CPU PROG ARGS.
func cmdPin(args []string) error {
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
