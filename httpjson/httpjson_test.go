package httpjson

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestWriteUnencodable: a value JSON cannot carry (an infinity, as an HLL
// estimate of a saturated sketch was) is a logged 500 with a JSON reason,
// never a 200 with an empty body.
func TestWriteUnencodable(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	rec := httptest.NewRecorder()
	Write(rec, log, http.StatusOK, map[string]float64{"estimate": math.Inf(1)})
	var e struct{ Error string }
	if rec.Code != http.StatusInternalServerError || json.Unmarshal(rec.Body.Bytes(), &e) != nil || !strings.Contains(e.Error, "encoded") {
		t.Fatalf("infinite value: %d %q", rec.Code, rec.Body)
	}
	if !strings.Contains(logged.String(), "cannot be encoded") {
		t.Fatalf("not logged: %q", logged.String())
	}
	rec = httptest.NewRecorder()
	Write(rec, log, http.StatusCreated, map[string]float64{"estimate": 3})
	if rec.Code != http.StatusCreated || !json.Valid(rec.Body.Bytes()) || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("finite value: %d %q", rec.Code, rec.Body)
	}
}

type doc struct {
	ID    string   `json:"id"`
	N     int64    `json:"n"`
	Q     *float64 `json:"q"`
	Items []string `json:"items"`
}

func TestDecodeObject(t *testing.T) {
	for _, c := range []struct{ body, field, msg string }{
		{`[{"id":"a"}]`, "body", "array"},
		{`"a"`, "body", "string"},
		{`12`, "body", "number"},
		{`null`, "body", "null"},
		{``, "body", "empty"},
		{`{"id":1}`, "id", "string"},
		{`{"n":"10"}`, "n", "integer"},
		{`{"n":1.5}`, "n", "integer"},
		{`{"x":1}`, "x", "unknown"},
		{`{"id":"a"} {"id":"b"}`, "body", "one JSON object"},
		{`{"id":`, "body", "malformed"},
	} {
		var d doc
		e := DecodeObject([]byte(c.body), &d)
		if e == nil || e.Status != http.StatusBadRequest || e.Field != c.field || !strings.Contains(e.Msg, c.msg) {
			t.Errorf("%s: %v, want 400 on field %s saying %q", c.body, e, c.field, c.msg)
		}
	}
	var d doc
	if e := DecodeObject([]byte(` {"id":"a","n":3,"q":1.5,"items":["x"]}`), &d); e != nil || d.ID != "a" || d.N != 3 || *d.Q != 1.5 {
		t.Fatalf("valid: %v %+v", e, d)
	}
	if e := CheckUTF8([]byte("{\"id\":\"inst-\xff\"}")); e == nil || e.Field != "body" || !strings.Contains(e.Msg, "byte 12") {
		t.Fatalf("invalid UTF-8: %v", e)
	}
}

// FuzzDecodeObject: any bytes either decode (and then every string is valid
// UTF-8, as ReadBody guarantees) or are refused with a 4xx naming a field.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range []string{`{"id":"a","n":1}`, `[]`, `{"items":["\ud800"]}`, "{\"id\":\"\xff\"}", `{"q":1e999}`, `{"n":"1"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d doc
		e := CheckUTF8(b)
		if e == nil {
			e = DecodeObject(b, &d)
		}
		if e != nil {
			if e.Status < 400 || e.Status > 499 || e.Field == "" {
				t.Fatalf("%q: refusal %+v", b, e)
			}
			return
		}
		if !utf8.Valid(b) {
			t.Fatalf("%q: accepted invalid UTF-8", b)
		}
		for _, s := range append([]string{d.ID}, d.Items...) {
			if !utf8.ValidString(s) {
				t.Fatalf("%q: decoded string %q is not UTF-8", b, s)
			}
		}
	})
}
