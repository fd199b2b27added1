package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/internal/credsfile"
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
	// tenants are the jobs with credentials of their own (nil without
	// tenancy: a2ad run's own control plane, serve --nats).
	tenants *tenancy
}

// view is what the control plane's /metrics and /ui/ show: every group of
// its coordinators.
func (cp *controlPlane) view() serveView { return serveView{shared: cp.svc, tenants: cp.tenants} }

// cpConfig says how to start a control plane.
type cpConfig struct {
	Listen  string // the embedded server's address
	NATSURL string // an external server instead: the service logs in as A2A_NATS_* say
	// Secret is the job secret the service signs and verifies with.
	Secret []byte
	// Users are the clients the embedded server lets in; the service logs
	// in as a user of its own, made here.
	Users                  []natsd.User
	TLSCert, TLSKey, TLSCA string
	// Certificate is the embedded server's certificate in memory (one
	// serve generated), instead of TLSCert and TLSKey.
	Certificate *tls.Certificate
	Insecure    bool
	// Jobs, when set, makes the embedded server mint jobs' own
	// credentials for the admin, each job bounded by these limits.
	Jobs *jobLimits
}

// startControlPlane embeds a NATS server (unless c.NATSURL names one) and
// runs the control-plane service on it.
func startControlPlane(log *slog.Logger, c cpConfig) (*controlPlane, error) {
	cp := &controlPlane{URL: c.NATSURL}
	connectURL := c.NATSURL
	var opts []nats.Option
	var ts *natsd.Tenants
	var err error
	if c.NATSURL == "" {
		svcUser := natsd.NewUser("a2a-service", nil)
		ncfg := natsd.Config{Listen: c.Listen, Users: append(c.Users[:len(c.Users):len(c.Users)], svcUser),
			TLSCert: c.TLSCert, TLSKey: c.TLSKey, TLSCA: c.TLSCA, Certificate: c.Certificate, Insecure: c.Insecure}
		var srv *server.Server
		if c.Jobs != nil {
			ts, err = natsd.StartTenants(ncfg)
			if ts != nil {
				srv = ts.Server
			}
		} else {
			srv, err = natsd.StartServer(ncfg)
		}
		if err != nil {
			return nil, err
		}
		cp.srv, cp.URL = srv, srv.ClientURL()
		// In-process: no socket, no TLS to verify, its own password. The
		// URL must say nats://, not the tls:// of a TLS server: with tls://
		// nats.go starts a handshake on the pipe that the server, which
		// offers in-process clients TLS without requiring it, never answers.
		connectURL = "nats://" + strings.TrimPrefix(cp.URL, "tls://")
		opts = append(svcUser.Options(), nats.InProcessServer(srv))
	} else {
		cfg, err := a2a.ConfigFromEnv()
		if err != nil {
			return nil, err
		}
		cfg.Group = "" // the service replies to every group's inboxes
		if opts, err = cfg.NATSOptions(); err != nil {
			return nil, err
		}
	}
	nc, err := nats.Connect(connectURL, append(opts, nats.Name("a2ad control service"), nats.MaxReconnects(-1))...)
	if err != nil {
		cp.Close()
		return nil, fmt.Errorf("connect to NATS %s: %w", cp.URL, err)
	}
	cp.nc = nc
	svc, err := control.NewService(nc, c.Secret, log)
	if err != nil {
		cp.Close()
		return nil, err
	}
	cp.svc = svc
	if ts != nil {
		if cp.tenants, err = startTenancy(log, ts, connectURL, nc, *c.Jobs); err != nil {
			cp.Close()
			return nil, err
		}
	}
	return cp, nil
}

// dialURL is the URL clients dial for a server's URL: a wildcard listen
// address (0.0.0.0, ::) is no address to dial, so this host's name, which
// its generated certificate names, takes its place.
func dialURL(u string) string {
	scheme, hostPort, ok := strings.Cut(u, "://")
	host, port, err := net.SplitHostPort(hostPort)
	if ip := net.ParseIP(host); !ok || err != nil || ip == nil || !ip.IsUnspecified() {
		return u
	}
	name, err := os.Hostname()
	if err != nil {
		return u
	}
	return scheme + "://" + net.JoinHostPort(name, port)
}

