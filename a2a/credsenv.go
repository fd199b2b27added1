package a2a

import (
	"slices"

	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/internal/credsfile"
)

// natsLoginVars choose how a rank logs in to NATS: one way at most.
var natsLoginVars = []string{"A2A_NATS_CREDS", "A2A_NATS_NKEY", "A2A_NATS_USER", "A2A_NATS_PASSWORD", "A2A_NATS_TOKEN"}

// credsVars are the variables ConfigFromEnv takes from the A2A_CREDS file:
// the NATS login, the TLS settings, the job secret and the group. The group
// is there because a job file of a2ad serve (`a2ad job new`) holds a login
// that reaches that one group: a launcher's group would be refused. Others in
// the file (a2ad run --creds passes any A2A_* variable) are not credentials
// and are left to the environment.
var credsVars = append(slices.Clone(natsLoginVars), "A2A_NATS_TLS_CA", "A2A_NATS_TLS_CERT", "A2A_NATS_TLS_KEY", "A2A_SECRET", "A2A_GROUP")

// withCredsFile returns getenv extended by the credentials file that
// A2A_CREDS names (package credsfile reads it; a2ad serve writes it), and the
// file's path ("" when A2A_CREDS is unset). A variable the environment sets
// to a non-empty value wins over the file's: a launcher may pass one file to
// every job and one job may still override a part of it. A login in the
// environment (any of natsLoginVars) replaces the file's login whole, so that
// the two never mix into an invalid pair such as a token and a user.
func withCredsFile(getenv func(string) string) (func(string) string, string, error) {
	path := getenv("A2A_CREDS")
	if path == "" {
		return getenv, "", nil
	}
	vars, err := credsfile.Read(path)
	if err != nil {
		return getenv, path, fault.Wrap(fault.ErrInvalidArgument, -1, err,
			"A2A_CREDS=%s: the credentials file of a2ad serve cannot be read (serve prints its path when it starts)", path)
	}
	envLogin := slices.ContainsFunc(natsLoginVars, func(k string) bool { return getenv(k) != "" })
	return func(k string) string {
		if v := getenv(k); v != "" || !slices.Contains(credsVars, k) {
			return v
		}
		if envLogin && slices.Contains(natsLoginVars, k) {
			return ""
		}
		return vars[k]
	}, path, nil
}
