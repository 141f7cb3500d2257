package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// tlsSettings are the server's TLS options (bound in options(), config.go).
// The raft transport reuses the node certificate unless given its own.
type tlsSettings struct {
	cert, key, ca     string
	clientAuth        string // gRPC (and HTTP unless httpClientAuth)
	httpClientAuth    string // "" = clientAuth
	raftCert, raftKey string // "" = cert, key
	raftCA            string // "" = ca
	gossipKey         string // base64
	gossipKeyringFile string
}

// buildTLS turns the TLS settings into server.TLSConfig, loading every file
// now so that a wrong path or a broken PEM file stops the start with an error
// naming the setting and the file.
func (s *serverSettings) buildTLS() []error {
	t := &s.tls
	var errs []error
	bad := func(flag string, err error) {
		from := ""
		if src := s.source[flag]; src != "" && src != "default" {
			from = " (from " + src + ")"
		}
		errs = append(errs, fmt.Errorf("%s: %w%s", strings.ReplaceAll(flag, "-", "_"), err, from))
	}
	for _, m := range []struct{ flag, v string }{{"tls-client-auth", t.clientAuth}, {"tls-http-client-auth", t.httpClientAuth}} {
		if m.v != "" {
			if _, err := tlsutil.ParseClientAuth(m.v); err != nil {
				bad(m.flag, err)
			}
		}
	}
	out := &s.cfg.Access.TLS
	switch {
	case t.cert == "" && t.key == "":
		if t.ca != "" || (t.clientAuth != "" && t.clientAuth != tlsutil.ClientAuthNone) || t.httpClientAuth != "" {
			bad("tls-cert", errors.New("tls_ca and tls_client_auth need tls_cert and tls_key (the node's certificate)"))
		}
	case t.cert == "" || t.key == "":
		bad("tls-cert", errors.New("give both tls_cert and tls_key"))
	default:
		var err error
		if out.GRPC, err = tlsutil.ServerConfig(t.cert, t.key, t.ca, t.clientAuth); err != nil {
			bad("tls-cert", err)
			break
		}
		httpAuth := t.httpClientAuth
		if httpAuth == "" {
			httpAuth = t.clientAuth
		}
		if out.HTTP, err = tlsutil.ServerConfig(t.cert, t.key, t.ca, httpAuth); err != nil {
			bad("tls-http-client-auth", err)
		}
		// Calls to other nodes present this node's certificate (they may
		// require one) and verify theirs against the CA (system roots
		// without one).
		if out.Peer, err = tlsutil.ClientConfig(t.cert, t.key, t.ca, ""); err != nil {
			bad("tls-cert", err)
		}
	}

	rc, rk, rca := or(t.raftCert, t.cert), or(t.raftKey, t.key), or(t.raftCA, t.ca)
	if rc != "" || rk != "" {
		if rca == "" {
			bad("raft-tls-ca", errors.New("the raft transport uses mutual TLS when a certificate is set, and needs a CA to verify peers: set tls_ca or raft_tls_ca"))
		} else {
			// The raft port admits node certificates only; the error of a
			// client certificate or one of earlier builds names the fix.
			flag := "raft-tls-cert"
			if t.raftCert == "" {
				flag = "tls-cert"
			}
			var err error
			if out.RaftServer, out.RaftClient, err = tlsutil.PeerConfigs(rc, rk, rca); err != nil {
				bad(flag, err)
			}
		}
	}

	switch {
	case t.gossipKey != "" && t.gossipKeyringFile != "":
		bad("gossip-key", errors.New("give gossip_key or gossip_keyring_file, not both"))
	case t.gossipKey != "":
		k, err := tlsutil.ParseGossipKey(t.gossipKey)
		if err != nil {
			bad("gossip-key", err)
		}
		out.GossipKeys = [][]byte{k}
	case t.gossipKeyringFile != "":
		keys, err := tlsutil.ReadGossipKeyring(t.gossipKeyringFile)
		if err != nil {
			bad("gossip-keyring-file", err)
		}
		out.GossipKeys = keys
	}
	return errs
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// clientTLSOpts are the TLS flags of the client commands (track, bench, status,
// raft, snapshot, tenant, health). Any of them turns TLS on.
type clientTLSOpts struct {
	ca, cert, key, serverName string
	on                        bool
	// token is the bearer token of tracking commands (track, bench) on
	// clusters with credentials: it needs the track scope (see bearer).
	token string
}

func (o *clientTLSOpts) register(f *pflag.FlagSet) {
	o.registerTLS(f)
	f.StringVar(&o.token, "client-token", os.Getenv("TOLLGATE_TOKEN"), "bearer token for clusters with credentials; tracking needs the track scope (env TOLLGATE_TOKEN; default TOLLGATE_ADMIN_TOKEN, which satisfies every scope)")
}

// registerTLS registers the TLS flags only (commands with a token flag of
// their own).
func (o *clientTLSOpts) registerTLS(f *pflag.FlagSet) {
	f.StringVar(&o.ca, "cacert", os.Getenv("TOLLGATE_CACERT"), "CA certificate (PEM) that signed the nodes' certificates; turns TLS on (env TOLLGATE_CACERT)")
	f.StringVar(&o.cert, "cert", os.Getenv("TOLLGATE_CERT"), "client certificate (PEM) for clusters that require one; turns TLS on (env TOLLGATE_CERT)")
	f.StringVar(&o.key, "key", os.Getenv("TOLLGATE_KEY"), "private key of --cert (env TOLLGATE_KEY)")
	f.StringVar(&o.serverName, "tls-server-name", os.Getenv("TOLLGATE_TLS_SERVER_NAME"), "name to verify in the nodes' certificates (default: the host dialled) (env TOLLGATE_TLS_SERVER_NAME)")
	f.BoolVar(&o.on, "tls", envBool("TOLLGATE_TLS"), "use TLS with the system's CA roots (implied by --cacert/--cert) (env TOLLGATE_TLS)")
}

// bearer is the token the client commands send: --client-token or
// TOLLGATE_TOKEN, else the admin token of TOLLGATE_ADMIN_TOKEN (a node with
// an admin token answers no tenant endpoint without a credential, and the
// admin token satisfies every scope; scoped tokens are for everything that
// should not hold it).
func (o *clientTLSOpts) bearer() string {
	if o.token != "" {
		return o.token
	}
	return os.Getenv("TOLLGATE_ADMIN_TOKEN")
}

func envBool(name string) bool {
	v := strings.ToLower(os.Getenv(name))
	return v == "1" || v == "true" || v == "yes"
}

// config is nil for plaintext.
func (o *clientTLSOpts) config() (*tls.Config, error) {
	if !o.on && o.ca == "" && o.cert == "" && o.key == "" && o.serverName == "" {
		return nil, nil
	}
	c, err := tlsutil.ClientConfig(o.cert, o.key, o.ca, o.serverName)
	if err != nil {
		return nil, fmt.Errorf("client TLS (--cacert/--cert/--key, env TOLLGATE_CACERT/TOLLGATE_CERT/TOLLGATE_KEY): %w", err)
	}
	return c, nil
}

func newTLSCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "tls", Short: "Development certificates and gossip keys"}
	var (
		dir   string
		nodes []string
		hosts []string
		force bool
	)
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create a development CA, node and client certificates, and a gossip key",
		Long: `Create a development PKI in --dir:

  ca.pem, ca-key.pem             a CA (ECDSA P-256); keep ca-key.pem off the nodes
  <node>.pem, <node>-key.pem     one per --nodes name, for server and client use
                                 (nodes dial each other), with DNS names <node>,
                                 localhost, every --hosts entry, IPs 127.0.0.1,
                                 ::1 and every IP in --hosts, and the URI
                                 tollgate://node/<node> that marks a node
  client.pem, client-key.pem     a client certificate for the CLI and clients;
                                 the raft port refuses it (no node URI)
  gossip.key                     a 32-byte serf encryption key (base64); give
                                 it to nodes only

Every node certificate carries every --hosts entry: list the addresses nodes
advertise (the host of --grpc-advertise and --raft-advertise) and the names
clients use. Existing files are kept unless --force: a new CA would strand
every certificate the old one signed (add or reissue node certificates from
the same CA with 'tollgate tls node-cert'). This is for development and
demos; a production cluster takes its certificates from the organisation's
CA, with the URI SAN tollgate://node/<node> in every node certificate.`,
		Example: `  tollgate tls init --dir certs --nodes node-1,node-2,node-3 --hosts 10.0.0.1,10.0.0.2,10.0.0.3
  tollgate server ... --tls-cert certs/node-1.pem --tls-key certs/node-1-key.pem --tls-ca certs/ca.pem \
      --tls-client-auth require --gossip-keyring-file certs/gossip.key`,
		RunE: func(cmd *cobra.Command, args []string) error {
			files, err := tlsutil.InitDev(tlsutil.DevOptions{Dir: dir, Nodes: nodes, Hosts: hosts, Force: force})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "CA:          %s (key %s)\n", files.CA, files.CAKey)
			for _, n := range nodes {
				fmt.Fprintf(out, "%-12s %s (key %s)\n", n+":", files.Nodes[n][0], files.Nodes[n][1])
			}
			fmt.Fprintf(out, "client:      %s (key %s)\ngossip key:  %s\n", files.Client, files.ClientKey, files.GossipKey)
			return nil
		},
	}
	f := initCmd.Flags()
	f.StringVar(&dir, "dir", "certs", "output directory")
	f.StringSliceVar(&nodes, "nodes", []string{"node-1", "node-2", "node-3"}, "node names (comma-separated): one certificate each")
	f.StringSliceVar(&hosts, "hosts", nil, "extra DNS names and IPs in every node certificate (comma-separated)")
	f.BoolVar(&force, "force", false, "overwrite existing files")

	var ncDir string
	var ncNodes, ncHosts []string
	nodeCmd := &cobra.Command{
		Use:   "node-cert",
		Short: "Issue or reissue node certificates from the CA of 'tls init'",
		Long: `Issue a node certificate for every --nodes name, signed by the CA that
'tollgate tls init' wrote in --dir (ca.pem, ca-key.pem), replacing that
node's files if they exist. The CA, the client certificate and the gossip key
are kept, so every other certificate stays valid.

Use it to add a node to a development PKI, to add --hosts, or to replace node
certificates written by builds before node certificates carried the URI SAN
tollgate://node/<node>: nodes refuse to start with such a certificate, and
the raft port admits node certificates only. Roll the new certificates out
first (restart each node with its new files; any build accepts them, as the
CA is the same), then upgrade the nodes one at a time.`,
		Example: `  tollgate tls node-cert --dir certs --nodes node-1,node-2,node-3 --hosts 10.0.0.1,10.0.0.2,10.0.0.3`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			files, err := tlsutil.IssueNodeCerts(tlsutil.DevOptions{Dir: ncDir, Nodes: ncNodes, Hosts: ncHosts})
			if err != nil {
				return err
			}
			for _, n := range ncNodes {
				fmt.Fprintf(cmd.OutOrStdout(), "%-12s %s (key %s)\n", n+":", files.Nodes[n][0], files.Nodes[n][1])
			}
			return nil
		},
	}
	nf := nodeCmd.Flags()
	nf.StringVar(&ncDir, "dir", "certs", "directory holding ca.pem and ca-key.pem; node files are written there")
	nf.StringSliceVar(&ncNodes, "nodes", nil, "node names (comma-separated): one certificate each")
	nf.StringSliceVar(&ncHosts, "hosts", nil, "extra DNS names and IPs in every node certificate (comma-separated)")
	_ = nodeCmd.MarkFlagRequired("nodes")

	keyCmd := &cobra.Command{
		Use:   "gossip-key",
		Short: "Print a new random gossip encryption key (base64, 32 bytes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := tlsutil.NewGossipKey()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), k)
			return nil
		},
	}
	cmd.AddCommand(initCmd, nodeCmd, keyCmd)
	return cmd
}

