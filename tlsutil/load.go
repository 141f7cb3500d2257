package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Client-authentication modes of a TLS listener (--tls-client-auth).
const (
	ClientAuthNone    = "none"    // no client certificate asked for
	ClientAuthRequest = "request" // verified against the CA if the client sends one
	ClientAuthRequire = "require" // mutual TLS: a certificate signed by the CA is required
)

// ParseClientAuth maps a --tls-client-auth value to crypto/tls's type.
func ParseClientAuth(mode string) (tls.ClientAuthType, error) {
	switch strings.ToLower(strings.TrimSpace(mode)) {
	case ClientAuthNone, "":
		return tls.NoClientCert, nil
	case ClientAuthRequest:
		return tls.VerifyClientCertIfGiven, nil
	case ClientAuthRequire:
		return tls.RequireAndVerifyClientCert, nil
	}
	return 0, fmt.Errorf("client auth %q: use none, request or require", mode)
}

// minVersion: TLS 1.2 still serves scrapers and proxies that lack 1.3; Go
// negotiates 1.3 whenever both ends have it.
const minVersion = tls.VersionTLS12

// LoadKeyPair reads a PEM certificate (chain) and its private key. Errors name
// the file at fault: missing, not PEM, not a certificate, expired, or a key that
// does not belong to the certificate.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	if certFile == "" || keyFile == "" {
		return tls.Certificate{}, errors.New("tls: a certificate needs both a cert file and a key file")
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls cert: %w", err)
	}
	certs, err := parseCerts(certFile, certPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls key: %w", err)
	}
	if b, _ := pem.Decode(keyPEM); b == nil || !strings.Contains(b.Type, "PRIVATE KEY") {
		return tls.Certificate{}, fmt.Errorf("tls key %s: no PEM private key found (want a \"PRIVATE KEY\" block)", keyFile)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls key pair %s + %s: %w", certFile, keyFile, err)
	}
	if leaf := certs[0]; time.Now().After(leaf.NotAfter) {
		return tls.Certificate{}, fmt.Errorf("tls cert %s: certificate %q expired on %s", certFile, leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	pair.Leaf = certs[0]
	return pair, nil
}

// LoadCA reads a PEM file of one or more CA certificates into a pool.
func LoadCA(caFile string) (*x509.CertPool, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls ca: %w", err)
	}
	certs, err := parseCerts(caFile, data)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// parseCerts decodes every CERTIFICATE block of a PEM file; anything else in
// the file (a key pasted by mistake, garbage) is an error naming the file.
func parseCerts(file string, data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("tls %s: found a %q PEM block where a CERTIFICATE was expected", file, b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("tls %s: certificate %d: %w", file, len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("tls %s: no PEM certificate found", file)
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, fmt.Errorf("tls %s: unparseable data after certificate %d", file, len(out))
	}
	return out, nil
}

// ServerConfig is the configuration of a TLS listener (gRPC or HTTP). caFile
// verifies client certificates and is required unless clientAuth is "none".
func ServerConfig(certFile, keyFile, caFile, clientAuth string) (*tls.Config, error) {
	mode, err := ParseClientAuth(clientAuth)
	if err != nil {
		return nil, err
	}
	pair, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	if err := CheckServerCert(certFile, pair.Leaf); err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: mode, MinVersion: minVersion}
	if mode != tls.NoClientCert {
		if caFile == "" {
			return nil, fmt.Errorf("tls: client auth %q needs a CA file to verify client certificates", clientAuth)
		}
		if cfg.ClientCAs, err = LoadCA(caFile); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// ClientConfig is the configuration of a TLS client. caFile "" trusts the
// system roots; certFile/keyFile (both or neither) are the client certificate
// presented to servers that ask for one; serverName "" verifies the host of
// the address dialled.
func ClientConfig(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: minVersion, ServerName: serverName}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("tls: give both a client certificate and its key, or neither")
	}
	if certFile != "" {
		pair, err := LoadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if caFile != "" {
		pool, err := LoadCA(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// PeerConfigs are the two sides of mutual TLS between nodes (the raft
// transport): each node presents its node certificate and accepts only peers
// whose certificate the CA signed and that are node certificates (NodeName),
// on both the accepting and the dialing side: a client certificate of the
// same CA can neither send raft RPCs nor receive a group's log. certFile must
// itself be a node certificate (an error naming the file and the fix
// otherwise). All three files are required.
func PeerConfigs(certFile, keyFile, caFile string) (server, client *tls.Config, err error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, nil, errors.New("tls: mutual TLS between nodes needs a certificate, its key and a CA file")
	}
	pair, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, err
	}
	if err := CheckNodeCert(certFile, pair.Leaf); err != nil {
		return nil, nil, err
	}
	if server, err = ServerConfig(certFile, keyFile, caFile, ClientAuthRequire); err != nil {
		return nil, nil, err
	}
	if client, err = ClientConfig(certFile, keyFile, caFile, ""); err != nil {
		return nil, nil, err
	}
	server.VerifyConnection = requireNodePeer
	client.VerifyConnection = requireNodePeer
	return server, client, nil
}
