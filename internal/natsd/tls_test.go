package natsd

import (
	"crypto/x509"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestGeneratedTLS: a server with a generated certificate lets in a client
// that trusts the generated CA, under each name the certificate lists, and
// refuses the TLS of one that does not.
func TestGeneratedTLS(t *testing.T) {
	names := HostNames("127.0.0.1")
	if !slices.Contains(names, "127.0.0.1") || !slices.Contains(names, "localhost") {
		t.Fatalf("HostNames(127.0.0.1) = %v: no listen address or localhost", names)
	}
	if wild := HostNames("0.0.0.0"); slices.Contains(wild, "0.0.0.0") || !slices.Contains(wild, "127.0.0.1") {
		t.Errorf("HostNames(0.0.0.0) = %v: the wildcard is no name, the interfaces' addresses are", wild)
	}
	gen, err := GenerateTLS(names)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(gen.CAPEM) {
		t.Fatal("no certificate in the CA's PEM")
	}
	leaf, err := x509.ParseCertificate(gen.Certificate.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: n}); err != nil {
			t.Errorf("the certificate does not verify for %s: %v", n, err)
		}
	}
	user := NewUser("u", nil)
	srv, err := StartServer(Config{Listen: "127.0.0.1:0", Users: []User{user}, Certificate: &gen.Certificate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	trust := nats.ClientTLSConfig(nil, func() (*x509.CertPool, error) { return pool, nil })
	nc, err := nats.Connect(srv.ClientURL(), append(user.Options(), trust, nats.MaxReconnects(0))...)
	if err != nil {
		t.Fatalf("a client trusting the CA: %v", err)
	}
	if !nc.TLSRequired() {
		t.Error("the connection is not TLS")
	}
	nc.Close()
	if nc, err := nats.Connect(srv.ClientURL(), append(user.Options(), nats.MaxReconnects(0))...); err == nil {
		nc.Close()
		t.Error("a client without the CA connected")
	}
	if _, err := StartServer(Config{Users: []User{user}, Certificate: &gen.Certificate, TLSCert: "c.pem", TLSKey: "k.pem"}); err == nil {
		t.Error("a certificate in memory and in files at once was taken")
	}
}
