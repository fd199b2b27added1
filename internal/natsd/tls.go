package natsd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"slices"
	"strings"
	"time"
)

// GeneratedTLS is a CA made for one server and the server certificate it
// signed. The CA's key is dropped once that certificate is signed, so the CA
// vouches for this server alone and no key of it is ever stored.
type GeneratedTLS struct {
	// CAPEM is the CA's certificate (PEM): the clients trust it.
	CAPEM []byte
	// Certificate is the server's certificate, with its key.
	Certificate tls.Certificate
}

// validity of a generated CA and certificate: a server may run for years,
// and its CA's key is gone once the certificate is signed, so a long life
// adds no key to steal.
const validity = 10 * 365 * 24 * time.Hour

// GenerateTLS makes a CA (ECDSA P-256) and a server certificate it signs for
// hosts: DNS names or IP addresses, the names clients dial (HostNames).
func GenerateTLS(hosts []string) (GeneratedTLS, error) {
	if len(hosts) == 0 {
		return GeneratedTLS{}, errors.New("natsd: a certificate needs a host name or address")
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return GeneratedTLS{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "a2ad serve CA " + hosts[0] + " " + now.UTC().Format(time.RFC3339)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return GeneratedTLS{}, fmt.Errorf("natsd: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return GeneratedTLS{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return GeneratedTLS{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return GeneratedTLS{}, fmt.Errorf("natsd: server certificate: %w", err)
	}
	return GeneratedTLS{
		CAPEM:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Certificate: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return n
}

// HostNames returns the names and addresses by which clients may reach a
// server of this host listening on listenHost: the listen address itself
// unless it is a wildcard (0.0.0.0, ::, empty), and for a wildcard the
// host's name (with its short form) and every address of its interfaces;
// localhost and the loopback addresses always.
func HostNames(listenHost string) []string {
	var names []string
	add := func(n string) {
		if n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	wildcard := listenHost == ""
	if ip := net.ParseIP(listenHost); ip != nil && ip.IsUnspecified() {
		wildcard = true
	}
	if !wildcard {
		add(listenHost)
	}
	if h, err := os.Hostname(); err == nil {
		add(h)
		short, _, _ := strings.Cut(h, ".")
		add(short)
	}
	if wildcard {
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
					add(n.IP.String())
				}
			}
		}
	}
	for _, n := range []string{"localhost", "127.0.0.1", "::1"} {
		add(n)
	}
	return names
}
