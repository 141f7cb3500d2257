package access

import (
	"strings"
	"testing"
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