// printReady says that serve is ready, where, and how ranks get its
// credentials (and its CA, as tlsNote says).
func printReady(url, credsFrom, credsPath, tlsNote string) {
	fmt.Printf("a2ad: control plane ready at %s (export A2A_NATS_URL=%s)\n", url, url)
	if credsPath == "" {
		fmt.Printf("a2ad: credentials %s (jobs need the same A2A_SECRET)\n", credsFrom)
		return
	}
	run, job := "a2ad run --nats "+url, "a2ad job new --nats "+url
	if def, err := credsfile.DefaultPath(); err != nil || def != credsPath {
		// run and job new find the default file by themselves
		run, job = run+" --creds "+credsPath, job+" --creds "+credsPath
	}
	fmt.Printf("a2ad: credentials %s (the admin's: %s --out job.env gives a job its own, for export A2A_CREDS=job.env; "+
		"or %s; ranks sharing this file, one job at a time: export A2A_CREDS=%s)\n", credsFrom, job, run, credsPath)
	if tlsNote != "" {
		fmt.Printf("a2ad: %s\n", tlsNote)
	}
}

// serveTLS makes the embedded server's TLS when it is due: beyond loopback
// (or with --tls), unless the user gave a certificate or --insecure. It
// generates a CA and a server certificate for this host's names, and writes
// the CA into the credentials file, which the ranks read with A2A_CREDS and
// trust. Without TLS of its own, an earlier start's CA leaves the file. note
// says what it did, for serve's output.
func serveTLS(cfg *cpConfig, force bool, credsPath string) (note string, err error) {
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return "", usagef("--listen %q: %v", cfg.Listen, err)
	}
	if host == "" {
		host = "127.0.0.1" // as the server takes it (natsd)
	}
	switch {
	case force && (cfg.TLSCert != "" || cfg.Insecure):
		return "", usagef("--tls makes a certificate: not with --tls-cert or --insecure")
	case cfg.TLSCert != "" || cfg.Insecure || (natsd.Loopback(host) && !force):
		if credsPath != "" {
			return "", setCredsCA(credsPath, "")
		}
		return "", nil
	case credsPath == "":
		return "", usagef("TLS with a CA of its own needs a credentials file to give the ranks the CA: " +
			"give --creds FILE, or --tls-cert and --tls-key, or --insecure on a network you trust")
	}
	names := natsd.HostNames(host)
	gen, err := natsd.GenerateTLS(names)
	if err != nil {
		return "", err
	}
	if err := setCredsCA(credsPath, string(gen.CAPEM)); err != nil {
		return "", err
	}
	cfg.Certificate = &gen.Certificate
	return fmt.Sprintf("TLS with a CA made for this start, in %s as A2A_NATS_TLS_CA (the certificate names %s)",
		credsPath, strings.Join(names, ", ")), nil
}

