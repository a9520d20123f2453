package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSServer is a redis-server that also listens for TLS, with a certificate
// for 127.0.0.1 signed by a CA of its own (not trusted by the system).
type TLSServer struct {
	*Server
	TLSPort int
}

// TLSURL is the rediss:// URL of the server's TLS port, database 0.
func (s *TLSServer) TLSURL() string {
	return "rediss://127.0.0.1:" + strconv.Itoa(s.TLSPort) + "/0"
}

// StartTLS starts a redis-server with a plain port (Addr, for set-up and
// inspection) and a TLS port, and stops it when tb's test ends. Clients need
// no certificate of their own.
func StartTLS(tb testing.TB) *TLSServer {
	tb.Helper()
	port, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	tlsPort, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	certDir := tb.TempDir()
	if err := writeCertificates(certDir); err != nil {
		tb.Fatalf("making TLS certificates: %v", err)
	}
	s, err := newServer(port, "redistest-tls", "", nil, []string{
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", filepath.Join(certDir, "server.crt"),
		"--tls-key-file", filepath.Join(certDir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(certDir, "ca.crt"),
		"--tls-auth-clients", "no",
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := startOwned(s); err != nil {
		s.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return &TLSServer{Server: s, TLSPort: tlsPort}
}

// writeCertificates writes ca.crt, and server.crt and server.key for
// 127.0.0.1 signed by it, into dir.
func writeCertificates(dir string) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, &serverKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return err
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":     {Type: "CERTIFICATE", Bytes: caDER},
		"server.crt": {Type: "CERTIFICATE", Bytes: serverDER},
		"server.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}
