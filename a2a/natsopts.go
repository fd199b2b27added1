package a2a

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/a2a/internal/fault"
	"github.com/a2a-moe/a2a/internal/credsfile"
)

// NATSOptions returns the nats.go options that log this rank in to the
// control plane as cfg says: one of a credentials file (NATSCreds), an nkey
// seed file (NATSNKey), a user and password (NATSUser, NATSPassword) or a
// token (NATSToken), or none (user, password or token may also be in the
// URL, which nats.go reads); TLS verified against NATSTLSCA (a PEM file or
// the PEM itself), with a client
// certificate when NATSTLSCert and NATSTLSKey are set. Replies come to
// inboxes under control.InboxPrefix(cfg.Group), so that an account can limit
// the job's user to control.Subjects(cfg.Group).
func (cfg Config) NATSOptions() ([]nats.Option, error) {
	bad := func(format string, args ...any) error {
		return fault.New(fault.ErrInvalidArgument, -1, "NATS credentials: "+format, args...)
	}
	var opts []nats.Option
	set := 0
	for _, v := range []string{cfg.NATSCreds, cfg.NATSNKey, cfg.NATSUser + cfg.NATSPassword, cfg.NATSToken} {
		if v != "" {
			set++
		}
	}
	if set > 1 {
		return nil, bad("give one of A2A_NATS_CREDS, A2A_NATS_NKEY, A2A_NATS_USER/A2A_NATS_PASSWORD, A2A_NATS_TOKEN")
	}
	switch {
	case cfg.NATSCreds != "":
		if err := readable(cfg.NATSCreds); err != nil {
			return nil, bad("A2A_NATS_CREDS: %v", err)
		}
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	case cfg.NATSNKey != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNKey)
		if err != nil {
			return nil, bad("A2A_NATS_NKEY: %v", err)
		}
		opts = append(opts, o)
	case cfg.NATSUser != "" || cfg.NATSPassword != "":
		if cfg.NATSUser == "" || cfg.NATSPassword == "" {
			return nil, bad("A2A_NATS_USER and A2A_NATS_PASSWORD go together")
		}
		opts = append(opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
	case cfg.NATSToken != "":
		opts = append(opts, nats.Token(cfg.NATSToken))
	}
	if (cfg.NATSTLSCert == "") != (cfg.NATSTLSKey == "") {
		return nil, bad("A2A_NATS_TLS_CERT and A2A_NATS_TLS_KEY go together")
	}
	switch {
	case strings.HasPrefix(strings.TrimSpace(cfg.NATSTLSCA), "-----BEGIN"):
		// The PEM itself, as a2ad serve's credentials file holds its CA:
		// the file travels alone, with nothing beside it to copy.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(cfg.NATSTLSCA)) {
			return nil, bad("A2A_NATS_TLS_CA: no certificate in its PEM")
		}
		opts = append(opts, nats.ClientTLSConfig(nil, func() (*x509.CertPool, error) { return pool, nil }))
	case cfg.NATSTLSCA != "":
		if err := readable(cfg.NATSTLSCA); err != nil {
			return nil, bad("A2A_NATS_TLS_CA: %v", err)
		}
		opts = append(opts, nats.RootCAs(cfg.NATSTLSCA))
	}
	if cfg.NATSTLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.NATSTLSCert, cfg.NATSTLSKey))
	}
	if cfg.Group != "" {
		opts = append(opts, nats.CustomInboxPrefix(control.InboxPrefix(cfg.Group)))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	// The server reports a subject the user may not publish or subscribe
	// to asynchronously: without this the join would just time out.
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		log.Error("a2a: NATS error", "err", err)
	}))
	return opts, nil
}

func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}

