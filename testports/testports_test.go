package testports

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestPickIsFreeAndNeverRepeats(t *testing.T) {
	r := &Range{Lo: 40000, Hi: 40050}
	seen := map[int]bool{}
	for range 20 {
		p, err := r.Pick()
		if err != nil {
			t.Fatal(err)
		}
		if p < r.Lo || p >= r.Hi || seen[p] {
			t.Fatalf("port %d: outside [%d, %d) or repeated", p, r.Lo, r.Hi)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("picked port %d is not free: %v", p, err)
		}
		_ = l.Close()
	}
}

func TestPickRefusesBadRangeAndExhaustion(t *testing.T) {
	if _, err := (&Range{Lo: 10, Hi: 10}).Pick(); err == nil {
		t.Fatal("empty range: want an error")
	}
	// A port held open is never picked: a range of one held port is exhausted.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := l.Addr().(*net.TCPAddr).Port
	if got, err := (&Range{Lo: p, Hi: p + 1}).Pick(); err == nil {
		t.Fatalf("picked %d, which is in use", got)
	}
}

// TestPickSkipsPortsReservedElsewhere: a port whose lock file another
// holder has locked (here a second open file description of it, as another
// test process would have) is never picked, though nothing listens on it.
func TestPickSkipsPortsReservedElsewhere(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	_ = l.Close() // free: only the reservation stands in the way
	if err := os.MkdirAll(reserveDir, 0o777); err != nil {
		t.Skipf("no lock directory: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(reserveDir, fmt.Sprintf("%d.lock", p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Skipf("port %d is reserved by another test process already", p)
	}
	if got, err := (&Range{Lo: p, Hi: p + 1}).Pick(); err == nil {
		t.Fatalf("picked %d, which another process reserved", got)
	}
	_ = f.Close() // released, as at that process's exit
	if got, err := (&Range{Lo: p, Hi: p + 1}).Pick(); err != nil || got != p {
		t.Fatalf("after the release: Pick = %d, %v; want %d", got, err, p)
	}
}
