package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/a2a-moe/a2a/internal/natsd"
)

// serveCreds are what a2ad serve lets in (the clients' NATS user, when it
// embeds the server) and signs and verifies control messages with (the job
// secret of the groups it coordinates). They live in an env-style file, mode
// 0600, that a job reads with `a2ad run --creds FILE` or a shell with
// `set -a; . FILE; set +a`.
type serveCreds struct {
	User, Password, Secret string
}

// defaultCredsFile is where a2ad serve keeps its credentials unless told:
// in the user's configuration directory, not in a shared temp directory.
func defaultCredsFile() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no configuration directory for the credentials file (%v): give --creds FILE", err)
	}
	return filepath.Join(dir, "a2ad", "serve.env"), nil
}

// serveCredentials finds a2ad serve's credentials and says where from: the
// file of --creds (read, or generated when missing); else the environment
// when it sets A2A_SECRET, as a container gets its Secret (a NATS user too,
// A2A_NATS_USER and A2A_NATS_PASSWORD, when serve embeds the server); else
// the default file. file is the file's path ("" for the environment).
// getenv is os.Getenv outside tests.
func serveCredentials(flagPath string, needUser bool, getenv func(string) string) (c serveCreds, from, file string, err error) {
	if flagPath == "" && getenv("A2A_SECRET") != "" {
		c = serveCreds{User: getenv("A2A_NATS_USER"), Password: getenv("A2A_NATS_PASSWORD"), Secret: getenv("A2A_SECRET")}
		if needUser && (c.User == "" || c.Password == "") {
			return c, "", "", errors.New("A2A_SECRET is set but A2A_NATS_USER and A2A_NATS_PASSWORD are not: " +
				"the embedded server needs the clients' user (or give --creds FILE)")
		}
		return c, "from the environment (A2A_SECRET)", "", nil
	}
	path := flagPath
	if path == "" {
		if path, err = defaultCredsFile(); err != nil {
			return c, "", "", err
		}
	}
	c, created, err := loadOrCreateCreds(path, needUser)
	if err != nil {
		return c, "", "", err
	}
	if created {
		return c, "generated in " + path, path, nil
	}
	return c, "read in " + path, path, nil
}

// loadOrCreateCreds reads path, or when it does not exist generates
// credentials and writes them there (0600, its directory 0700). needUser:
// the file must hold a NATS user (a2ad serve embeds the server).
func loadOrCreateCreds(path string, needUser bool) (c serveCreds, created bool, err error) {
	vars, err := readEnvFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		c = serveCreds{Secret: natsd.RandomHex(32)}
		if needUser {
			c.User, c.Password = "a2a", natsd.RandomHex(16)
		}
		if err := writeCreds(path, c); err != nil {
			return c, false, err
		}
		return c, true, nil
	}
	if err != nil {
		return c, false, err
	}
	c = serveCreds{User: vars["A2A_NATS_USER"], Password: vars["A2A_NATS_PASSWORD"], Secret: vars["A2A_SECRET"]}
	switch {
	case c.Secret == "":
		return c, false, fmt.Errorf("credentials file %s has no A2A_SECRET", path)
	case needUser && (c.User == "" || c.Password == ""):
		return c, false, fmt.Errorf("credentials file %s has no A2A_NATS_USER and A2A_NATS_PASSWORD", path)
	}
	return c, false, nil
}

func writeCreds(path string, c serveCreds) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# a2ad serve credentials: keep private. A job uses them with\n")
	b.WriteString("#   a2ad run --nats URL --creds THIS_FILE ...   or   set -a; . THIS_FILE; set +a\n")
	if c.User != "" {
		fmt.Fprintf(&b, "A2A_NATS_USER=%s\nA2A_NATS_PASSWORD=%s\n", c.User, c.Password)
	}
	fmt.Fprintf(&b, "A2A_SECRET=%s\n", c.Secret)
	// O_EXCL: never write through a file or link someone else put there.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readEnvFile reads KEY=VALUE lines (blank lines and # comments skipped). It
// refuses a file that others may read or write, as ssh does with keys.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("credentials file %s is accessible to others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: not KEY=VALUE", path, n)
		}
		vars[strings.TrimSpace(strings.TrimPrefix(k, "export "))] = strings.Trim(strings.TrimSpace(v), `"'`)
	}
	return vars, sc.Err()
}
