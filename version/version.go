// Package version reports which build of Tollgate is running: the release
// version (set with -ldflags "-X github.com/tollgate-io/tollgate/version.Version=…"),
// and the VCS revision Go stamps into the binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version; "dev" for builds not stamped by the release
// process.
var Version = "dev"

// Info describes the running build.
type Info struct {
	Version   string // release version, or "dev"
	Revision  string // VCS commit, "unknown" when not stamped
	Modified  bool   // the working tree had uncommitted changes at build time
	GoVersion string
}

// Get returns the running build's information.
func Get() Info {
	info := Info{Version: Version, Revision: "unknown", GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	return info
}

// String is the one-line form printed by `tollgate --version`.
func (i Info) String() string {
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if i.Modified {
		rev += "+dirty"
	}
	return fmt.Sprintf("tollgate %s (revision %s, %s)", i.Version, rev, i.GoVersion)
}
