package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a"
	"github.com/a2a-moe/a2a/internal/credsfile"
	"github.com/a2a-moe/a2a/internal/natsd"
)

// errNoTenancy: the control plane at the URL mints no job credentials.
var errNoTenancy = errors.New("this control plane mints no job credentials (an a2ad serve on an external NATS server, or an older one)")

// jobVars are what a job's ranks get of a minted job: its login, secret,
// name (A2AD_JOB, which tells a job file from serve's) and group when it is
// pinned to one, and from serve's file the TLS the server needs (its CA, a
// client certificate when it requires one), which are no secret of the
// admin's.
func jobVars(job jobReply, admin map[string]string) []credsfile.Var {
	vars := []credsfile.Var{{Key: "A2A_NATS_USER", Value: job.User}, {Key: "A2A_NATS_PASSWORD", Value: job.Password},
		{Key: "A2A_SECRET", Value: job.Secret}, {Key: "A2AD_JOB", Value: job.Job}}
	if job.Group != "" {
		vars = append(vars, credsfile.Var{Key: "A2A_GROUP", Value: job.Group})
	}
	return append(vars, tlsVars(admin)...)
}

// tlsVars are the TLS settings of serve's file: what the server needs of
// every client.
func tlsVars(admin map[string]string) []credsfile.Var {
	var vars []credsfile.Var
	for _, k := range []string{"A2A_NATS_TLS_CA", "A2A_NATS_TLS_CERT", "A2A_NATS_TLS_KEY"} {
		if v := admin[k]; v != "" {
			vars = append(vars, credsfile.Var{Key: k, Value: v})
		}
	}
	return vars
}

// withEnvTLS fills the TLS settings vars, a credentials file's, leaves
// unset with the environment's, as package a2a does for a rank: serve's
// file holds no CA when serve has a certificate of the user's, whose CA
// the environment names (deploy/slurm).
func withEnvTLS(vars map[string]string, getenv func(string) string) map[string]string {
	for _, k := range []string{"A2A_NATS_TLS_CA", "A2A_NATS_TLS_CERT", "A2A_NATS_TLS_KEY"} {
		if vars[k] == "" && getenv(k) != "" {
			vars[k] = getenv(k)
		}
	}
	return vars
}

// adminFile reports whether vars, a credentials file's, are serve's own
// (the admin's: a login, and neither a job nor a group) rather than a job's.
func adminFile(vars map[string]string) bool {
	return vars["A2AD_JOB"] == "" && vars["A2A_GROUP"] == "" && (vars["A2A_NATS_USER"] != "" || vars["A2A_NATS_TOKEN"] != "" ||
		vars["A2A_NATS_CREDS"] != "" || vars["A2A_NATS_NKEY"] != "")
}

// mintJob asks the a2ad serve at url, logging in as its admin (admin: the
// variables of serve's credentials file), for the credentials of a job of
// group ("" for a fresh group). A refused login is a2a.ErrAuth; a control
// plane that mints none is errNoTenancy.
func mintJob(ctx context.Context, url string, admin map[string]string, group string) (jobReply, error) {
	cfg := a2a.Config{NATSURL: url, NATSCreds: admin["A2A_NATS_CREDS"], NATSNKey: admin["A2A_NATS_NKEY"],
		NATSUser: admin["A2A_NATS_USER"], NATSPassword: admin["A2A_NATS_PASSWORD"], NATSToken: admin["A2A_NATS_TOKEN"],
		NATSTLSCA: admin["A2A_NATS_TLS_CA"], NATSTLSCert: admin["A2A_NATS_TLS_CERT"], NATSTLSKey: admin["A2A_NATS_TLS_KEY"]}
	opts, err := cfg.NATSOptions()
	if err != nil {
		return jobReply{}, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A serve whose user may not publish the request (an older one) says
	// so asynchronously: end the wait with it.
	opts = append(opts, nats.Name("a2ad job new"), nats.MaxReconnects(0), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				cancel(errNoTenancy)
			}
		}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) {
			return jobReply{}, fmt.Errorf("%w: the control plane %s refused serve's credentials: is the file the one of the a2ad serve at this URL?",
				a2a.ErrAuth, redactedURL(url))
		}
		return jobReply{}, fmt.Errorf("control plane %s: %w", redactedURL(url), err)
	}
	defer nc.Close()
	req, _ := json.Marshal(jobRequest{Group: group})
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	msg, err := nc.RequestWithContext(rctx, adminJobNew, req)
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(context.Cause(ctx), errNoTenancy):
		return jobReply{}, errNoTenancy
	case err != nil:
		return jobReply{}, fmt.Errorf("asking %s for job credentials: %w", redactedURL(url), err)
	}
	var rep jobReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return jobReply{}, fmt.Errorf("job credentials from %s: %w", redactedURL(url), err)
	}
	if rep.Error != "" {
		return jobReply{}, fmt.Errorf("a2ad serve at %s: %s", redactedURL(url), rep.Error)
	}
	return rep, nil
}

