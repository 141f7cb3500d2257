package ui

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	res := rec.Result()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func TestHandlerServesEmbeddedFiles(t *testing.T) {
	h := Handler()
	for path, want := range map[string]struct{ ctype, contains string }{
		"/ui/":          {"text/html", `<script src="app.js">`},
		"/ui/app.js":    {"text/javascript", "../api/v1/overview"},
		"/ui/style.css": {"text/css", ".member.h-failed"},
	} {
		res, body := get(t, h, path)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, res.StatusCode)
		}
		if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, want.ctype) {
			t.Errorf("GET %s: Content-Type %q, want %s", path, ct, want.ctype)
		}
		if !strings.Contains(body, want.contains) {
			t.Errorf("GET %s: body lacks %q", path, want.contains)
		}
	}
	if res, _ := get(t, h, "/ui/missing.js"); res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /ui/missing.js: %d, want 404", res.StatusCode)
	}
}

// The dashboard must work on a node without internet access: nothing it
// ships may load from another origin.
func TestNoExternalResources(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(`)
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := external.FindString(line); m != "" {
				t.Errorf("%s:%d refers to %q: the dashboard must not load anything from outside the node", p, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
