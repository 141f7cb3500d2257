package access

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/forward"
)

// Scope is what a credential may do (rules.go says which endpoint needs
// which): track (tracking, sketches, rate clients, cluster and summary
// streams), meter (metering writes), read (usage, bills, status and
// dashboard data), admin (everything).
type Scope string

const (
	ScopeTrack Scope = "track"
	ScopeMeter Scope = "meter"
	ScopeRead  Scope = "read"
	ScopeAdmin Scope = "admin"
)

// credential is one line of the credentials file.
type credential struct {
	name    string
	scopes  map[Scope]bool
	tenants map[string]bool // nil: every tenant
}

func (c *credential) has(s Scope) bool { return c.scopes[ScopeAdmin] || c.scopes[s] }

// allows reports whether c may act on tenant.
func (c *credential) allows(tenant string) bool { return c.tenants == nil || c.tenants[tenant] }

// credentialSet is a parsed credentials file: token hash → credential, and
// client certificate identity (certIdentities) → credential.
type credentialSet struct {
	tokens map[[32]byte]*credential
	certs  map[string]*credential
	byName map[string]*credential // forwarded calls name their caller (principal)
}

// parseCredentials reads the credentials file. One credential per line:
//
//	# name   token hash                 scopes       tenants (optional)
//	dist-a   sha256:<64 hex digits>     track        tenant-a,tenant-b
//	billing  sha256:<64 hex digits>     meter,read
//	ops      sha256:<64 hex digits>     admin
//	envoy    cert:spiffe://example.org/envoy   track
//	dist-b   cert:cn=distributor-b      track        tenant-b
//
// The file holds SHA-256 hashes of the tokens, never tokens (create one with
// `printf %s "$TOKEN" | sha256sum`). A "cert:" line maps a verified client
// certificate (mTLS) to scopes instead: by a URI SAN, or by "cn=" and the
// subject's common name. Errors name the line.
func parseCredentials(data []byte) (credentialSet, error) {
	set := credentialSet{tokens: map[[32]byte]*credential{}, certs: map[string]*credential{}, byName: map[string]*credential{}}
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) < 3 || len(f) > 4 {
			return credentialSet{}, fmt.Errorf("credentials line %d: want \"name sha256:<hex> scopes [tenants]\", got %d fields", line, len(f))
		}
		c := &credential{name: f[0], scopes: map[Scope]bool{}}
		if names[c.name] {
			return credentialSet{}, fmt.Errorf("credentials line %d: name %q given twice", line, c.name)
		}
		names[c.name] = true
		set.byName[c.name] = c
		certID, isCert := strings.CutPrefix(f[1], "cert:")
		var h [32]byte
		if isCert {
			if !strings.Contains(certID, "://") && (!strings.HasPrefix(certID, "cn=") || len(certID) == len("cn=")) {
				return credentialSet{}, fmt.Errorf("credentials line %d (%s): certificate identity %q: want cert:<URI SAN> (such as spiffe://domain/name) or cert:cn=<common name>", line, c.name, f[1])
			}
			if set.certs[certID] != nil {
				return credentialSet{}, fmt.Errorf("credentials line %d (%s): same certificate identity as %s", line, c.name, set.certs[certID].name)
			}
		} else {
			hexHash, ok := strings.CutPrefix(f[1], "sha256:")
			raw, err := hex.DecodeString(hexHash)
			if !ok || err != nil || len(raw) != 32 {
				return credentialSet{}, fmt.Errorf("credentials line %d (%s): token hash %q: want sha256:<64 hex digits> (printf %%s \"$TOKEN\" | sha256sum), or cert:<identity>", line, c.name, f[1])
			}
			copy(h[:], raw)
			if set.tokens[h] != nil {
				return credentialSet{}, fmt.Errorf("credentials line %d (%s): same token as %s", line, c.name, set.tokens[h].name)
			}
		}
		for _, s := range strings.Split(f[2], ",") {
			switch Scope(s) {
			case ScopeTrack, ScopeMeter, ScopeRead, ScopeAdmin:
				c.scopes[Scope(s)] = true
			default:
				return credentialSet{}, fmt.Errorf("credentials line %d (%s): scope %q: want track, meter, read or admin", line, c.name, s)
			}
		}
		if len(f) == 4 {
			c.tenants = map[string]bool{}
			for _, t := range strings.Split(f[3], ",") {
				if err := api.ValidateTenantID(t); err != nil {
					return credentialSet{}, fmt.Errorf("credentials line %d (%s): tenant %q: %w", line, c.name, t, err)
				}
				c.tenants[t] = true
			}
			if c.scopes[ScopeAdmin] {
				return credentialSet{}, fmt.Errorf("credentials line %d (%s): an admin credential cannot be limited to tenants", line, c.name)
			}
		}
		if isCert {
			// The nodes' own certificates come from the same CA: a
			// certificate identity never carries the admin scope, which
			// stays with tokens an operator hands out deliberately.
			if c.scopes[ScopeAdmin] {
				return credentialSet{}, fmt.Errorf("credentials line %d (%s): a certificate identity cannot hold the admin scope; use a token", line, c.name)
			}
			set.certs[certID] = c
		} else {
			set.tokens[h] = c
		}
	}
	return set, sc.Err()
}

