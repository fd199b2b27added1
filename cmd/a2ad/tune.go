package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/internal/launch"
)

// cmdTune measures the link table of this machine: it starts local ranks,
// the first two of which share a host while the others pose as a second host
// (their traffic with rank 0 goes over the remote data plane, TCP unless
// A2A_TRANSPORT says otherwise), lets rank 0 probe both roles' link classes,
// which the table names, as a probing join does (A2A_LINKS=probe), and prints the table as
// JSON, or writes it to --out for jobs to load with A2A_LINKS=FILE and for
// `a2ad plan --links FILE`.
func cmdTune(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	n := fs.Int("n", 3, "ranks (>= 3 to measure both link classes)")
	out := fs.String("out", "", "write the table here instead of standard output")
	nats := fs.String("nats", "", "join through this NATS server instead of an embedded one")
	worker := fs.Bool("worker", false, "internal: run as one rank")
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if *worker {
		return tuneWorker(ctx, log, *out)
	}
	if *n < 2 {
		return usagef("-n %d: need at least 2 ranks", *n)
	}
	// Unbound: only two ranks are busy at a time (rank 0 and the peer it
	// probes), and the scheduler gives them a core each. No A2A_LINKS=probe
	// here: tuneWorker sets it, however its rank was started.
	return launchSelf(ctx, log, "tune", args, launch.Spec{N: *n, NATSURL: *nats})
}

func tuneWorker(ctx context.Context, log *slog.Logger, out string) error {
	c, err := joinWorker(ctx, log, func(cfg *a2a.Config) {
		cfg.Links = a2a.LinksProbe
		if cfg.Host == "" && cfg.Rank >= 0 {
			// Ranks 0 and 1 share a host; the rest pose as another one.
			cfg.Host = fmt.Sprintf("tune-host-%d", min(cfg.Rank/2, 1))
		}
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Rank() != 0 {
		return nil
	}
	b, err := json.MarshalIndent(c.Links(), "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if out == "" {
		_, err = os.Stdout.Write(b)
		return err
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return err
	}
	l := c.Links()
	fmt.Printf("a2ad tune: wrote %s: local (%s) alpha %.2fus %.2f GB/s, remote (%s) alpha %.2fus %.2f GB/s",
		out, l.LocalClass, l.Local.Alpha*1e6, 1/l.Local.Beta/1e9, l.RemoteClass, l.Remote.Alpha*1e6, 1/l.Remote.Beta/1e9)
	if l.MappedClass != "" {
		fmt.Printf(", registered buffers (%s) alpha %.2fus %.2f GB/s", l.MappedClass, l.Mapped.Alpha*1e6, 1/l.Mapped.Beta/1e9)
	}
	fmt.Println()
	return nil
}
