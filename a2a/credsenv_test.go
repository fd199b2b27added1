package a2a

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/a2a-moe/a2a/internal/credsfile"
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

// TestConfigFromEnvCreds: A2A_CREDS fills the login, the CA and the secret;
// a variable set in the environment wins, and a login set there replaces the
// file's whole; a file that cannot be read is ErrInvalidArgument naming it.
func TestConfigFromEnvCreds(t *testing.T) {
	clearEnv(t)
	clearCredsEnv(t)
	path := writeCredsFile(t, credsfile.Var{Key: "A2A_NATS_USER", Value: "a2a"}, credsfile.Var{Key: "A2A_NATS_PASSWORD", Value: "pw"},
		credsfile.Var{Key: "A2A_SECRET", Value: "filesecret"}, credsfile.Var{Key: "A2A_NATS_TLS_CA", Value: "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----"},
		credsfile.Var{Key: "A2A_GROUP", Value: "not-a-credential"})
	t.Setenv("A2A_CREDS", path)
	cfg, err := ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATSUser != "a2a" || cfg.NATSPassword != "pw" || cfg.Secret != "filesecret" || !strings.HasPrefix(cfg.NATSTLSCA, "-----BEGIN") ||
		cfg.CredsFile != path || cfg.Group != "" {
		t.Errorf("from the file: %+v", cfg)
	}
	t.Setenv("A2A_SECRET", "envsecret")
	t.Setenv("A2A_NATS_TOKEN", "tok")
	if cfg, err = ConfigFromEnv(); err != nil {
		t.Fatal(err)
	}
	if cfg.Secret != "envsecret" || cfg.NATSToken != "tok" || cfg.NATSUser != "" || cfg.NATSPassword != "" || cfg.NATSTLSCA == "" {
		t.Errorf("environment over the file: secret %q token %q user %q password %q CA %q", cfg.Secret, cfg.NATSToken, cfg.NATSUser, cfg.NATSPassword, cfg.NATSTLSCA)
	}
	t.Setenv("A2A_CREDS", filepath.Join(t.TempDir(), "missing.env"))
	if _, err = ConfigFromEnv(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "A2A_CREDS=") {
		t.Errorf("a missing file: %v, want ErrInvalidArgument naming A2A_CREDS", err)
	}
}