// redactedURL is u without user information.
func redactedURL(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if at := strings.LastIndex(rest, "@"); ok && at >= 0 {
		return scheme + "://***@" + rest[at+1:]
	}
	return u
}

// jobHelp is the help of a2ad job after its flags.
const jobHelp = `a2ad job new asks the a2ad serve at --nats, as its admin (the login of serve's
credentials file), for a job's own credentials, and writes them as a job file:
a NATS login that reaches only the subjects of an account of the job's
own, the job's secret and serve's CA. Give the job that file (A2A_CREDS=FILE
with A2A_NATS_URL; a2ad run --nats URL --creds FILE), never serve's own.
With --group the job is pinned to that group (the file sets A2A_GROUP, its
login reaches that group's subjects alone), and asking again for the same
group gives the same credentials (every host of a job may ask); without,
it runs whatever groups its launchers name, in its own account, and every
request makes a new job. serve drops a job 10 minutes after its last rank
left.
`

func cmdJob(ctx context.Context, log *slog.Logger, args []string) error {
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("job", flag.ContinueOnError)
	natsURL := fs.String("nats", "", "NATS URL of the a2ad serve (default: $A2A_NATS_URL, else nats://127.0.0.1:4222)")
	creds := fs.String("creds", "", "serve's credentials file, the admin's (default: $A2A_CREDS, else ~/.config/a2ad/serve.env)")
	group := fs.String("group", "", "pin the job to this group (default: the job runs any group, in its own account)")
	out := fs.String("out", "", "write the job file here, mode 0600, replacing a file there whole (default: standard output)")
	if err := parseFlags(fs, args); err != nil {
		return usageError{err}
	}
	if sub != "new" || fs.NArg() > 0 {
		return usagef("a2ad job new [flags]: new is the one subcommand")
	}
	url := *natsURL
	if url == "" {
		url = os.Getenv("A2A_NATS_URL")
	}
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	path := *creds
	if path == "" {
		path = os.Getenv("A2A_CREDS")
	}
	if path == "" {
		p, err := credsfile.DefaultPath()
		if err != nil {
			return err
		}
		path = p
	}
	admin, err := credsfile.Read(path)
	if err != nil {
		return err
	}
	if !adminFile(admin) {
		return usagef("%s is no credentials file of a2ad serve (a job file, or no login): job new needs serve's own", path)
	}
	admin = withEnvTLS(admin, os.Getenv)
	job, err := mintJob(ctx, url, admin, *group)
	if err != nil {
		return err
	}
	header := []string{
		fmt.Sprintf("a2ad job credentials of %s (group %s) at %s: keep private, give them to this job only.",
			job.Job, cmp.Or(job.Group, "any"), redactedURL(url)),
		"  export A2A_NATS_URL=" + redactedURL(url) + " A2A_CREDS=THIS_FILE   (launchers pass both on)",
		"  a2ad run --nats " + redactedURL(url) + " --creds THIS_FILE -n N -- PROG",
	}
	vars := jobVars(job, admin)
	if *out != "" {
		if err := credsfile.Write(*out, header, vars, true); err != nil {
			return err
		}
		log.Info("a2ad: job file written", "group", job.Group, "file", *out)
		return nil
	}
	text, err := credsfile.Format(header, vars)
	if err != nil {
		return err
	}
	_, err = os.Stdout.WriteString(text)
	return err
}

// mintForRun gives `a2ad run --nats` a job of its own when its credentials
// file (vars) is serve's: it asks serve for the credentials of group and
// returns the ranks' environment (the job's login and serve's TLS; every
// other login variable and A2A_CREDS emptied, so that an inherited one does
// not apply) and the job.
// ok is false when the control plane mints none: the ranks then share
// serve's credentials, as before tenancy.
func mintForRun(ctx context.Context, log *slog.Logger, url string, vars map[string]string, group string) (env []string, job jobReply, ok bool, err error) {
	vars = withEnvTLS(maps.Clone(vars), os.Getenv)
	job, err = mintJob(ctx, url, vars, group)
	if errors.Is(err, errNoTenancy) {
		log.Info("a2ad: the ranks share serve's credentials", "why", err)
		return nil, job, false, nil
	}
	if err != nil {
		return nil, job, false, err
	}
	env = natsd.User{Name: job.User, Password: job.Password}.Env()
	for _, v := range tlsVars(vars) { // after Env's emptied ones: the last wins
		env = append(env, v.Key+"="+v.Value)
	}
	log.Info("a2ad: the ranks log in with credentials of their own, minted by serve", "group", job.Group)
	return env, job, true, nil
}