// Store holds the credentials in force and reloads the file when it
// changes (Watch). A file that fails to parse is logged and the previous set stays
// (an operator's half-finished edit must not lock every client out); a file
// that is gone revokes every credential it held (refuse-all: a deleted file
// is never a reason to keep honouring tokens it no longer lists), with an
// error logged at every reload until it is back. The admin token
// (--admin-token-file) is not in the file and stays valid. A reload that
// changes the set ends the open streams whose credential it revoked or
// changed (track).
type Store struct {
	path       string // "" when the admin token is the only credential
	adminToken string // the node's admin token: an admin credential too
	log        *slog.Logger
	set        atomic.Pointer[credentialSet]
	sum        [32]byte
	missing    bool // the file is gone and its credentials revoked

	streamsMu sync.Mutex
	streams   map[*openStream]struct{}
}

// openStream is a stream that passed the access check, so a reload can
// check it again.
type openStream struct {
	r             Rule
	auth, certIDs []string
	forwardedFor  string // the principal a node forwarded the stream for ("" for a direct caller)
	cred          *credential
	cancel        context.CancelCauseFunc
}

// errRevoked ends a stream whose credential a reload revoked or changed.
var errRevoked = errors.New("credential revoked or changed by a credentials reload")

// track registers a stream opened with credential c under rule r; the
// returned context ends (cause errRevoked) when a reload no longer grants
// it the same credential. untrack must be called when the stream ends.
func (cs *Store) track(ctx context.Context, r Rule, auth, certIDs []string, forwardedFor string, c *credential) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	o := &openStream{r: r, auth: auth, certIDs: certIDs, forwardedFor: forwardedFor, cred: c, cancel: cancel}
	cs.streamsMu.Lock()
	if cs.streams == nil {
		cs.streams = map[*openStream]struct{}{}
	}
	cs.streams[o] = struct{}{}
	cs.streamsMu.Unlock()
	return ctx, func() {
		cs.streamsMu.Lock()
		delete(cs.streams, o)
		cs.streamsMu.Unlock()
		cancel(nil)
	}
}

// endRevoked ends the open streams the set in force no longer grants the
// credential they opened with: unknown now, without the rule's scope, or
// with other tenants.
func (cs *Store) endRevoked() {
	cs.streamsMu.Lock()
	defer cs.streamsMu.Unlock()
	ended := 0
	for o := range cs.streams {
		var presented *credential
		if o.forwardedFor != "" {
			presented = cs.byPrincipal(o.forwardedFor)
		} else {
			presented = cs.lookup(o.auth, o.certIDs)
		}
		v, _, c := cs.checkCred(o.r, presented, nil)
		if v == allowed && c != nil && c.name == o.cred.name && maps.Equal(c.tenants, o.cred.tenants) && (c.tenants == nil) == (o.cred.tenants == nil) {
			continue
		}
		o.cancel(errRevoked)
		delete(cs.streams, o)
		ended++
	}
	if ended > 0 {
		cs.log.Warn("credentials reload ended open streams of revoked or changed credentials", "streams", ended)
	}
}

// NewStore loads the credentials file at path ("" when the admin token is
// the only credential) and holds it with the admin token; Watch keeps it
// current.
func NewStore(path, adminToken string, log *slog.Logger) (*Store, error) {
	cs := &Store{path: path, adminToken: adminToken, log: log}
	if err := cs.Reload(); err != nil {
		return nil, err
	}
	return cs, nil
}

// Reload reads the file again when it changed (see Store for a file that
// fails to parse or is gone).
func (cs *Store) Reload() error {
	if cs.path == "" {
		// The admin token alone: no scoped credentials.
		cs.set.Store(&credentialSet{})
		return nil
	}
	data, err := os.ReadFile(cs.path)
	if errors.Is(err, fs.ErrNotExist) && cs.set.Load() != nil {
		// Gone after it was loaded: refuse every credential it held.
		if !cs.missing {
			cs.missing = true
			cs.sum = [32]byte{}
			cs.set.Store(&credentialSet{})
			cs.endRevoked()
		}
		return fmt.Errorf("credentials file %s is gone: every credential it held is revoked (only the admin token is accepted) until it is back: %w", cs.path, err)
	}
	if err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
	cs.missing = false
	sum := sha256.Sum256(data)
	if sum == cs.sum && cs.set.Load() != nil {
		return nil
	}
	set, err := parseCredentials(data)
	if err != nil {
		return fmt.Errorf("credentials file %s: %w", cs.path, err)
	}
	cs.set.Store(&set)
	cs.sum = sum
	cs.endRevoked()
	cs.log.Info("credentials loaded", "file", cs.path, "tokens", len(set.tokens), "certificate identities", len(set.certs))
	return nil
}

// Watch reloads the file every period until ctx ends.
func (cs *Store) Watch(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := cs.Reload(); err != nil {
				if cs.missing {
					cs.log.Error("credentials file missing; its credentials are revoked", "err", err)
				} else {
					cs.log.Error("credentials reload failed; the previous credentials stay in force", "err", err)
				}
			}
		}
	}
}

