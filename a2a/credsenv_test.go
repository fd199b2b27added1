package a2a

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/internal/credsfile"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// clearCredsEnv empties every variable of the A2A_CREDS file's kind, so that
// the tests do not depend on a launcher's or user's environment.
func clearCredsEnv(t *testing.T) {
	for _, k := range append([]string{"A2A_CREDS"}, credsVars...) {
		t.Setenv(k, "")
	}
}

// writeCredsFile writes a credentials file as a2ad serve does.
func writeCredsFile(t *testing.T, vars ...credsfile.Var) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "serve.env")
	if err := credsfile.Write(path, nil, vars, false); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConfigFromEnvCreds: A2A_CREDS fills the login, the CA, the secret and
// the group (of a job file), nothing else;
// a variable set in the environment wins, and a login set there replaces the
// file's whole; a file that cannot be read is ErrInvalidArgument naming it.
func TestConfigFromEnvCreds(t *testing.T) {
	clearEnv(t)
	clearCredsEnv(t)
	path := writeCredsFile(t, credsfile.Var{Key: "A2A_NATS_USER", Value: "a2a"}, credsfile.Var{Key: "A2A_NATS_PASSWORD", Value: "pw"},
		credsfile.Var{Key: "A2A_SECRET", Value: "filesecret"}, credsfile.Var{Key: "A2A_NATS_TLS_CA", Value: "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----"},
		credsfile.Var{Key: "A2A_GROUP", Value: "jobgroup"}, credsfile.Var{Key: "A2A_ALGO", Value: "not-a-credential"})
	t.Setenv("A2A_CREDS", path)
	cfg, err := ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATSUser != "a2a" || cfg.NATSPassword != "pw" || cfg.Secret != "filesecret" || !strings.HasPrefix(cfg.NATSTLSCA, "-----BEGIN") ||
		cfg.CredsFile != path || cfg.Group != "jobgroup" || cfg.Algo != "" {
		t.Errorf("from the file: %+v", cfg)
	}
	t.Setenv("A2A_SECRET", "envsecret")
	t.Setenv("A2A_NATS_TOKEN", "tok")
	t.Setenv("A2A_GROUP", "envgroup")
	if cfg, err = ConfigFromEnv(); err != nil {
		t.Fatal(err)
	}
	if cfg.Secret != "envsecret" || cfg.NATSToken != "tok" || cfg.Group != "envgroup" || cfg.NATSUser != "" || cfg.NATSPassword != "" || cfg.NATSTLSCA == "" {
		t.Errorf("environment over the file: secret %q token %q user %q password %q CA %q", cfg.Secret, cfg.NATSToken, cfg.NATSUser, cfg.NATSPassword, cfg.NATSTLSCA)
	}
	t.Setenv("A2A_CREDS", filepath.Join(t.TempDir(), "missing.env"))
	if _, err = ConfigFromEnv(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "A2A_CREDS=") {
		t.Errorf("a missing file: %v, want ErrInvalidArgument naming A2A_CREDS", err)
	}
}

