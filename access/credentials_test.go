package access

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-io/tollgate/api"
)

func TestParseCredentials(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for _, c := range []struct{ file, err string }{
		{"a sha256:" + h + " track\n", ""},
		{"# comment\n\na sha256:" + h + " track,read t1,t2\n", ""},
		{"a " + h + " track\n", "sha256:"},
		{"a sha256:abc track\n", "sha256:"},
		{"a sha256:" + h + " write\n", `scope "write"`},
		{"a sha256:" + h + " admin t1\n", "admin credential"},
		{"a sha256:" + h + " track\nb sha256:" + h + " read\n", "same token"},
		{"a sha256:" + h + " track\na sha256:" + strings.Repeat("cd", 32) + " read\n", "given twice"},
		{"a sha256:" + h + " track bad/tenant\n", "tenant"},
		{"a sha256:" + h + "\n", "line 1"},
		{"a cert:cn=dist track t1\n", ""},
		{"a cert:spiffe://example.org/envoy track\n", ""},
		{"a cert:dist track\n", "certificate identity"},
		{"a cert:cn= track\n", "certificate identity"},
		{"a cert:cn=ops admin\n", "admin scope"},
		{"a cert:cn=x track\nb cert:cn=x read\n", "same certificate identity"},
	} {
		_, err := parseCredentials([]byte(c.file))
		if (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%q: %v, want %q", c.file, err, c.err)
		}
	}
}

// TestStoreReload: a changed file takes effect on Reload; a file that no
// longer parses keeps the credentials in force; a deleted file revokes
// every credential it held (the admin token stays); and a stream opened
// with a credential ends, cause errRevoked, when a reload removes it,
// while a stream of a credential the reload kept stays open.
func TestStoreReload(t *testing.T) {
	line := func(name, scopes string) string {
		h := sha256.Sum256([]byte("tok-" + name))
		return name + " sha256:" + hex.EncodeToString(h[:]) + " " + scopes + "\n"
	}
	p := filepath.Join(t.TempDir(), "credentials")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(line("a", "track") + line("b", "track"))
	cs, err := NewStore(p, "admin-tok", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := GRPCRule(api.Tracker_WatchCluster_FullMethodName)
	open := func(name string) context.Context {
		auth := []string{"Bearer tok-" + name}
		v, why, c, _ := cs.check(r, auth, nil, nil)
		if v != allowed {
			t.Fatalf("%s: %s", name, why)
		}
		ctx, untrack := cs.track(context.Background(), r, auth, nil, "", c)
		t.Cleanup(untrack)
		return ctx
	}
	known := func(name string) bool { return cs.lookup([]string{"Bearer tok-" + name}, nil) != nil }
	ctxA, ctxB := open("a"), open("b")

	write(line("b", "track"))
	if err := cs.Reload(); err != nil {
		t.Fatal(err)
	}
	if known("a") || !known("b") {
		t.Fatalf("after removing a: a known %v, b known %v", known("a"), known("b"))
	}
	if !errors.Is(context.Cause(ctxA), errRevoked) {
		t.Fatalf("a's stream after a was removed: cause %v, want errRevoked", context.Cause(ctxA))
	}
	if ctxB.Err() != nil {
		t.Fatalf("b's stream ended by a reload that kept b: %v", context.Cause(ctxB))
	}

	write("broken line\n")
	if err := cs.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("broken file: %v, want an error naming line 1", err)
	}
	if !known("b") || ctxB.Err() != nil {
		t.Fatal("a broken file revoked the credentials in force")
	}

	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := cs.Reload(); err == nil {
		t.Fatal("deleted file: no error")
	}
	if known("b") || !errors.Is(context.Cause(ctxB), errRevoked) {
		t.Fatalf("deleted file: b known %v, b's stream cause %v", known("b"), context.Cause(ctxB))
	}
	if c := cs.lookup([]string{"Bearer admin-tok"}, nil); c != adminCredential {
		t.Fatal("deleted file: the admin token was revoked too")
	}
}
