package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/natsd"
	"github.com/a2a-moe/a2a/metrics"
)

// controlPlane is a running control plane: an embedded NATS server (unless an
// external URL was given) and the rendezvous/counts service.
type controlPlane struct {
	URL string
	srv *server.Server
	nc  *nats.Conn
	svc *control.Service
}

// startControlPlane embeds a NATS server on listen (when natsURL is empty) and
// runs the control-plane service on it (or on the external server).
func startControlPlane(log *slog.Logger, listen, natsURL string) (*controlPlane, error) {
	cp := &controlPlane{URL: natsURL}
	if natsURL == "" {
		srv, err := natsd.Start(listen)
		if err != nil {
			return nil, err
		}
		cp.srv, cp.URL = srv, srv.ClientURL()
	}
	nc, err := nats.Connect(cp.URL, nats.Name("a2ad control service"), nats.MaxReconnects(-1))
	if err != nil {
		cp.Close()
		return nil, fmt.Errorf("connect to NATS %s: %w", cp.URL, err)
	}
	cp.nc = nc
	svc, err := control.NewService(nc, log)
	if err != nil {
		cp.Close()
		return nil, err
	}
	cp.svc = svc
	return cp, nil
}

// Close stops the service and the embedded server.
func (cp *controlPlane) Close() {
	if cp.svc != nil {
		cp.svc.Close()
	}
	if cp.nc != nil {
		cp.nc.Close()
	}
	if cp.srv != nil {
		cp.srv.Shutdown()
		cp.srv.WaitForShutdown()
	}
}

func cmdServe(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:4222", "embedded NATS listen address")
	natsURL := fs.String("nats", "", "use this NATS server instead of embedding one")
	status := fs.Duration("status", 0, "print the group memberships this often (0: never)")
	metricsAddr := fs.String("metrics", "127.0.0.1:9464", "serve Prometheus /metrics of the control plane and the live view /ui/ here (empty: off). "+
		"Keep it on loopback or a trusted network: without authentication, /ui/ shows anyone who connects every group's name, "+
		"its ranks' hosts and PIDs, the bytes between each pair of ranks, their waits and their operations")
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	cp, err := startControlPlane(log, *listen, *natsURL)
	if err != nil {
		return err
	}
	defer cp.Close()
	var uiURL string
	if *metricsAddr != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		if err := metrics.RegisterControl(reg, cp.svc.Groups); err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler(reg))
		mux.Handle("/ui/", uiHandler(cp.svc))
		addr, err := metrics.ServeHandler(ctx, *metricsAddr, mux)
		if err != nil {
			return err
		}
		fmt.Printf("a2ad: metrics at http://%s/metrics\n", addr)
		uiURL = "http://" + addr + "/ui/"
	}
	fmt.Printf("a2ad: control plane ready at %s (export A2A_NATS_URL=%s)\n", cp.URL, cp.URL)
	if uiURL != "" {
		fmt.Printf("a2ad: live view at %s\n", uiURL)
	}
	var tick <-chan time.Time
	if *status > 0 {
		t := time.NewTicker(*status)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Println("a2ad: shutting down")
			return nil
		case <-tick:
			for _, g := range cp.svc.Groups() {
				fmt.Printf("group %s epoch %d: %d ranks\n", g.Group, g.Epoch, g.Size)
			}
		}
	}
}