// serverTLSInfo is the banner's line about TLS.
func serverTLSInfo(c server.TLSConfig) string {
	var on []string
	if c.GRPC != nil {
		on = append(on, "grpc (client certs: "+authName(c.GRPC.ClientAuth)+")")
	}
	if c.HTTP != nil {
		on = append(on, "http (client certs: "+authName(c.HTTP.ClientAuth)+")")
	}
	if c.RaftServer != nil {
		on = append(on, "raft (mutual)")
	}
	if len(c.GossipKeys) > 0 {
		on = append(on, "gossip (encrypted)")
	}
	if len(on) == 0 {
		return "off (plaintext)"
	}
	return strings.Join(on, ", ")
}

func authName(a tls.ClientAuthType) string {
	switch a {
	case tls.RequireAndVerifyClientCert:
		return tlsutil.ClientAuthRequire
	case tls.VerifyClientCertIfGiven:
		return tlsutil.ClientAuthRequest
	}
	return tlsutil.ClientAuthNone
}

// tlsHint adds what to do when the error looks like a TLS mismatch between
// the command and the node: gRPC's own messages ("error reading server
// preface", "first record does not look like a TLS handshake") do not say it.
func tlsHint(err error, tlsOn bool) error {
	msg := err.Error()
	switch {
	case !tlsOn && (strings.Contains(msg, "server preface") || strings.Contains(msg, "connection reset")):
		return fmt.Errorf("%w\n(the node may serve TLS: set --cacert, and --cert/--key if it requires client certificates, or TOLLGATE_CACERT/TOLLGATE_CERT/TOLLGATE_KEY)", err)
	case tlsOn && strings.Contains(msg, "first record does not look like a TLS handshake"):
		return fmt.Errorf("%w\n(the node serves plaintext: drop --cacert/--cert/--key and TOLLGATE_CACERT/TOLLGATE_CERT/TOLLGATE_KEY)", err)
	case tlsOn && (strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate") || strings.Contains(msg, "unknown certificate authority")):
		return fmt.Errorf("%w\n(the node refused this client's certificate, or this client does not trust the node's: check --cert/--key and --cacert)", err)
	}
	return err
}

// certProblem asks addr, with the client's TLS settings, whether the node
// refuses this client's certificate, and says so in words; nil when the
// handshake and the first read pass, or fail for another reason. Under TLS
// 1.3 the client finishes its side of the handshake before the server
// checks the client's certificate, so gRPC sees only a closed connection
// and a missing or foreign certificate used to look like a timeout: this
// probe waits for the server's alert instead.
func certProblem(ctx context.Context, addr string, tc *tls.Config) error {
	if tc == nil {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cfg := tc.Clone()
	cfg.NextProtos = []string{"h2"}
	c, err := (&tls.Dialer{Config: cfg}).DialContext(dctx, "tcp", addr)
	if err == nil {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		// A healthy gRPC server sends its HTTP/2 settings; a refusing one
		// its alert.
		_, err = c.Read(make([]byte, 1))
	}
	if err == nil {
		return nil
	}
	msg := err.Error()
	noCert := len(tc.Certificates) == 0 && tc.GetClientCertificate == nil
	switch {
	case strings.Contains(msg, "certificate required") || (noCert && strings.Contains(msg, "bad certificate")):
		return fmt.Errorf("%s requires a client certificate and this client sent none: set --cert and --key (or TOLLGATE_CERT/TOLLGATE_KEY)", addr)
	case strings.Contains(msg, "unknown certificate authority") || strings.Contains(msg, "bad certificate") ||
		strings.Contains(msg, "certificate unknown") || strings.Contains(msg, "expired certificate"):
		return fmt.Errorf("%s refused this client's certificate (%v): it is not signed by a CA the node trusts (--tls-ca), has expired, or is not a client certificate", addr, err)
	case strings.Contains(msg, "x509:"):
		return fmt.Errorf("this client does not trust %s's certificate (%v): check --cacert (TOLLGATE_CACERT)", addr, err)
	}
	return nil
}

// speaksTLS reports whether addr answers a TLS handshake: the clientlib's
// "layout not known" after a timeout does not say that a plaintext client
// talked to a TLS node. The probe sends no request, so not verifying the
// node's certificate here exposes nothing.
func speaksTLS(ctx context.Context, addr string) bool {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // diagnostic probe, no data sent
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		var alert tls.AlertError
		return errors.As(err, &alert) // the node answered in TLS (e.g. asked for a certificate)
	}
	c.Close()
	return true
}
