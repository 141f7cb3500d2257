package fsm

import (
	"errors"
	"fmt"
	"slices"

	"github.com/tollgate-io/tollgate/fsm/wire"
)

// Module is application state that lives in a group's FSM beside the series
// maps: runtime configuration, metering spans, tenant shares. A module owns
// entry types (rows of the registry in entry.go naming it) and one section of
// the group's snapshot. The FSM does the raft plumbing: it decodes the
// envelope, checks the type against the cluster version, hands the payload to
// the module, and frames the module's snapshot bytes with a checksum.
//
// Every method runs on raft's apply goroutine (Apply, Snapshot, Restore are
// never concurrent with each other). Reads a module serves to other goroutines
// need its own synchronisation.
type Module interface {
	// Name identifies the module's snapshot section and its registry rows:
	// 1..64 bytes of [a-z0-9-], stable forever.
	Name() string
	// Apply applies one entry of a type this module owns. It must be
	// deterministic: every replica applies the same entries in the same order
	// and must reach the same state and the same response. A semantic
	// refusal (a conflict, a duplicate) is part of the response, never an
	// error. An error means the payload cannot be decoded: the group halts
	// on this replica, as for a corrupt core entry (see FSM.Apply).
	Apply(e ModuleEntry) (any, error)
	// Snapshot captures the module's state. The returned function encodes it
	// later, possibly concurrently with further Applies, so it must own an
	// immutable copy. A nil function means "no state": no section is written.
	Snapshot() (func() ([]byte, error), error)
	// PrepareRestore decodes and validates a section written by Snapshot
	// (data is nil when the snapshot has no section for the module: restore
	// to empty) and returns the function that installs it. Splitting the two
	// lets the FSM validate every part of a snapshot before changing
	// anything, so a bad snapshot leaves all state untouched.
	PrepareRestore(data []byte) (commit func(), err error)
}

// ModuleEntry is one committed entry handed to its module.
type ModuleEntry struct {
	Type    byte
	Index   uint64 // raft index; 0 when applied without raft (tests, tools)
	Term    uint64
	Now     int64  // Unix minute stamped by the leader in the envelope
	Payload []byte // the module's bytes; owned by the module after Apply
}

// ErrNoModule is wrapped when an entry names a module that this FSM was not
// configured with: a wiring bug, handled like an unknown entry type.
var ErrNoModule = errors.New("no module for entry type")

// setupModules validates the configured modules and indexes them by name.
func (f *FSM) setupModules() error {
	f.modules = map[string]Module{}
	for _, m := range f.cfg.Modules {
		name := m.Name()
		if msg := validModuleName(name); msg != "" {
			return fmt.Errorf("fsm config: module %s", msg)
		}
		if f.modules[name] != nil {
			return fmt.Errorf("fsm config: module %q configured twice", name)
		}
		f.modules[name] = m
		f.moduleNames = append(f.moduleNames, name)
	}
	slices.Sort(f.moduleNames)
	return nil
}

// Module returns the configured module of that name (nil if none).
func (f *FSM) Module(name string) Module { return f.modules[name] }

func validModuleName(name string) string {
	if len(name) < 1 || len(name) > 64 {
		return fmt.Sprintf("name %q must be 1..64 bytes", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Sprintf("name %q: byte %d is not one of [a-z0-9-]", name, i)
		}
	}
	return ""
}

// applyModule hands a module entry to its module. An error is returned to
// Apply, which halts the group.
func (f *FSM) applyModule(r *entryType, e *Entry, index, term uint64) (any, error) {
	m := f.modules[r.module]
	if m == nil {
		return nil, fmt.Errorf("%w: type %d (%s) belongs to module %q, which group %d is not configured with", ErrNoModule, r.typ, r.name, r.module, f.cfg.Group)
	}
	res, err := m.Apply(ModuleEntry{Type: e.Type, Index: index, Term: term, Now: e.Now, Payload: e.Payload})
	if err != nil {
		return nil, fmt.Errorf("%w: %s entry: %w", ErrBadEntry, r.name, err)
	}
	return res, nil
}

// AppendModuleEntry appends an encoded entry of a module-owned type: the
// envelope (version, type, now, checksum) around the module's payload.
func AppendModuleEntry(dst []byte, typ byte, now int64, payload []byte) ([]byte, error) {
	r := lookupType(typ)
	if r == nil || r.module == "" {
		return dst, fmt.Errorf("%w: %d is not a module entry type", ErrUnknownEntryType, typ)
	}
	return appendEntry(dst, r, &Entry{Type: typ, Now: now, Payload: payload}), nil
}

func encodeModule(dst []byte, e *Entry) []byte { return append(dst, e.Payload...) }

func decodeModule(d *wire.Decoder, e *Entry) {
	e.Payload = append([]byte(nil), d.Raw("payload", uint64(d.Len()))...)
}
