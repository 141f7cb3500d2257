package tenantscope

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCheck: without a scope every tenant passes; with one, only its
// tenants, and a refusal is PermissionDenied naming the field, the tenant
// and the credential.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	if err := Check(ctx, "f", "any"); err != nil {
		t.Fatalf("unscoped: %v", err)
	}
	if With(ctx, &Scope{Credential: "all"}) != ctx {
		t.Fatal("a scope without a tenant list restricts")
	}
	sc := With(ctx, &Scope{Credential: "meter-a", Tenants: map[string]bool{"a": true, "c": true}})
	if err := Check(sc, "f", "a", "c"); err != nil {
		t.Fatalf("own tenants: %v", err)
	}
	err := Check(sc, "events[2].organization_id", "a", "b")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `events[2].organization_id "b"`) ||
		!strings.Contains(err.Error(), `"meter-a"`) || !strings.Contains(err.Error(), "a,c") {
		t.Fatalf("other tenant: %v", err)
	}
	if err := Check(sc, "f", ""); err == nil {
		t.Fatal("the empty tenant passed a scoped check")
	}
}
