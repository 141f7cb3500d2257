package runtimecfg

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/tollgate-io/tollgate/fsm"
)

// ModuleName names the module's registry rows and snapshot section.
const ModuleName = "runtime-config"

// Module is the fsm.Module holding one group's replica of the runtime
// configuration. Current is lock-free and safe from any goroutine; Apply,
// Snapshot and PrepareRestore run on raft's apply goroutine.
type Module struct {
	cur      atomic.Pointer[Document]
	onChange func(*Document)
}

// New returns an empty module (version 0). onChange, if not nil, is called on
// the apply goroutine after every change of the document (including a
// restore); it must not block.
func New(onChange func(*Document)) *Module {
	m := &Module{onChange: onChange}
	m.cur.Store(&Document{})
	return m
}

// Name implements fsm.Module.
func (m *Module) Name() string { return ModuleName }

// Current returns the document in force on this replica (never nil; Version 0
// when none was ever replicated). It must not be modified.
func (m *Module) Current() *Document { return m.cur.Load() }

// Apply implements fsm.Module: it applies an apply, patch or install entry.
// Refusals (a version conflict, an invalid patch) are Results with Err set;
// an error return means the payload does not decode, and halts the group.
func (m *Module) Apply(e fsm.ModuleEntry) (any, error) {
	cur := m.cur.Load()
	switch e.Type {
	case TypeApply, TypeApplyEnvoy:
		a, err := DecodeApply(e.Payload)
		if err != nil {
			return nil, err
		}
		if cur.Version != a.Expected {
			return Result{Version: cur.Version, Err: &ConflictError{Expected: a.Expected, Current: cur.Version}}, nil
		}
		if !a.Force && SameContent(cur, a.Doc) {
			return Result{Version: cur.Version}, nil
		}
		if a.NewVersion <= cur.Version {
			return Result{Version: cur.Version, Err: fmt.Errorf("new version %d does not exceed the current version %d", a.NewVersion, cur.Version)}, nil
		}
		m.set(a.Doc)
		return Result{Version: a.Doc.Version, Changed: true}, nil
	case TypePatch:
		p, err := DecodePatch(e.Payload)
		if err != nil {
			return nil, err
		}
		if p.HasExpected && cur.Version != p.Expected {
			return Result{Version: cur.Version, Err: &ConflictError{Expected: p.Expected, Current: cur.Version}}, nil
		}
		n, err := cur.ApplyPatch(p)
		if err != nil {
			return Result{Version: cur.Version, Err: err}, nil
		}
		if SameContent(cur, n) {
			return Result{Version: cur.Version}, nil
		}
		n.Version = cur.Version + 1
		m.set(n)
		return Result{Version: n.Version, Changed: true}, nil
	case TypeInstall, TypeInstallEnvoy:
		d, err := DecodeDocument(e.Payload)
		if err != nil {
			return nil, err
		}
		// Copies only move forward: a stale install (a deposed orderer's, or
		// one overtaken by a newer) is a no-op.
		if d.Version <= cur.Version {
			return Result{Version: cur.Version}, nil
		}
		m.set(d)
		return Result{Version: d.Version, Changed: true}, nil
	}
	return nil, fmt.Errorf("%w: type %d is not a runtime-config entry", fsm.ErrNoModule, e.Type)
}

func (m *Module) set(d *Document) {
	m.cur.Store(d)
	if m.onChange != nil {
		m.onChange(d)
	}
}

// Snapshot implements fsm.Module. Documents are immutable, so the pointer is
// the copy.
func (m *Module) Snapshot() (func() ([]byte, error), error) {
	d := m.cur.Load()
	if d.Version == 0 {
		return nil, nil
	}
	return func() ([]byte, error) { return AppendDocument(nil, d), nil }, nil
}

// PrepareRestore implements fsm.Module.
func (m *Module) PrepareRestore(data []byte) (func(), error) {
	d := &Document{}
	if data != nil {
		var err error
		if d, err = DecodeDocument(data); err != nil {
			return nil, err
		}
		if d.Version == 0 {
			return nil, errors.New("runtime-config section with version 0")
		}
	}
	return func() { m.set(d) }, nil
}
