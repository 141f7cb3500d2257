package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Node certificates. Every certificate the cluster's CA signs passes the CA
// check, and the CA also signs the certificates of clients and the CLI; the
// raft port must tell the two apart, or a holder of a client certificate
// could vote, call elections and append entries as a node. A node
// certificate carries a URI subject alternative name
//
//	tollgate://node/<node name>
//
// which `tollgate tls init` and `tollgate tls node-cert` write and which an
// organisation's CA can add to the certificates it issues to nodes (every
// mainstream issuer supports URI SANs, as SPIFFE IDs use them). Client
// certificates never carry it.
const (
	nodeURIScheme = "tollgate"
	nodeURIHost   = "node"
)

// NodeURI is the URI SAN that marks a node certificate for the node name.
func NodeURI(name string) *url.URL {
	return &url.URL{Scheme: nodeURIScheme, Host: nodeURIHost, Path: "/" + name}
}

// NodeName returns the node name of c's node URI SAN, and whether c is a
// node certificate at all.
func NodeName(c *x509.Certificate) (string, bool) {
	if c == nil {
		return "", false
	}
	for _, u := range c.URIs {
		if u.Scheme == nodeURIScheme && u.Host == nodeURIHost && u.User == nil && u.RawQuery == "" && u.Fragment == "" {
			if name := strings.TrimPrefix(u.Path, "/"); name != "" && !strings.Contains(name, "/") {
				return name, true
			}
		}
	}
	return "", false
}

// ErrNotNodeCert is wrapped by every error about a certificate that is not a
// node certificate where one is required.
var ErrNotNodeCert = errors.New("not a node certificate")

// reissueHint is what an operator does about a certificate without the node
// URI: a development PKI reissues its node certificates from the same CA;
// an organisation's CA adds the URI SAN.
const reissueHint = "node certificates carry the URI SAN tollgate://node/<name>; " +
	"certificates from `tollgate tls init` of earlier builds lack it: reissue them from the same CA with " +
	"`tollgate tls node-cert --dir <certs dir> --nodes <name>` (or add the URI SAN with your own CA), and never give a node the client certificate"

// CheckNodeCert explains why c cannot serve as a node's certificate on the
// raft port, or returns nil. file names where c came from.
func CheckNodeCert(file string, c *x509.Certificate) error {
	if _, ok := NodeName(c); ok {
		return nil
	}
	kind := "it has no tollgate://node/<name> URI SAN"
	if isClientOnly(c) {
		kind = "it is a client certificate (extended key usage client auth only, no node URI SAN)"
	}
	return fmt.Errorf("tls cert %s: certificate %q is %w: %s; %s", file, c.Subject.CommonName, ErrNotNodeCert, kind, reissueHint)
}

// isClientOnly: c lists extended key usages and server auth is not among them.
func isClientOnly(c *x509.Certificate) bool {
	if len(c.ExtKeyUsage) == 0 {
		return false
	}
	for _, u := range c.ExtKeyUsage {
		if u == x509.ExtKeyUsageServerAuth || u == x509.ExtKeyUsageAny {
			return false
		}
	}
	return true
}

// CheckServerCert refuses a certificate that cannot serve a TLS listener
// because its extended key usages exclude server authentication (the client
// certificate of `tollgate tls init`, given to a node by mistake): clients
// would fail every handshake with an opaque error.
func CheckServerCert(file string, c *x509.Certificate) error {
	if isClientOnly(c) {
		return fmt.Errorf("tls cert %s: certificate %q is a client certificate (extended key usage client auth only) and cannot serve a node's listeners; give the node its own certificate (`tollgate tls init` writes <node>.pem)", file, c.Subject.CommonName)
	}
	return nil
}

// requireNodePeer is a tls.Config.VerifyConnection for the raft port: after
// the usual chain verification, the peer's certificate must be a node
// certificate. It runs on both ends, so a node neither accepts RPCs from nor
// sends its log to anything but a node.
func requireNodePeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("raft peer presented no certificate: %w", ErrNotNodeCert)
	}
	leaf := cs.PeerCertificates[0]
	if _, ok := NodeName(leaf); !ok {
		return fmt.Errorf("raft peer certificate %q (serial %x) is %w (no tollgate://node/<name> URI SAN): only nodes may speak raft",
			leaf.Subject.CommonName, leaf.SerialNumber, ErrNotNodeCert)
	}
	return nil
}
