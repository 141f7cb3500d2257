package version

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	i := Info{Version: "1.2.3", Revision: "0123456789abcdef", Modified: true, GoVersion: "go1.26"}
	if got, want := i.String(), "tollgate 1.2.3 (revision 0123456789ab+dirty, go1.26)"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if g := Get(); g.Version != Version || !strings.HasPrefix(g.GoVersion, "go") {
		t.Fatalf("Get() = %+v", g)
	}
}