var adminCredential = &credential{name: "admin-token", scopes: map[Scope]bool{ScopeAdmin: true}}

// lookup returns the credential of the bearer tokens in authorization
// values; nil when none is known. A caller that sends no token is known by
// its verified client certificate (certIDs, certIdentities) when the file
// maps one; a caller that sends a token is known by the token alone, so a
// wrong token is refused even over a mapped certificate.
func (cs *Store) lookup(authorization, certIDs []string) *credential {
	set := cs.set.Load()
	if len(authorization) == 0 {
		for _, id := range certIDs {
			if c := set.certs[id]; c != nil {
				return c
			}
		}
		return nil
	}
	for _, v := range authorization {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if !ok {
			continue
		}
		if cs.adminToken != "" && CheckAdmin(nil, []string{v}, cs.adminToken) == AdminAllowed {
			return adminCredential
		}
		// A lookup by the token's hash: timing reveals nothing about a
		// token's bytes, only (at best) about its hash.
		if c := set.tokens[sha256.Sum256([]byte(tok))]; c != nil {
			return c
		}
	}
	return nil
}

// verdict is the outcome of the credential rule for one call.
type verdict int

const (
	allowed      verdict = iota
	unauthorized         // no credential, or one the node does not know
	forbidden            // a known credential without the scope or the tenant
)

// principal names credential c (nil: none) in a forwarded call, for the
// node that answers it (byPrincipal).
func principal(c *credential) string {
	switch {
	case c == nil:
		return forward.CallerAnonymous
	case c == adminCredential:
		return forward.CallerAdminToken
	}
	return "cred:" + c.name
}

// byPrincipal is the credential a forwarded call names (nil: anonymous, or
// one this node does not know). Every node reads the same credentials file,
// so a name means the same scopes and tenants here as where it was checked.
func (cs *Store) byPrincipal(p string) *credential {
	if p == forward.CallerAdminToken && cs.adminToken != "" {
		return adminCredential
	}
	if name, ok := strings.CutPrefix(p, "cred:"); ok {
		return cs.set.Load().byName[name]
	}
	return nil
}

// check applies rule r to a caller presenting authorization, acting on
// tenants (r.tenants' answer for the request). It returns the verdict and,
// when refused, why; the credential when allowed (nil for a public rule);
// and the caller's principal (for calls forwarded on its behalf, public
// rules included).
func (cs *Store) check(r Rule, authorization, certIDs, tenants []string) (verdict, string, *credential, string) {
	c := cs.lookup(authorization, certIDs)
	v, why, allowedCred := cs.checkCred(r, c, tenants)
	return v, why, allowedCred, principal(c)
}

// checkCred applies rule r to credential c (nil: none known). It returns
// the verdict, why when refused (the credential's name when allowed), and
// the credential when allowed (nil for a public rule).
func (cs *Store) checkCred(r Rule, c *credential, tenants []string) (verdict, string, *credential) {
	if r.Scope == "" {
		return allowed, "", nil
	}
	if c == nil {
		hint := ""
		if cs.path == "" {
			hint = "; this node has no credentials file, so its admin token is the only credential"
		}
		return unauthorized, fmt.Sprintf("%s needs a credential with scope %q: send \"Authorization: Bearer <token>\" (missing or unknown token%s)", r.name, r.Scope, hint), nil
	}
	if !c.has(r.Scope) {
		return forbidden, fmt.Sprintf("%s needs scope %q; credential %q has %s", r.name, r.Scope, c.name, scopeList(c)), nil
	}
	if c.tenants != nil {
		if !r.Shared && !r.InHandler && tenants == nil {
			return forbidden, fmt.Sprintf("%s reads every tenant's data; credential %q is limited to tenants %s", r.name, c.name, tenantList(c)), nil
		}
		for _, t := range tenants {
			if !c.allows(t) {
				return forbidden, fmt.Sprintf("%s on tenant %q: credential %q is limited to tenants %s", r.name, t, c.name, tenantList(c)), nil
			}
		}
	}
	return allowed, c.name, c
}

// certIdentities are the names a verified client certificate proves: each
// URI SAN, and "cn=" with the subject's common name. Nil without a
// certificate verified against the node's CA (no client auth, or a
// certificate only requested and not verified).
func certIdentities(st *tls.ConnectionState) []string {
	if st == nil || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := st.VerifiedChains[0][0]
	var out []string
	for _, u := range leaf.URIs {
		out = append(out, u.String())
	}
	if leaf.Subject.CommonName != "" {
		out = append(out, "cn="+leaf.Subject.CommonName)
	}
	return out
}

// grpcCertIdentities is certIdentities of a gRPC call's peer.
func grpcCertIdentities(ctx context.Context) []string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		return certIdentities(&ti.State)
	}
	return nil
}

func scopeList(c *credential) string {
	var out []string
	for s := range c.scopes {
		out = append(out, string(s))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func tenantList(c *credential) string {
	var out []string
	for t := range c.tenants {
		out = append(out, t)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
