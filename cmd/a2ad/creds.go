package main

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/a2a-moe/a2a/internal/credsfile"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// serveCreds are what a2ad serve lets in (the clients' NATS user, when it
// embeds the server) and signs and verifies control messages with (the job
// secret of the groups it coordinates). They live in an env-style file, mode
// 0600 (package credsfile), that a job reads with A2A_CREDS=FILE, `a2ad run
// --creds FILE` or a shell with `set -a; . FILE; set +a`.
type serveCreds struct {
	User, Password, Secret string
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
		if path, err = credsfile.DefaultPath(); err != nil {
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
	vars, err := credsfile.Read(path)
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

// credsHeader opens the credentials file: what it is and how a job uses it.
var credsHeader = []string{
	"a2ad serve credentials, the admin's: keep private. A job gets credentials of its own with",
	"  a2ad job new --nats URL --out job.env   (then export A2A_CREDS=job.env; launchers pass it on)",
	"  a2ad run --nats URL ...      (reads this file when it is the default one, else give --creds THIS_FILE, and asks serve)",
	"Ranks may also use this file itself, sharing its secret with every job that does (one job at a time):",
	"  export A2A_CREDS=THIS_FILE   (launchers pass it on: mpirun -x A2A_CREDS; srun, torchrun inherit it)",
	"  set -a; . THIS_FILE; set +a  (every variable on its own)",
}

func writeCreds(path string, c serveCreds) error {
	var vars []credsfile.Var
	if c.User != "" {
		vars = append(vars, credsfile.Var{Key: "A2A_NATS_USER", Value: c.User}, credsfile.Var{Key: "A2A_NATS_PASSWORD", Value: c.Password})
	}
	vars = append(vars, credsfile.Var{Key: "A2A_SECRET", Value: c.Secret})
	return credsfile.Write(path, credsHeader, vars, false)
}

// credsOrder is the order of the variables serve writes; others a user added
// follow, sorted.
var credsOrder = []string{"A2A_NATS_USER", "A2A_NATS_PASSWORD", "A2A_SECRET", "A2A_NATS_TLS_CA"}

// setCredsCA keeps the A2A_NATS_TLS_CA of serve's credentials file in step
// with what this start serves: caPEM, the CA it made for its TLS (every start
// makes a new one), or when caPEM is empty no CA, if the file's is one an
// earlier start wrote (a PEM: a path is the user's and stays). The file is
// replaced whole, so a rank reading it sees the old or the new one.
func setCredsCA(path, caPEM string) error {
	vars, err := credsfile.Read(path)
	if err != nil {
		return err
	}
	old := vars["A2A_NATS_TLS_CA"]
	if old == caPEM || (caPEM == "" && !strings.HasPrefix(old, "-----BEGIN")) {
		return nil
	}
	if caPEM == "" {
		delete(vars, "A2A_NATS_TLS_CA")
	} else {
		vars["A2A_NATS_TLS_CA"] = caPEM
	}
	var out []credsfile.Var
	for _, k := range credsOrder {
		if v, ok := vars[k]; ok {
			out = append(out, credsfile.Var{Key: k, Value: v})
			delete(vars, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		out = append(out, credsfile.Var{Key: k, Value: vars[k]})
	}
	return credsfile.Write(path, credsHeader, out, true)
}
