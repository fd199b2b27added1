package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestServeCredentials checks where a2ad serve takes its credentials from:
// --creds first, then an environment that sets A2A_SECRET (a container's
// Secret), then the default file; and that it refuses what cannot work.
func TestServeCredentials(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config")) // the default file's directory
	existing := filepath.Join(dir, "existing.env")
	if err := os.WriteFile(existing, []byte("A2A_NATS_USER=u\nA2A_NATS_PASSWORD=p\nA2A_SECRET=filesecret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	tests := []struct {
		name       string
		flag       string
		needUser   bool
		getenv     func(string) string
		wantSecret string // "" : any fresh one
		wantFrom   string
		wantFile   string
		wantErr    string
	}{
		{"flag file wins over the environment", existing, true, env("A2A_SECRET", "envsecret"), "filesecret", "read in " + existing, existing, ""},
		{"environment with --nats", "", false, env("A2A_SECRET", "envsecret"), "envsecret", "from the environment", "", ""},
		{"environment with its user when embedding", "", true,
			env("A2A_SECRET", "envsecret", "A2A_NATS_USER", "a2a", "A2A_NATS_PASSWORD", "pw"), "envsecret", "from the environment", "", ""},
		{"environment without a user when embedding", "", true, env("A2A_SECRET", "envsecret"), "", "", "", "A2A_NATS_USER"},
		{"default file generated", "", true, env(), "", "generated in ", filepath.Join(dir, "config", "a2ad", "serve.env"), ""},
		{"default file read the second time", "", true, env(), "", "read in ", filepath.Join(dir, "config", "a2ad", "serve.env"), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, from, file, err := serveCredentials(tc.flag, tc.needUser, tc.getenv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(from, tc.wantFrom) || file != tc.wantFile {
				t.Errorf("from %q file %q, want %q... and %q", from, file, tc.wantFrom, tc.wantFile)
			}
			if (tc.wantSecret != "" && c.Secret != tc.wantSecret) || len(c.Secret) < 8 {
				t.Errorf("secret %q, want %q", c.Secret, tc.wantSecret)
			}
			if tc.needUser && (c.User == "" || c.Password == "") {
				t.Errorf("no NATS user for the embedded server: %+v", c)
			}
		})
	}
}

// TestRunFindsServeCredentials checks which credentials `a2ad run` gives its ranks:
// with --nats, --creds FILE's variables, else A2A_CREDS, else serve's default
// file when it exists (no flag needed), else none; never any without --nats.
func TestRunFindsServeCredentials(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	log := slog.New(slog.DiscardHandler)
	own := filepath.Join(dir, "own.env")
	if err := os.WriteFile(own, []byte("A2A_NATS_USER=u\nA2A_NATS_PASSWORD=p\nA2A_SECRET=ownsecret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	check := func(name string, gotEnv []string, secret string, err error, wantEnv []string, wantSecret string) {
		t.Helper()
		if err != nil || !slices.Equal(gotEnv, wantEnv) || secret != wantSecret {
			t.Errorf("%s: env %q secret %q err %v, want env %q secret %q", name, gotEnv, secret, err, wantEnv, wantSecret)
		}
	}
	e, v, err := runCredentials(log, "", true, env())
	check("no file yet", e, v["A2A_SECRET"], err, nil, "")
	e, v, err = runCredentials(log, own, true, env())
	check("--creds", e, v["A2A_SECRET"], err, []string{"A2A_NATS_PASSWORD=p", "A2A_NATS_USER=u"}, "ownsecret")
	e, v, err = runCredentials(log, "", true, env("A2A_CREDS", own))
	check("A2A_CREDS", e, v["A2A_SECRET"], err, []string{"A2A_CREDS=" + own}, "ownsecret")
	c, _, def, err := serveCredentials("", true, env())
	if err != nil {
		t.Fatal(err)
	}
	e, v, err = runCredentials(log, "", true, env())
	check("serve's default file", e, v["A2A_SECRET"], err, []string{"A2A_CREDS=" + def}, c.Secret)
	e, v, err = runCredentials(log, "", false, env("A2A_CREDS", own))
	check("embedded control plane", e, v["A2A_SECRET"], err, nil, "")
}
