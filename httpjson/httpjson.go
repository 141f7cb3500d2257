package httpjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// Error is a refused request: the HTTP status to answer and the reason,
// naming the field (or "body", or a query parameter) when one is at fault.
type Error struct {
	Status int
	Field  string
	Msg    string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return fmt.Sprintf("field %s: %s", e.Field, e.Msg)
}

// Bad returns a 400 naming field.
func Bad(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// RequireJSON refuses (415) a Content-Type that is not JSON.
func RequireJSON(r *http.Request) *Error {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return &Error{Status: http.StatusUnsupportedMediaType, Msg: fmt.Sprintf("Content-Type %q: the body must be JSON (application/json)", ct)}
	}
	return nil
}

// ReadBody reads at most limit bytes of r's body: 413 beyond, 400 when the
// bytes are not valid UTF-8 (naming the offset of the first bad byte).
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *Error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("body exceeds %d bytes", mbe.Limit)}
		}
		return nil, &Error{Status: http.StatusBadRequest, Msg: "read body: " + err.Error()}
	}
	if e := CheckUTF8(body); e != nil {
		return nil, e
	}
	return body, nil
}

// CheckUTF8 refuses (400, field "body") bytes that are not valid UTF-8.
func CheckUTF8(b []byte) *Error {
	if utf8.Valid(b) {
		return nil
	}
	off := 0
	for off < len(b) {
		r, n := utf8.DecodeRune(b[off:])
		if r == utf8.RuneError && n <= 1 {
			break
		}
		off += n
	}
	return Bad("body", "not valid UTF-8 (byte %d is %#02x); JSON text must be UTF-8", off, b[off])
}

// DecodeObject decodes body, which must be one JSON object, into v (a
// pointer to a struct): unknown fields, values of the wrong type, a body
// that is an array or a scalar, and trailing data are 400s naming the field.
// Call ReadBody (or CheckUTF8) first.
func DecodeObject(body []byte, v any) *Error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return Bad("body", "empty; want a JSON object")
	}
	if !json.Valid(body) {
		dec := json.NewDecoder(bytes.NewReader(body))
		var first json.RawMessage
		if err := dec.Decode(&first); err != nil {
			return Bad("body", "malformed JSON: %v", err)
		}
		return Bad("body", "one JSON object per request: data follows it at byte %d", dec.InputOffset())
	}
	if trimmed[0] != '{' {
		return Bad("body", "want a JSON object, got %s", jsonKind(trimmed[0]))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return FieldError(err)
	}
	return nil
}

// FieldError turns an encoding/json decode error into a 400 naming the field.
func FieldError(err error) *Error {
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		return Bad(field, "expected %s, got JSON %s", typeName(te.Type.String()), te.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		if unq := strings.Trim(name, `"`); unq != "" {
			return Bad(unq, "unknown field")
		}
		return Bad("body", "unknown field %s", name)
	}
	return Bad("body", "%v", err)
}

func typeName(t string) string {
	switch {
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"), strings.HasPrefix(t, "*int"), strings.HasPrefix(t, "*uint"):
		return "an integer"
	case strings.Contains(t, "float"):
		return "a number"
	case strings.HasSuffix(t, "string"):
		return "a string"
	case strings.HasSuffix(t, "bool"):
		return "true or false"
	case strings.HasPrefix(t, "[]"), strings.HasPrefix(t, "*[]"):
		return "an array"
	}
	return "an object"
}

func jsonKind(c byte) string {
	switch c {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// Query parses r's query strictly: a pair with a bad escape ("%zz") or a
// semicolon separator is a 400 naming its parameter, where r.URL.Query()
// drops the pair silently (a bad page_token then read as none, answering
// the first page); keys and values must be UTF-8 (CheckQuery).
func Query(r *http.Request) (url.Values, *Error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		field := "query"
		for _, part := range strings.Split(r.URL.RawQuery, "&") {
			k, v, _ := strings.Cut(part, "=")
			uk, ek := url.QueryUnescape(k)
			if _, ev := url.QueryUnescape(v); ek == nil && (ev != nil || strings.Contains(part, ";")) {
				field = uk
				break
			}
			if ek != nil {
				break
			}
		}
		return nil, Bad(field, "malformed query: %v", err)
	}
	if e := CheckQuery(q); e != nil {
		return nil, e
	}
	return q, nil
}

// CheckQuery refuses (400 naming the parameter) query keys or values that
// are not valid UTF-8: Go's url parsing keeps the raw bytes, and ids read
// from a query must obey the same rule as ids in a body.
func CheckQuery(q url.Values) *Error {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !utf8.ValidString(k) {
			return Bad("query", "a parameter name is not valid UTF-8")
		}
		for _, v := range q[k] {
			if !utf8.ValidString(v) {
				return Bad(k, "not valid UTF-8")
			}
		}
	}
	return nil
}

// Write encodes v completely, then answers code with it. When v cannot be
// encoded (a NaN or an infinity, say) the client gets a 500 naming the
// cause and log (nil: slog.Default) records it: never a 200 with an empty
// or truncated body.
func Write(w http.ResponseWriter, log *slog.Logger, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		if log == nil {
			log = slog.Default()
		}
		log.Error("http: JSON answer cannot be encoded", "type", fmt.Sprintf("%T", v), "err", err)
		WriteError(w, http.StatusInternalServerError, "internal error: the answer could not be encoded as JSON: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// WriteError answers {"error": msg}.
func WriteError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(map[string]string{"error": msg}) // a string map always encodes
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// WriteErr answers e.
func WriteErr(w http.ResponseWriter, e *Error) { WriteError(w, e.Status, e.Error()) }