// Close stops the service and the embedded server.
func (cp *controlPlane) Close() {
	if cp.tenants != nil {
		cp.tenants.close()
	}
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
	listen := fs.String("listen", "127.0.0.1:4222", "embedded NATS listen address (beyond loopback: TLS, with a CA of its own unless --tls-cert is given)")
	natsURL := fs.String("nats", "", "use this NATS server instead of embedding one (the service logs in as A2A_NATS_* say)")
	status := fs.Duration("status", 0, "print the group memberships this often (0: never)")
	metricsAddr := fs.String("metrics", "127.0.0.1:9464", "serve Prometheus /metrics of the control plane and the live view /ui/ here (empty: off). "+
		"Keep it on loopback or a trusted network: without authentication, /ui/ shows anyone who connects every group's name, "+
		"its ranks' hosts and PIDs, the bytes between each pair of ranks, their waits and their operations")
	credsFile := fs.String("creds", "", "credentials file: read, or generated (mode 0600) when missing (default: $A2A_SECRET and $A2A_NATS_USER/$A2A_NATS_PASSWORD when A2A_SECRET is set, else serve.env in the user's config dir a2ad/)")
	tlsCert := fs.String("tls-cert", "", "server certificate (PEM): clients connect with TLS (default beyond loopback: a certificate signed by a CA serve makes at each start, which it writes into the credentials file)")
	tlsKey := fs.String("tls-key", "", "key of --tls-cert (PEM)")
	tlsCA := fs.String("tls-ca", "", "require client certificates signed by this CA (PEM), with TLS")
	tlsOwn := fs.Bool("tls", false, "serve TLS with a CA of its own on loopback too (beyond loopback it does unless --tls-cert or --insecure)")
	insecure := fs.Bool("insecure", false, "allow listening beyond loopback without TLS (passwords and messages in clear)")
	var jobs jobLimits
	fs.IntVar(&jobs.Conns, "job-conns", 1024, "most connections (ranks) of one job with credentials of its own (a2ad job new, a2ad run --nats)")
	fs.IntVar(&jobs.Subs, "job-subs", 256, "most subscriptions of one connection of such a job")
	fs.Float64Var(&jobs.Rate, "job-rate", 50000, "most messages per second the coordinator of such a job takes in, the rest dropped (0: no limit); "+
		"a rank sends 4 heartbeats a second and a counts row per AllToAllV")
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	creds, credsFrom, credsPath, err := serveCredentials(*credsFile, *natsURL == "", os.Getenv)
	if err != nil {
		return usageError{err}
	}
	cfg := cpConfig{Listen: *listen, NATSURL: *natsURL, Secret: []byte(creds.Secret),
		TLSCert: *tlsCert, TLSKey: *tlsKey, TLSCA: *tlsCA, Insecure: *insecure}
	var tlsNote string
	if *natsURL == "" {
		// Clients of a2ad serve may run any group: the NATS user reaches
		// the a2a subjects and inboxes of serve's global account, and asks
		// for jobs' own credentials (tenants.go), nothing else.
		cfg.Users = []natsd.User{{Name: creds.User, Password: creds.Password, Allow: []string{"a2a.>", "_INBOX.>", adminJobNew}}}
		if jobs.Conns < 1 || jobs.Subs < 1 || jobs.Rate < 0 {
			return usagef("--job-conns and --job-subs at least 1, --job-rate at least 0")
		}
		cfg.Jobs = &jobs
		if tlsNote, err = serveTLS(&cfg, *tlsOwn, credsPath); err != nil {
			return err
		}
		if h, _, err := net.SplitHostPort(*listen); err == nil && !natsd.Loopback(h) && cfg.TLSCert == "" && cfg.Certificate == nil {
			log.Warn("a2ad: listening beyond loopback without TLS (--insecure): NATS passwords and control messages travel in clear", "listen", *listen)
		}
	} else if *tlsOwn {
		return usagef("--tls is for the embedded server: with --nats, TLS is the NATS server's")
	}
	cp, err := startControlPlane(log, cfg)
	if err != nil {
		return err
	}
	defer cp.Close()
	var uiURL string
	if *metricsAddr != "" {
		addr, err := serveMetricsUI(ctx, cp.view(), *metricsAddr)
		if err != nil {
			return err
		}
		fmt.Printf("a2ad: metrics at http://%s/metrics\n", addr)
		uiURL = "http://" + addr + "/ui/"
	}
	printReady(dialURL(cp.URL), credsFrom, credsPath, tlsNote)
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
			for _, g := range cp.view().Groups() {
				fmt.Printf("group %s epoch %d: %d ranks\n", g.Group, g.Epoch, g.Size)
			}
		}
	}
}

// serveMetricsUI serves /metrics and the live view /ui/ of view (every
// job's coordinator and the shared one) on addr until ctx ends, and
// returns the address it listens on.
func serveMetricsUI(ctx context.Context, view serveView, addr string) (string, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := metrics.RegisterControl(reg, view.Groups); err != nil {
		return "", err
	}
	if err := metrics.RegisterControlRejects(reg, view.Rejects); err != nil {
		return "", err
	}
	if err := metrics.RegisterControlTraffic(reg, view); err != nil { // what /ui/ draws
		return "", err
	}
	if err := metrics.RegisterControlMoE(reg, view); err != nil { // its MoE panel
		return "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(reg))
	tl := newMoETimeline(view) // the MoE panel's history
	go tl.run(ctx)
	mux.Handle("/ui/", uiHandler(view, tl))
	return metrics.ServeHandler(ctx, addr, mux)
}
