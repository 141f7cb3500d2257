package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// Scope is what a credential may do (see rules.go for which endpoint needs
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

// credentialSet is a parsed credentials file: token hash → credential.
type credentialSet map[[32]byte]*credential

// parseCredentials reads the credentials file. One credential per line:
//
//	# name   token hash                 scopes       tenants (optional)
//	dist-a   sha256:<64 hex digits>     track        tenant-a,tenant-b
//	billing  sha256:<64 hex digits>     meter,read
//	ops      sha256:<64 hex digits>     admin
//
// The file holds SHA-256 hashes of the tokens, never tokens (create one with
// `printf %s "$TOKEN" | sha256sum`). Errors name the line.
func parseCredentials(data []byte) (credentialSet, error) {
	set := credentialSet{}
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) < 3 || len(f) > 4 {
			return nil, fmt.Errorf("credentials line %d: want \"name sha256:<hex> scopes [tenants]\", got %d fields", line, len(f))
		}
		c := &credential{name: f[0], scopes: map[Scope]bool{}}
		if names[c.name] {
			return nil, fmt.Errorf("credentials line %d: name %q given twice", line, c.name)
		}
		names[c.name] = true
		hexHash, ok := strings.CutPrefix(f[1], "sha256:")
		raw, err := hex.DecodeString(hexHash)
		if !ok || err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("credentials line %d (%s): token hash %q: want sha256:<64 hex digits> (printf %%s \"$TOKEN\" | sha256sum)", line, c.name, f[1])
		}
		var h [32]byte
		copy(h[:], raw)
		if set[h] != nil {
			return nil, fmt.Errorf("credentials line %d (%s): same token as %s", line, c.name, set[h].name)
		}
		for _, s := range strings.Split(f[2], ",") {
			switch Scope(s) {
			case ScopeTrack, ScopeMeter, ScopeRead, ScopeAdmin:
				c.scopes[Scope(s)] = true
			default:
				return nil, fmt.Errorf("credentials line %d (%s): scope %q: want track, meter, read or admin", line, c.name, s)
			}
		}
		if len(f) == 4 {
			c.tenants = map[string]bool{}
			for _, t := range strings.Split(f[3], ",") {
				if err := api.ValidateTenantID(t); err != nil {
					return nil, fmt.Errorf("credentials line %d (%s): tenant %q: %w", line, c.name, t, err)
				}
				c.tenants[t] = true
			}
			if c.scopes[ScopeAdmin] {
				return nil, fmt.Errorf("credentials line %d (%s): an admin credential cannot be limited to tenants", line, c.name)
			}
		}
		set[h] = c
	}
	return set, sc.Err()
}

// credStore holds the credentials in force and reloads the file when it
// changes; a file that fails to parse is logged and the previous set stays.
type credStore struct {
	path       string // "" when the admin token is the only credential
	adminToken string // the node's admin token: an admin credential too
	log        *slog.Logger
	set        atomic.Pointer[credentialSet]
	sum        [32]byte
}

func newCredStore(path, adminToken string, log *slog.Logger) (*credStore, error) {
	cs := &credStore{path: path, adminToken: adminToken, log: log}
	if err := cs.reload(); err != nil {
		return nil, err
	}
	return cs, nil
}

func (cs *credStore) reload() error {
	if cs.path == "" {
		// The admin token alone: no scoped credentials.
		cs.set.Store(&credentialSet{})
		return nil
	}
	data, err := os.ReadFile(cs.path)
	if err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
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
	cs.log.Info("credentials loaded", "file", cs.path, "credentials", len(set))
	return nil
}

// watch reloads the file every period until ctx ends.
func (cs *credStore) watch(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := cs.reload(); err != nil {
				cs.log.Error("credentials reload failed; the previous credentials stay in force", "err", err)
			}
		}
	}
}

var adminCredential = &credential{name: "admin-token", scopes: map[Scope]bool{ScopeAdmin: true}}

// lookup returns the credential of the bearer tokens in authorization
// values; nil when none is known.
func (cs *credStore) lookup(authorization []string) *credential {
	set := cs.set.Load()
	for _, v := range authorization {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if !ok {
			continue
		}
		if cs.adminToken != "" && checkAdmin(nil, []string{v}, cs.adminToken) == adminAllowed {
			return adminCredential
		}
		// A lookup by the token's hash: timing reveals nothing about a
		// token's bytes, only (at best) about its hash.
		if c := (*set)[sha256.Sum256([]byte(tok))]; c != nil {
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

// check applies rule r to a caller presenting authorization, acting on
// tenants (r.tenants' answer for the request). It returns the verdict and,
// when refused, why; the credential's name when allowed.
func (cs *credStore) check(r rule, authorization []string, tenants []string) (verdict, string) {
	if r.scope == "" {
		return allowed, ""
	}
	c := cs.lookup(authorization)
	if c == nil {
		hint := ""
		if cs.path == "" {
			hint = "; this node has no credentials file, so its admin token is the only credential"
		}
		return unauthorized, fmt.Sprintf("%s needs a credential with scope %q: send \"Authorization: Bearer <token>\" (missing or unknown token%s)", r.name, r.scope, hint)
	}
	if !c.has(r.scope) {
		return forbidden, fmt.Sprintf("%s needs scope %q; credential %q has %s", r.name, r.scope, c.name, scopeList(c))
	}
	if c.tenants != nil {
		if !r.shared && tenants == nil {
			return forbidden, fmt.Sprintf("%s reads every tenant's data; credential %q is limited to tenants %s", r.name, c.name, tenantList(c))
		}
		for _, t := range tenants {
			if !c.allows(t) {
				return forbidden, fmt.Sprintf("%s on tenant %q: credential %q is limited to tenants %s", r.name, t, c.name, tenantList(c))
			}
		}
	}
	return allowed, c.name
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
