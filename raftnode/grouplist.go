package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// The group list records how many groups a data dir holds when groups were
// added at runtime (Host.AddGroup), so that New opens them again after a
// restart even if Config.Groups still names the boot count. Group ids are
// dense (0..n-1), so the list is a count. It is one 20-byte file,
// <DataDir>/groups, all integers big-endian:
//
//	offset 0:  8 bytes  magic "TGGROUPS"
//	offset 8:  1 byte   format version (1)
//	offset 9:  3 bytes  zero
//	offset 12: 4 bytes  n, the number of groups (1..MaxGroups)
//	offset 16: 4 bytes  CRC-32C (Castagnoli) of bytes 0..15
//
// It is replaced whole (a temporary file, fsync, rename, fsync of the
// directory), so a crash leaves the old list or the new one. A file that is
// short, long, or fails any check is corruption: New refuses to start and
// names the file rather than silently forget a group this node votes in.
const (
	groupListName    = "groups"
	groupListMagic   = "TGGROUPS"
	groupListVersion = 1
	groupListLen     = 20
)

// ErrGroupListCorrupt wraps every error about an unreadable group list.
var ErrGroupListCorrupt = errors.New("raftnode: group list corrupt")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func groupListPath(dataDir string) string { return filepath.Join(dataDir, groupListName) }

func encodeGroupList(n int) []byte {
	b := make([]byte, groupListLen)
	copy(b, groupListMagic)
	b[8] = groupListVersion
	binary.BigEndian.PutUint32(b[12:], uint32(n))
	binary.BigEndian.PutUint32(b[16:], crc32.Checksum(b[:16], crcTable))
	return b
}

func decodeGroupList(b []byte) (int, error) {
	if len(b) != groupListLen {
		return 0, fmt.Errorf("%d bytes, want %d", len(b), groupListLen)
	}
	if got, want := binary.BigEndian.Uint32(b[16:]), crc32.Checksum(b[:16], crcTable); got != want {
		return 0, fmt.Errorf("checksum %08x, want %08x", got, want)
	}
	if string(b[:8]) != groupListMagic {
		return 0, fmt.Errorf("bad magic %q", b[:8])
	}
	if b[8] != groupListVersion {
		return 0, fmt.Errorf("unknown version %d", b[8])
	}
	if b[9] != 0 || b[10] != 0 || b[11] != 0 {
		return 0, errors.New("reserved bytes not zero")
	}
	n := int(binary.BigEndian.Uint32(b[12:]))
	if n < 1 || n > MaxGroups {
		return 0, fmt.Errorf("group count %d, want 1..%d", n, MaxGroups)
	}
	return n, nil
}

// ListedGroups returns the number of groups dataDir's group list records, or
// 0 when it has none (no group was ever added at runtime). A node starting
// on dataDir opens max(Config.Groups, ListedGroups) groups, so its caller
// can size its per-group state (FSMs) before New.
func ListedGroups(dataDir string) (int, error) {
	p := groupListPath(dataDir)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("raftnode: read group list: %w", err)
	}
	n, err := decodeGroupList(b)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrGroupListCorrupt, p, err)
	}
	return n, nil
}

// writeGroupList durably replaces dataDir's group list with n.
func writeGroupList(dataDir string, n int) error {
	p := groupListPath(dataDir)
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("raftnode: write group list: %w", err)
	}
	_, werr := f.Write(encodeGroupList(n))
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("raftnode: write group list: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("raftnode: write group list: %w", err)
	}
	return syncDir(dataDir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("raftnode: sync %s: %w", dir, err)
	}
	serr := d.Sync()
	cerr := d.Close()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("raftnode: sync %s: %w", dir, err)
	}
	return nil
}

// RecordGroups records that dataDir holds n groups, as AddGroup does for a
// group added at runtime: a node started on it opens n groups whatever its
// Config.Groups. For seeding a data dir offline with the groups of a
// cluster whose count was raised (tollgate snapshot restore --offline). A
// list that records n or more already is kept.
func RecordGroups(dataDir string, n int) error {
	if n < 1 || n > MaxGroups {
		return fmt.Errorf("raftnode: record groups: count %d, want 1..%d", n, MaxGroups)
	}
	have, err := ListedGroups(dataDir)
	if err != nil || have >= n {
		return err
	}
	return writeGroupList(dataDir, n)
}