// connectError types a failed nats.Connect: refused credentials and TLS
// verification failures are ErrAuth; a server or account with all its
// connections taken is ErrResource; a URL that does not parse or names a
// host that does not exist is ErrInvalidArgument; a server that does not
// answer (nothing listens there, it refuses, it is down) is ErrTimeout, as
// the server being away is no fault of the arguments. The URL is named
// without its user information.
func connectError(cfg Config, err error) error {
	url := redactURL(cfg.NATSURL)
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var alert tls.AlertError
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return fault.Wrap(fault.ErrAuth, -1, err, "control plane %s refused the connection (%s)", url, refusedHow(cfg))
	case errors.As(err, &unknownCA), errors.As(err, &hostErr), errors.As(err, &invalid), errors.As(err, &verify):
		how := "A2A_NATS_TLS_CA names the CA to trust; the CA a2ad serve made is in its credentials file: " + passCreds()
		if cfg.CredsFile != "" && cfg.NATSTLSCA != "" {
			how = fmt.Sprintf("the CA of A2A_CREDS=%s does not sign it: that file belongs to another a2ad serve, or to this one before it restarted", cfg.CredsFile)
		}
		return fault.Wrap(fault.ErrAuth, -1, err, "control plane %s: its TLS certificate does not verify (%s)", url, how)
	case errors.As(err, &alert), errors.Is(err, nats.ErrTLS), strings.Contains(err.Error(), "remote error: tls: "):
		// A TLS alert from the server arrives as crypto/tls's unexported
		// alert type inside a net.OpError: only its text says it.
		return fault.Wrap(fault.ErrAuth, -1, err, "control plane %s: TLS refused (a client certificate may be required: A2A_NATS_TLS_CERT, A2A_NATS_TLS_KEY)", url)
	case errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted):
		return fault.Wrap(fault.ErrAuth, -1, err, "control plane %s: the two ends disagree on TLS", url)
	case errors.Is(err, nats.ErrMaxAccountConnectionsExceeded), errors.Is(err, nats.ErrMaxConnectionsExceeded):
		// The credentials are good: the job (its NATS account, a2ad serve
		// --job-conns) or the server holds all the connections it may.
		return fault.Wrap(fault.ErrResource, -1, err, "control plane %s: no connection left for this job "+
			"(a2ad serve gives a job --job-conns connections; more ranks than that, or ranks of an earlier run still connected?)", url)
	}
	var badURL *neturl.Error
	var dns *net.DNSError
	switch {
	case errors.As(err, &badURL):
		return fault.Wrap(fault.ErrInvalidArgument, -1, err, "control plane URL %s does not parse (A2A_NATS_URL)", url)
	case errors.As(err, &dns) && dns.IsNotFound:
		return fault.Wrap(fault.ErrInvalidArgument, -1, err, "control plane %s: no such host (A2A_NATS_URL)", url)
	}
	return fault.Wrap(fault.ErrTimeout, -1, err, "control plane %s unreachable: no NATS server answered there (is a2ad serve running? A2A_NATS_URL names it)", url)
}

// refusedHow says why the server refused the login and what to do: which
// credentials were given, and where a2ad serve's are.
func refusedHow(cfg Config) string {
	switch {
	case cfg.NATSCreds == "" && cfg.NATSNKey == "" && cfg.NATSUser == "" && cfg.NATSToken == "" && !strings.Contains(cfg.NATSURL, "@"):
		return "no credentials given: " + passCreds() +
			"; or set A2A_NATS_USER and A2A_NATS_PASSWORD, A2A_NATS_CREDS, A2A_NATS_NKEY or A2A_NATS_TOKEN, or put them in the URL"
	case cfg.CredsFile != "":
		return fmt.Sprintf("the credentials of A2A_CREDS=%s were refused: is it the file of the a2ad serve at this URL? "+
			"serve prints its file when it starts; A2A_NATS_* variables set in the environment win over the file's", cfg.CredsFile)
	}
	return "the credentials given were refused"
}

// passCreds says how a rank gets the credentials a2ad serve wrote: the file,
// named where this user's serve would write it, and the variable and flag
// that pass it.
func passCreds() string {
	file := "~/.config/a2ad/serve.env"
	if p, err := credsfile.DefaultPath(); err == nil {
		file = p
	}
	return fmt.Sprintf("pass the file a2ad serve wrote (by default %s) with A2A_CREDS=FILE "+
		"(launchers: export it, then mpirun -x A2A_CREDS; srun and torchrun inherit it), or run the ranks with a2ad run --nats URL --creds FILE", file)
}

// redactURL drops the user information of a NATS URL (or of each of a
// comma-separated list), so that a password never reaches an error or a log.
func redactURL(u string) string {
	parts := strings.Split(u, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if !ok {
			scheme, rest = "", p
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = "***@" + rest[at+1:]
		}
		if ok {
			parts[i] = scheme + "://" + rest
		} else {
			parts[i] = rest
		}
	}
	return strings.Join(parts, ",")
}

// ControlRejects returns how many control messages this rank refused to
// believe, by reason: forged, corrupted, replayed, of another epoch or from a
// non-member (see package control).
func (c *Comm) ControlRejects() control.Rejects { return c.member.Rejects() }

// CountsResends returns how many times this rank sent a counts row again
// because its column had not come: rows or columns lost with a NATS server
// that died (see package control).
func (c *Comm) CountsResends() uint64 { return c.member.CountsResends() }
