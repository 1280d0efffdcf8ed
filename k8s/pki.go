package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The control plane's credentials, made afresh at each start: a CA, the API server's serving
// certificate signed by it, the service-account signing key, and an admin token.
type pkiFiles struct {
	caCert, caKey, serverCert, serverKey, saKey, tokens string
	adminToken                                          string
}

func writePKI(dir string) (pkiFiles, error) {
	f := pkiFiles{
		caCert: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key"),
		serverCert: filepath.Join(dir, "apiserver.crt"), serverKey: filepath.Join(dir, "apiserver.key"),
		saKey: filepath.Join(dir, "sa.key"), tokens: filepath.Join(dir, "tokens.csv"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpualloc-local-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	server := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, err
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, server, caCert, &serverKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return f, err
	}
	token := make([]byte, 24)
	if _, err := rand.Read(token); err != nil {
		return f, err
	}
	f.adminToken = hex.EncodeToString(token)

	caKeyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return f, err
	}
	serverKeyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return f, err
	}
	for _, file := range []struct {
		path, kind string
		der        []byte
	}{
		{f.caCert, "CERTIFICATE", caDER},
		{f.caKey, "EC PRIVATE KEY", caKeyDER},
		{f.serverCert, "CERTIFICATE", serverDER},
		{f.serverKey, "EC PRIVATE KEY", serverKeyDER},
		{f.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)},
	} {
		if err := os.WriteFile(file.path, pem.EncodeToMemory(&pem.Block{Type: file.kind, Bytes: file.der}), 0o600); err != nil {
			return f, err
		}
	}
	// token,user,uid,"groups": the admin is in system:masters (every right, RBAC aside).
	line := f.adminToken + ",admin,admin,\"system:masters\"\n"
	return f, os.WriteFile(f.tokens, []byte(line), 0o600)
}
