package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// ca: the run's test CA (made by scale.sh with openssl), which signs every host's leaf.
type ca struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

func loadCA(dir string) (*ca, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s: no PEM certificate or key", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	var key any
	if key, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
		if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			if key, err = x509.ParsePKCS1PrivateKey(kb.Bytes); err != nil {
				return nil, fmt.Errorf("%s/ca.key: not PKCS#8, SEC 1 or PKCS#1", dir)
			}
		}
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s/ca.key: not a signing key", dir)
	}
	return &ca{cert: cert, key: signer, certPEM: certPEM}, nil
}

// leafCert is a host's certificate and key as cert-manager writes them into a Secret:
// tls.crt the leaf, tls.key SEC 1 (ECDSA) or PKCS#1 (RSA).
type leafCert struct {
	certPEM, keyPEM []byte
	sha256          string // of the leaf's DER, as a client sees it
}

func (c *ca) leaf(host string, useRSA bool) (*leafCert, error) {
	var signer crypto.Signer
	var keyBlock *pem.Block
	usage := x509.KeyUsageDigitalSignature
	if useRSA {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, err
		}
		signer = k
		keyBlock = &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}
		usage |= x509.KeyUsageKeyEncipherment
	} else {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		signer = k
		keyBlock = &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(48 * time.Hour),
		KeyUsage:              usage,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, signer.Public(), c.key)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(der)
	return &leafCert{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(keyBlock),
		sha256:  hex.EncodeToString(sum[:]),
	}, nil
}

// writeNginx: the file nginx's catch-all server loads per handshake ($ssl_server_name.pem,
// certificate and key together so a rotation's rename never pairs a new certificate with an
// old key), so the TCP ingress presents each host's own certificate: what the listener's
// default upstream.verify (servedCertificate) checks.
func (l *leafCert) writeNginx(dir, host string) error {
	return writeAtomic(filepath.Join(dir, host+".pem"), append(append([]byte{}, l.certPEM...), l.keyPEM...))
}
