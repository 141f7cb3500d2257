package layoutfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tollgate-io/tollgate/nodeid"
)

// Name is the file's name in the data dir.
const Name = "cluster.json"

// Layout is a data dir's recorded layout.
type Layout struct {
	Partitions int `json:"partitions"`
	Groups     int `json:"groups"`
	Shards     int `json:"shards"`
}

// Read returns the layout recorded in dataDir; a missing, unreadable or
// malformed file is an error naming it.
func Read(dataDir string) (Layout, error) {
	path := filepath.Join(dataDir, Name)
	var have Layout
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, &have)
	}
	if err != nil {
		return Layout{}, fmt.Errorf("read %s: %w", path, err)
	}
	if have.Partitions <= 0 || have.Groups <= 0 || have.Shards <= 0 {
		return Layout{}, fmt.Errorf("read %s: partitions=%d groups=%d shards=%d: not a layout (a damaged file?)", path, have.Partitions, have.Groups, have.Shards)
	}
	return have, nil
}

// Check records want in a data dir that has no layout yet, or checks want
// against the recorded one, and returns the recorded group count (the base
// of the layout's arithmetic). A group count above it is accepted up to
// raised, the raft groups the data dir lists: the cluster raised its count
// online and the operator now names it.
func Check(dataDir string, want Layout, raised int) (int, error) {
	path := filepath.Join(dataDir, Name)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return want.Groups, write(path, want)
	}
	have, err := Read(dataDir)
	if err != nil {
		return 0, err
	}
	named := want.Groups
	if have.Groups < want.Groups && want.Groups <= raised {
		want.Groups = have.Groups
	}
	if have != want {
		return 0, fmt.Errorf("data dir %s was created with partitions=%d groups=%d shards=%d, but this node is configured with partitions=%d groups=%d shards=%d; the layout is fixed when a cluster is created",
			dataDir, have.Partitions, have.Groups, have.Shards, want.Partitions, named, want.Shards)
	}
	return have.Groups, nil
}

// write creates the file durably (nodeid.WriteFileDurable: a temporary
// file synced, renamed into place, the directory synced), so that a power
// cut leaves either no file (the next start writes it again) or the whole
// one.
func write(path string, l Layout) error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	return nodeid.WriteFileDurable(path, append(b, '\n'))
}
