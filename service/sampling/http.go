package sampling

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"time"

	"github.com/tollgate-io/tollgate/httpjson"
)

// BacklogPath is where the server mounts Handler.
const BacklogPath = "/api/v1/backlog"

// maxBodyBytes bounds a report: the JSON of one report is well under 1 KiB.
const maxBodyBytes = 4 << 10

// Reporter takes backlog reports; *Controller is one. The server may wrap it
// (for example to forward reports to the config owner).
type Reporter interface {
	ReportBacklog(kind, source string, backlog float64, now time.Time) (Status, error)
}

// BacklogRequest is the body of POST /api/v1/backlog.
type BacklogRequest struct {
	Kind string `json:"kind"`
	// Backlog is required (a pointer tells 0 from left out).
	Backlog *float64 `json:"backlog"`
	// Source names the reporting queue; optional.
	Source string `json:"source,omitempty"`
}

// Handler serves POST /api/v1/backlog: a JSON BacklogRequest, answered 200 with
// the controller's Status, or a 4xx with {"error": "..."}: 405 for another
// method, 415 for a non-JSON Content-Type, 413 for a body over 4 KiB, 400 for
// malformed JSON, unknown fields, a missing kind or backlog, a negative backlog
// or a bad source, 422 for a kind no controller handles, 429 when max_sources
// fresh sources already report, 503 (Retry-After) when the Reporter cannot
// reach the controller (ErrUnavailable). It does no authentication: the server wraps it
// in its admin rule.
type Handler struct {
	r   Reporter
	now func() time.Time
}

// NewHandler returns a Handler for r; now may be nil (time.Now).
func NewHandler(r Reporter, now func() time.Time) *Handler {
	if now == nil {
		now = time.Now
	}
	return &Handler{r: r, now: now}
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("backlog: method %s not allowed; POST a JSON report", req.Method))
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("backlog: Content-Type %q; send application/json", ct))
			return
		}
	}
	var body BacklogRequest
	raw, e := httpjson.ReadBody(w, req, maxBodyBytes) // invalid UTF-8 is refused before decoding
	if e == nil {
		e = httpjson.DecodeObject(raw, &body)
	}
	if e != nil {
		if e.Status == http.StatusRequestEntityTooLarge {
			e.Msg = fmt.Sprintf("body over %d bytes", maxBodyBytes)
		}
		writeError(w, e.Status, "backlog: "+e.Error())
		return
	}
	switch {
	case body.Kind == "":
		writeError(w, http.StatusBadRequest, `backlog: "kind" is required`)
		return
	case body.Backlog == nil:
		writeError(w, http.StatusBadRequest, `backlog: "backlog" is required`)
		return
	}
	st, err := h.r.ReportBacklog(body.Kind, body.Source, *body.Backlog, h.now())
	switch {
	case err == nil:
	case errors.Is(err, ErrUnknownKind):
		writeError(w, http.StatusUnprocessableEntity, "backlog: "+err.Error())
		return
	case errors.Is(err, ErrTooManySources):
		writeError(w, http.StatusTooManyRequests, "backlog: "+err.Error())
		return
	case errors.Is(err, ErrUnavailable):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "backlog: "+err.Error())
		return
	default:
		writeError(w, http.StatusBadRequest, "backlog: "+err.Error())
		return
	}
	httpjson.Write(w, nil, http.StatusOK, st)
}

func writeError(w http.ResponseWriter, code int, msg string) { httpjson.WriteError(w, code, msg) }
