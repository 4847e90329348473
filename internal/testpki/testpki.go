// Package testpki makes throwaway certificate authorities and certificates for
// tests of TLS connections on loopback.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority whose certificate is written to File (PEM).
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	File string
}

// NewCA writes a fresh CA certificate to dir, valid for an hour.
func NewCA(t testing.TB, dir, name string) CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + "-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return CA{cert: cert, key: key, File: write(t, dir, name+"-ca.pem", "CERTIFICATE", der)}
}

// Issue writes a certificate for 127.0.0.1 and localhost, usable by servers and
// clients, signed by the CA, and its key.
func (a CA) Issue(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	return a.IssueFor(t, dir, name, []string{"127.0.0.1"}, []string{"localhost"})
}

// IssueFor is Issue for the given addresses and host names.
func (a CA) IssueFor(t testing.TB, dir, name string, ips, hosts []string) (certFile, keyFile string) {
	t.Helper()
	var addrs []net.IP
	for _, ip := range ips {
		addrs = append(addrs, net.ParseIP(ip))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: addrs, DNSNames: hosts,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return write(t, dir, name+".pem", "CERTIFICATE", der), write(t, dir, name+"-key.pem", "EC PRIVATE KEY", keyDER)
}

func write(t testing.TB, dir, f, typ string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, f)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
