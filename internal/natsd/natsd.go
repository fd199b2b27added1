// Package natsd starts the NATS server that a2ad embeds as its default control
// plane, and that tests start in-process.
//
// StartServer runs one that lets in only the users it is given, over TLS when
// certificates are given, and refuses to listen beyond loopback without TLS
// unless told it may. StartTenants runs one to which accounts of tenants,
// each a subject space of its own with limits, are added as it runs, without
// a reload. Start runs an open loopback server for tests.
package natsd

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// User is a client the server lets in with a name and a password.
type User struct {
	Name, Password string
	// Allow lists the subjects (wildcards allowed) the user may publish and
	// subscribe to; nil allows every subject.
	Allow []string
}

// NewUser returns a user with a fresh random password of 128 bits.
func NewUser(name string, allow []string) User {
	return User{Name: name, Password: RandomHex(16), Allow: allow}
}

// Options returns the nats.go options that log in as u.
func (u User) Options() []nats.Option { return []nats.Option{nats.UserInfo(u.Name, u.Password)} }

// authEnv are the client variables of package a2a that choose NATS
// credentials and TLS.
var authEnv = []string{"A2A_CREDS", "A2A_NATS_CREDS", "A2A_NATS_NKEY", "A2A_NATS_USER", "A2A_NATS_PASSWORD",
	"A2A_NATS_TOKEN", "A2A_NATS_TLS_CA", "A2A_NATS_TLS_CERT", "A2A_NATS_TLS_KEY"}

// Env returns the environment that makes a rank (package a2a's
// ConfigFromEnv) log in as u on a plain loopback server: its user and
// password, and every other credential or TLS variable the launcher may have
// inherited set empty, so they do not apply to this server.
func (u User) Env() []string {
	env := make([]string, 0, len(authEnv))
	for _, k := range authEnv {
		v := ""
		switch k {
		case "A2A_NATS_USER":
			v = u.Name
		case "A2A_NATS_PASSWORD":
			v = u.Password
		}
		env = append(env, k+"="+v)
	}
	return env
}

// Config says where a server listens and whom it lets in.
type Config struct {
	// Listen is "host:port"; an empty host or port 0 picks 127.0.0.1 and a
	// free port.
	Listen string
	// Users may connect; no one else can. At least one is required.
	Users []User
	// TLSCert and TLSKey are the server's certificate and key files (PEM):
	// with them every client connection is TLS.
	TLSCert, TLSKey string
	// Certificate, instead of TLSCert and TLSKey, is the server's
	// certificate in memory (GenerateTLS makes one).
	Certificate *tls.Certificate
	// TLSCA, with a certificate, makes the server require client
	// certificates signed by this CA (PEM), in addition to the users'
	// passwords.
	TLSCA string
	// Insecure allows listening beyond loopback without TLS, where anyone
	// on the path reads the passwords and messages.
	Insecure bool
}

// ErrInsecure is returned for a listener beyond loopback without TLS.
var ErrInsecure = errors.New("natsd: refusing to listen beyond loopback without TLS (give a certificate, or allow it explicitly as insecure)")

// StartServer runs an embedded NATS server as cfg says and waits until it
// accepts clients.
func StartServer(cfg Config) (*server.Server, error) {
	opts, err := serverOptions(cfg)
	if err != nil {
		return nil, err
	}
	return run(opts)
}

// serverOptions are the options of a server as cfg says.
func serverOptions(cfg Config) (*server.Options, error) {
	host, port, err := splitListen(cfg.Listen)
	if err != nil {
		return nil, err
	}
	if len(cfg.Users) == 0 {
		return nil, errors.New("natsd: no users: the server would let nobody in")
	}
	if cfg.Certificate != nil && (cfg.TLSCert != "" || cfg.TLSKey != "") {
		return nil, errors.New("natsd: a certificate in memory or files, not both")
	}
	tlsOn := cfg.TLSCert != "" || cfg.TLSKey != "" || cfg.Certificate != nil
	if !tlsOn && !cfg.Insecure && !Loopback(host) {
		return nil, fmt.Errorf("%w: %s", ErrInsecure, net.JoinHostPort(host, strconv.Itoa(max(port, 0))))
	}
	if cfg.TLSCA != "" && !tlsOn {
		return nil, errors.New("natsd: a client CA needs the server's certificate and key too")
	}
	opts := baseOptions(host, port)
	for _, u := range cfg.Users {
		su, err := u.serverUser(nil)
		if err != nil {
			return nil, err
		}
		opts.Users = append(opts.Users, su)
	}
	if tlsOn {
		tc, err := tlsConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("natsd: TLS: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, cfg.TLSCA != ""
		opts.TLSTimeout = 5
	}
	return opts, nil
}

// serverUser is u as the server takes it, in account acc (nil: the global
// one).
func (u User) serverUser(acc *server.Account) (*server.User, error) {
	if u.Name == "" || u.Password == "" {
		return nil, errors.New("natsd: a user needs a name and a password")
	}
	su := &server.User{Username: u.Name, Password: u.Password, Account: acc}
	if u.Allow != nil {
		allow := &server.SubjectPermission{Allow: u.Allow}
		su.Permissions = &server.Permissions{Publish: allow, Subscribe: allow}
	}
	return su, nil
}

// tlsConfig is the server's TLS configuration: its certificate from files or
// memory, and the CA of client certificates when it verifies them.
func tlsConfig(cfg Config) (*tls.Config, error) {
	if cfg.Certificate == nil {
		return server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey,
			CaFile: cfg.TLSCA, Verify: cfg.TLSCA != ""})
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cfg.Certificate}}
	if cfg.TLSCA != "" {
		raw, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = x509.NewCertPool()
		if !tc.ClientCAs.AppendCertsFromPEM(raw) {
			return nil, fmt.Errorf("no certificate in %s", cfg.TLSCA)
		}
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// Start runs an open embedded NATS server on addr ("host:port"; port 0 or ""
// picks a free loopback port) and waits until it accepts clients. It lets
// anyone in, so it only listens on loopback: tests use it, jobs use
// StartServer.
func Start(addr string) (*server.Server, error) {
	host, port, err := splitListen(addr)
	if err != nil {
		return nil, err
	}
	if !Loopback(host) {
		return nil, fmt.Errorf("natsd: an open server listens on loopback only, not %q", host)
	}
	return run(baseOptions(host, port))
}

func splitListen(addr string) (host string, port int, err error) {
	host, port = "127.0.0.1", -1
	if addr == "" {
		return host, port, nil
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("nats listen address %q: %w", addr, err)
	}
	if h != "" {
		host = h
	}
	if port, err = strconv.Atoi(p); err != nil {
		return "", 0, fmt.Errorf("nats listen port %q: %w", p, err)
	}
	if port == 0 {
		port = -1
	}
	return host, port, nil
}

// Loopback reports whether host names only this machine's loopback
// interface ("localhost", 127.0.0.0/8, ::1). Wildcards such as 0.0.0.0 are
// not loopback.
func Loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func baseOptions(host string, port int) *server.Options {
	return &server.Options{
		Host:                  host,
		Port:                  port,
		NoLog:                 true,
		NoSigs:                true,
		MaxPayload:            8 << 20, // a 1024-rank counts matrix is 8 MiB of int64
		MaxPending:            64 << 20,
		WriteDeadline:         10 * time.Second,
		DisableShortFirstPing: true,
	}
}

func run(opts *server.Options) (*server.Server, error) {
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats server on %s:%d not ready", opts.Host, opts.Port)
	}
	return s, nil
}

// RandomHex returns n random bytes from crypto/rand in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}
