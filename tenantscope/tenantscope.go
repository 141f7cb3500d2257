package tenantscope

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Scope is what a credential limited to tenants may act on.
type Scope struct {
	// Credential names the credential (for error messages).
	Credential string
	// Tenants are the tenants it may act on; nil: every tenant.
	Tenants map[string]bool
}

type key struct{}

// With returns ctx carrying sc. A nil sc (or one with nil Tenants) leaves
// ctx unrestricted.
func With(ctx context.Context, sc *Scope) context.Context {
	if sc == nil || sc.Tenants == nil {
		return ctx
	}
	return context.WithValue(ctx, key{}, sc)
}

// From returns the scope ctx carries; nil when the caller may act on every
// tenant (no credentials configured, or a credential without a tenant
// list).
func From(ctx context.Context) *Scope {
	sc, _ := ctx.Value(key{}).(*Scope)
	return sc
}

// Check returns nil when the caller of ctx may act on every tenant in
// tenants, else a PermissionDenied status naming the first tenant refused
// and what the credential may act on. field names where the tenants come
// from (such as "events[3].organization_id"), for the message.
func Check(ctx context.Context, field string, tenants ...string) error {
	sc := From(ctx)
	if sc == nil {
		return nil
	}
	for _, t := range tenants {
		if !sc.Tenants[t] {
			return status.Errorf(codes.PermissionDenied, "%s %q: credential %q is limited to tenants %s", field, t, sc.Credential, sc.list())
		}
	}
	return nil
}

func (sc *Scope) list() string {
	out := make([]string, 0, len(sc.Tenants))
	for t := range sc.Tenants {
		out = append(out, t)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
