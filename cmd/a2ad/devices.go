package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"text/tabwriter"

	"golang.org/x/sys/unix"

	"github.com/a2a-moe/a2a/verbs"
)

// cmdDevices prints what the verbs transport finds: each RDMA device with its ports (state,
// link layer, MTU, LID) and GID tables (index, value, type, netdev), the ports A2A_IB_HCA
// and A2A_IB_GID_INDEX select, and RLIMIT_MEMLOCK; or why verbs is unavailable here.
// With --require a machine where verbs cannot carry traffic is an error (exit status 1).
func cmdDevices(_ context.Context, _ *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("devices", flag.ContinueOnError)
	require := fs.Bool("require", false, "fail unless at least one port can carry verbs traffic")
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usagef("devices takes no arguments")
	}
	err := printDevices(os.Stdout)
	if err != nil && errors.Is(err, verbs.ErrUnavailable) && !*require {
		fmt.Println(err)
		return nil
	}
	return err
}

func printDevices(w io.Writer) error {
	cfg, err := verbs.ConfigFromEnv()
	if err != nil {
		return err
	}
	lib, err := verbs.Load()
	if err != nil {
		return err
	}
	devs, err := lib.Devices()
	if err != nil {
		return err
	}
	eps, epErr := verbs.Endpoints(devs, cfg)
	chosen := map[string]int{} // "dev:port" -> GID index in use
	for _, e := range eps {
		chosen[e.Device+":"+strconv.Itoa(e.Port)] = e.GIDIndex
	}
	fmt.Fprintf(w, "verbs: %s loaded, %d device(s)\n", verbs.DefaultLibrary, len(devs))
	for _, d := range devs {
		fmt.Fprintf(w, "%s: fw %s, node GUID %016x, max QP WRs %d, max SGEs %d, max CQEs %d, max MR size %d\n",
			d.Name, d.FWVer, d.NodeGUID, d.MaxQPWR, d.MaxSGE, d.MaxCQE, d.MaxMRSize)
		for _, p := range d.Ports {
			fmt.Fprintf(w, "  port %d: %v (%v), %v, MTU %v (max %v), LID %d\n",
				p.Num, p.State, p.PhysState, p.LinkLayer, p.ActiveMTU, p.MaxMTU, p.LID)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			use, inUse := chosen[d.Name+":"+strconv.Itoa(p.Num)]
			for _, g := range p.GIDs {
				mark := ""
				if inUse && g.Index == use {
					mark = "<- selected"
				}
				fmt.Fprintf(tw, "    GID %d\t%v\t%v\t%s\t%s\n", g.Index, g.GID, g.Type, g.Netdev, mark)
			}
			tw.Flush()
		}
	}
	hca := cfg.HCA
	if hca == "" {
		hca = "(all)"
	}
	gid := "auto: RoCE v2 IPv4-mapped"
	if cfg.GIDIndex >= 0 {
		gid = strconv.Itoa(cfg.GIDIndex)
	}
	fmt.Fprintf(w, "selected with A2A_IB_HCA=%s, A2A_IB_GID_INDEX=%s:\n", hca, gid)
	for _, e := range eps {
		fmt.Fprintf(w, "  %v\n", e)
	}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) == nil {
		limit := "unlimited"
		if rl.Cur != unix.RLIM_INFINITY {
			limit = strconv.FormatUint(rl.Cur, 10) + " bytes"
		}
		note := ""
		if verbs.CheckMemlock(1<<30) != nil {
			note = " (registering 1 GiB would fail: raise it, e.g. ulimit -l unlimited)"
		}
		fmt.Fprintf(w, "RLIMIT_MEMLOCK: %s%s\n", limit, note)
	}
	return epErr
}
