package ui

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Handler serves the dashboard's files. Mount it at "/ui/": it strips that
// prefix itself, so "/ui/" answers with index.html.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		// fs.Sub fails only for an invalid directory name, and "static" is
		// valid; answer rather than panic should that ever change.
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "ui: embedded files: "+err.Error(), http.StatusInternalServerError)
		})
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The files change with the binary, not while it runs; no-cache makes
		// a browser revalidate after an upgrade instead of mixing versions.
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	})
}
