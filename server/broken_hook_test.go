package server

import "testing"

// The deliberately broken track of broken_build.go exists only in binaries
// built with the tollgate_broken tag: in every other build (this test's
// included, whatever $TOLLGATE_BROKEN says) the hook is nil and track is
// the committed path.
func TestNoBrokenTrackInThisBuild(t *testing.T) {
	if testBreak != nil {
		t.Fatal("testBreak is set in a build without the tollgate_broken tag")
	}
}
