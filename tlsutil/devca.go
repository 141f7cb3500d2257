package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// DevOptions configures InitDev.
type DevOptions struct {
	Dir   string   // output directory (created)
	Nodes []string // one certificate per node name (also a DNS SAN)
	// Hosts are extra SANs put in every node certificate: IPs and DNS names by
	// which nodes dial each other and clients dial nodes (advertised addresses,
	// compose service names). localhost, 127.0.0.1 and ::1 are always included.
	Hosts []string
	Force bool      // overwrite existing files
	Now   time.Time // validity start (zero: now)
	// Validity of every certificate; zero: 2 years (a development CA).
	Validity time.Duration
}

// DevFiles names what InitDev wrote.
type DevFiles struct {
	CA, CAKey         string
	Nodes             map[string][2]string // node → {cert, key}
	Client, ClientKey string
	GossipKey         string
}

// InitDev creates a development PKI in opts.Dir: a CA (ECDSA P-256), one
// node certificate per node valid for both server and client use (nodes dial
// each other) and marked with the node URI SAN (NodeURI), a client
// certificate for the CLI and clients (never marked), and a gossip key.
// Existing files are kept unless Force is set: overwriting a CA silently would
// strand every certificate it signed.
func InitDev(opts DevOptions) (DevFiles, error) {
	if opts.Dir == "" {
		return DevFiles{}, errors.New("tls init: an output directory is required")
	}
	if len(opts.Nodes) == 0 {
		return DevFiles{}, errors.New("tls init: at least one node name is required")
	}
	if err := checkNodeNames("tls init", opts.Nodes); err != nil {
		return DevFiles{}, err
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if opts.Validity == 0 {
		opts.Validity = 2 * 365 * 24 * time.Hour
	}
	p := func(name string) string { return filepath.Join(opts.Dir, name) }
	out := DevFiles{CA: p("ca.pem"), CAKey: p("ca-key.pem"), Client: p("client.pem"), ClientKey: p("client-key.pem"),
		GossipKey: p("gossip.key"), Nodes: map[string][2]string{}}
	all := []string{out.CA, out.CAKey, out.Client, out.ClientKey, out.GossipKey}
	for _, n := range opts.Nodes {
		out.Nodes[n] = [2]string{p(n + ".pem"), p(n + "-key.pem")}
		all = append(all, p(n+".pem"), p(n+"-key.pem"))
	}
	if !opts.Force {
		for _, f := range all {
			if _, err := os.Stat(f); err == nil {
				return DevFiles{}, fmt.Errorf("tls init: %s already exists (remove the directory or use --force; to add or reissue node certificates from the existing CA use `tollgate tls node-cert`)", f)
			}
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return DevFiles{}, fmt.Errorf("tls init: %w", err)
	}

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return DevFiles{}, fmt.Errorf("tls init: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "Tollgate development CA", Organization: []string{"Tollgate"}},
		NotBefore:             opts.Now.Add(-time.Hour), // tolerate clocks slightly behind
		NotAfter:              opts.Now.Add(opts.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, caCert, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return DevFiles{}, fmt.Errorf("tls init: CA: %w", err)
	}
	if err := writePEM(out.CA, "CERTIFICATE", caDER, 0o644); err != nil {
		return DevFiles{}, err
	}
	if err := writeKey(out.CAKey, caKey); err != nil {
		return DevFiles{}, err
	}

	l := leafIssuer{now: opts.Now, validity: opts.Validity, ca: caCert, caKey: caKey}
	if err := l.nodes(opts.Nodes, opts.Hosts, out.Nodes); err != nil {
		return DevFiles{}, err
	}
	if err := l.issue("tollgate-client", nil, nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, out.Client, out.ClientKey); err != nil {
		return DevFiles{}, err
	}
	gk, err := NewGossipKey()
	if err != nil {
		return DevFiles{}, err
	}
	if err := os.WriteFile(out.GossipKey, []byte(gk+"\n"), 0o600); err != nil {
		return DevFiles{}, fmt.Errorf("tls init: %w", err)
	}
	return out, nil
}

func checkNodeNames(cmd string, nodes []string) error {
	for _, n := range nodes {
		if n == "" || n == "ca" || n == "client" || filepath.Base(n) != n || strings.ContainsAny(n, "/?#%@ ") {
			return fmt.Errorf("%s: node name %q: want a plain name (not ca or client)", cmd, n)
		}
	}
	return nil
}

// IssueNodeCerts (re)issues the node certificates of opts.Nodes in opts.Dir,
// signed by the CA InitDev wrote there (ca.pem, ca-key.pem): for a node added
// later, for new --hosts, or to replace node certificates of earlier builds
// that lack the node URI SAN. Existing node files of those names are
// replaced; the CA, the client certificate and the gossip key are kept, so
// every certificate the CA signed stays valid. Force is ignored.
func IssueNodeCerts(opts DevOptions) (DevFiles, error) {
	const cmd = "tls node-cert"
	if opts.Dir == "" {
		return DevFiles{}, errors.New(cmd + ": the directory of the CA (--dir) is required")
	}
	if len(opts.Nodes) == 0 {
		return DevFiles{}, errors.New(cmd + ": at least one node name is required")
	}
	if err := checkNodeNames(cmd, opts.Nodes); err != nil {
		return DevFiles{}, err
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if opts.Validity == 0 {
		opts.Validity = 2 * 365 * 24 * time.Hour
	}
	p := func(name string) string { return filepath.Join(opts.Dir, name) }
	out := DevFiles{CA: p("ca.pem"), CAKey: p("ca-key.pem"), Client: p("client.pem"), ClientKey: p("client-key.pem"),
		GossipKey: p("gossip.key"), Nodes: map[string][2]string{}}
	for _, n := range opts.Nodes {
		out.Nodes[n] = [2]string{p(n + ".pem"), p(n + "-key.pem")}
	}
	caPEM, err := os.ReadFile(out.CA)
	if err != nil {
		return DevFiles{}, fmt.Errorf("%s: CA certificate: %w (create a PKI with `tollgate tls init`)", cmd, err)
	}
	cas, err := parseCerts(out.CA, caPEM)
	if err != nil {
		return DevFiles{}, fmt.Errorf("%s: %w", cmd, err)
	}
	keyPEM, err := os.ReadFile(out.CAKey)
	if err != nil {
		return DevFiles{}, fmt.Errorf("%s: CA key: %w", cmd, err)
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return DevFiles{}, fmt.Errorf("%s: %s: no PEM private key found", cmd, out.CAKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return DevFiles{}, fmt.Errorf("%s: %s: %w", cmd, out.CAKey, err)
	}
	caKey, ok := k.(*ecdsa.PrivateKey)
	if !ok || !caKey.PublicKey.Equal(cas[0].PublicKey) {
		return DevFiles{}, fmt.Errorf("%s: %s is not the key of the CA in %s", cmd, out.CAKey, out.CA)
	}
	if !cas[0].IsCA {
		return DevFiles{}, fmt.Errorf("%s: %s is not a CA certificate", cmd, out.CA)
	}
	l := leafIssuer{now: opts.Now, validity: opts.Validity, ca: cas[0], caKey: caKey}
	if err := l.nodes(opts.Nodes, opts.Hosts, out.Nodes); err != nil {
		return DevFiles{}, fmt.Errorf("%s: %w", cmd, err)
	}
	return out, nil
}

func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, priv *ecdsa.PrivateKey) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return der, c, err
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("tls init: %s: %w", path, err)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	// Remove first so a --force run does not keep an older file's looser mode.
	_ = os.Remove(path)
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("tls init: %w", err)
	}
	return nil
}

// leafIssuer signs leaf certificates with a CA.
type leafIssuer struct {
	now      time.Time
	validity time.Duration
	ca       *x509.Certificate
	caKey    *ecdsa.PrivateKey
}

func (l leafIssuer) issue(cn string, dns []string, ips []net.IP, uris []*url.URL, usage []x509.ExtKeyUsage, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("tls: %s key: %w", cn, err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: []string{"Tollgate"}},
		NotBefore:   l.now.Add(-time.Hour), // tolerate clocks slightly behind
		NotAfter:    l.now.Add(l.validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: usage,
		DNSNames:    dns,
		IPAddresses: ips,
		URIs:        uris,
	}
	der, _, err := sign(tmpl, l.ca, &key.PublicKey, l.caKey)
	if err != nil {
		return fmt.Errorf("tls: %s: %w", cn, err)
	}
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writeKey(keyFile, key)
}

// nodes issues one node certificate per name into files[name] = {cert, key}:
// server and client auth, the node URI SAN, DNS names <name>, localhost and
// the DNS entries of hosts, IPs 127.0.0.1, ::1 and the IP entries of hosts.
func (l leafIssuer) nodes(names, hosts []string, files map[string][2]string) error {
	dnsExtra, ipExtra := []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(ipExtra, ip.Equal) {
				ipExtra = append(ipExtra, ip)
			}
		} else if !slices.Contains(dnsExtra, h) {
			dnsExtra = append(dnsExtra, h)
		}
	}
	for _, n := range names {
		dns := append([]string{n}, dnsExtra...)
		if err := l.issue(n, slices.Compact(dns), ipExtra, []*url.URL{NodeURI(n)},
			[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, files[n][0], files[n][1]); err != nil {
			return err
		}
	}
	return nil
}