// TestJoinWithCredsFile runs a control plane as a2ad serve does beyond
// loopback: TLS with a CA of its own, whose certificate, with the NATS login
// and the secret, is in a credentials file. Ranks given A2A_CREDS alone join
// and exchange counts. Ranks without it are refused by an error that says
// how to pass the file; ranks with another serve's file, by one that names
// the file.
func TestJoinWithCredsFile(t *testing.T) {
	clearEnv(t)
	clearCredsEnv(t)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // where serve's default file would be
	gen, err := natsd.GenerateTLS(natsd.HostNames("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	user := natsd.NewUser("a2a", nil)
	srv, err := natsd.StartServer(natsd.Config{Listen: "127.0.0.1:0", Users: []natsd.User{user}, Certificate: &gen.Certificate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := "nats://" + strings.TrimPrefix(srv.ClientURL(), "tls://") // a URL as the docs show it: TLS because the server says so
	path := writeCredsFile(t, credsfile.Var{Key: "A2A_NATS_USER", Value: user.Name}, credsfile.Var{Key: "A2A_NATS_PASSWORD", Value: user.Password},
		credsfile.Var{Key: "A2A_SECRET", Value: "s"}, credsfile.Var{Key: "A2A_NATS_TLS_CA", Value: string(gen.CAPEM)})
	t.Setenv("A2A_NATS_URL", url)

	fromEnv := func(t *testing.T) Config {
		t.Helper()
		cfg, err := ConfigFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	joinFails := func(t *testing.T, want ...string) {
		t.Helper()
		cfg := fromEnv(t)
		cfg.Group, cfg.Rank, cfg.WorldSize, cfg.Logger = "credsfail", 0, 2, discard
		err := joinRefused(t, cfg)
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("the error does not say %q: %v", w, err)
			}
		}
	}
	t.Run("no credentials", func(t *testing.T) {
		// TLS first: without the CA the certificate does not verify.
		def, _ := credsfile.DefaultPath()
		joinFails(t, "does not verify", "A2A_CREDS=FILE", def, "mpirun -x A2A_CREDS", "a2ad run --nats URL --creds FILE")
		// With the CA but no login: the server refuses it.
		t.Setenv("A2A_NATS_TLS_CA", string(gen.CAPEM))
		joinFails(t, "no credentials given", "A2A_CREDS=FILE", def, "mpirun -x A2A_CREDS", "a2ad run --nats URL --creds FILE")
	})
	t.Run("another serve's file", func(t *testing.T) {
		other := writeCredsFile(t, credsfile.Var{Key: "A2A_NATS_USER", Value: user.Name}, credsfile.Var{Key: "A2A_NATS_PASSWORD", Value: "stale"},
			credsfile.Var{Key: "A2A_SECRET", Value: "s"}, credsfile.Var{Key: "A2A_NATS_TLS_CA", Value: string(gen.CAPEM)})
		t.Setenv("A2A_CREDS", other)
		joinFails(t, "A2A_CREDS="+other+" were refused", "the a2ad serve at this URL")
		otherCA, err := natsd.GenerateTLS([]string{"localhost"})
		if err != nil {
			t.Fatal(err)
		}
		other = writeCredsFile(t, credsfile.Var{Key: "A2A_NATS_USER", Value: user.Name}, credsfile.Var{Key: "A2A_NATS_PASSWORD", Value: user.Password},
			credsfile.Var{Key: "A2A_NATS_TLS_CA", Value: string(otherCA.CAPEM)})
		t.Setenv("A2A_CREDS", other)
		joinFails(t, "the CA of A2A_CREDS="+other+" does not sign it")
	})
	t.Run("A2A_CREDS alone", func(t *testing.T) {
		t.Setenv("A2A_CREDS", path)
		cfg := fromEnv(t)
		if cfg.Secret != "s" {
			t.Fatalf("secret %q, want the file's", cfg.Secret)
		}
		comms := group(t, url, 2, func(c *Config) {
			group := c.Group
			rank := c.Rank
			*c = cfg
			c.Group, c.Rank, c.WorldSize, c.Logger = group, rank, 2, discard
			c.HeartbeatInterval, c.PeerTimeout = 100*time.Millisecond, time.Second
		})
		mustAll(t, onAll(comms, func(c *Comm) error {
			_, err := c.ExchangeCounts(context.Background(), []int{1, 2})
			return err
		}))
	})
}

// TestJoinOverConnectionLimit: a rank whose job (its NATS account on a2ad
// serve) holds all the connections it may fails Join with ErrResource,
// not as refused credentials.
func TestJoinOverConnectionLimit(t *testing.T) {
	clearEnv(t)
	clearCredsEnv(t)
	ts, err := natsd.StartTenants(natsd.Config{Users: []natsd.User{natsd.NewUser("admin", nil)}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ts.Shutdown(); ts.WaitForShutdown() }()
	u := natsd.NewUser("job-1", nil)
	if err := ts.AddAccount(natsd.Account{Name: "job-1", Users: []natsd.User{u}, Limits: natsd.Limits{Conns: 1}}); err != nil {
		t.Fatal(err)
	}
	held, err := nats.Connect(ts.ClientURL(), u.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Join(ctx, Config{NATSURL: ts.ClientURL(), NATSUser: u.Name, NATSPassword: u.Password, Group: "g", Rank: 0, WorldSize: 1})
	if !errors.Is(err, ErrResource) || errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "--job-conns") {
		t.Fatalf("join over the job's connection limit: %v, want ErrResource naming --job-conns", err)
	}
}

// TestJoinOverSubscriptionLimit: a rank whose job (its NATS account) may
// hold fewer subscriptions per connection than a member makes fails Join at
// once with ErrResource naming --job-subs, instead of waiting out its
// deadline for replies the server will never deliver.
func TestJoinOverSubscriptionLimit(t *testing.T) {
	clearEnv(t)
	clearCredsEnv(t)
	ts, err := natsd.StartTenants(natsd.Config{Users: []natsd.User{natsd.NewUser("admin", nil)}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ts.Shutdown(); ts.WaitForShutdown() }()
	u := natsd.NewUser("job-1", nil)
	if err := ts.AddAccount(natsd.Account{Name: "job-1", Users: []natsd.User{u}, Limits: natsd.Limits{Subs: 2}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err = Join(ctx, Config{NATSURL: ts.ClientURL(), NATSUser: u.Name, NATSPassword: u.Password, Group: "g", Rank: 0, WorldSize: 1})
	if !errors.Is(err, ErrResource) || !strings.Contains(err.Error(), "--job-subs") {
		t.Fatalf("join over the job's subscription limit: %v, want ErrResource naming --job-subs", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("join took %v to fail, want it at once", d)
	}
}
