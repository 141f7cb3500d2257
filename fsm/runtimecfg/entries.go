package runtimecfg

import (
	"fmt"

	"github.com/tollgate-io/tollgate/fsm"
	"github.com/tollgate-io/tollgate/fsm/wire"
)

// Entry types owned by this module, registered with the FSM at init. 4–6
// are cluster version 3. A document carrying Envoy rate limit configurations
// has a body older builds cannot decode, so it travels in the *Envoy types
// (cluster version 4, same payloads): the version gate keeps it from a group
// with a voter that could not apply it.
const (
	TypeApply        byte = 4  // whole document, compare-and-set on the version
	TypePatch        byte = 5  // set/unset keys of one scope
	TypeInstall      byte = 6  // copy of a version ordered elsewhere; applied if newer
	TypeApplyEnvoy   byte = 7  // TypeApply of a document with an Envoy section
	TypeInstallEnvoy byte = 20 // TypeInstall of a document with an Envoy section
)

func init() {
	fsm.RegisterModuleEntry(ModuleName, TypeApply, "config-apply", 3)
	fsm.RegisterModuleEntry(ModuleName, TypePatch, "config-patch", 3)
	fsm.RegisterModuleEntry(ModuleName, TypeInstall, "config-install", 3)
	fsm.RegisterModuleEntry(ModuleName, TypeApplyEnvoy, "config-apply-envoy", 4)
	fsm.RegisterModuleEntry(ModuleName, TypeInstallEnvoy, "config-install-envoy", 4)
}

// ApplyType is the entry type that carries an apply of d.
func ApplyType(d *Document) byte {
	if len(d.Envoy) > 0 {
		return TypeApplyEnvoy
	}
	return TypeApply
}

// InstallType is the entry type that carries an install of d.
func InstallType(d *Document) byte {
	if len(d.Envoy) > 0 {
		return TypeInstallEnvoy
	}
	return TypeInstall
}

// Apply is the payload of a TypeApply entry: replace the document if the
// current version is Expected. The new version is NewVersion, which must
// exceed the current one; normally Expected+1, higher when the orderer
// re-asserts its document over copies that got ahead of it (after a restore
// of an older backup). Without Force an unchanged document is a no-op that
// keeps the version.
type Apply struct {
	Expected   uint64
	NewVersion uint64
	Force      bool
	Doc        *Document // its Version is ignored
}

// Install is the payload of a TypeInstall entry.
type Install struct {
	Doc *Document // with its version
}

// AppendApply encodes an apply payload:
//
//	byte flags (bit 0: force), uvarint expected, uvarint new version, body
func AppendApply(dst []byte, a Apply) []byte {
	w := wire.Encoder{Buf: dst}
	w.Byte(flagBit0(a.Force))
	w.Uvarint(a.Expected)
	w.Uvarint(a.NewVersion)
	appendBody(&w, a.Doc)
	return w.Buf
}

// DecodeApply decodes an apply payload.
func DecodeApply(b []byte) (Apply, error) {
	r := wire.NewDecoder(b, ErrCorrupt)
	flags := r.Byte("flags")
	if flags&^1 != 0 {
		r.Failf("apply flags %#x have unknown bits", flags)
	}
	a := Apply{Force: flags&1 != 0}
	a.Expected = r.Uvarint("expected version")
	a.NewVersion = r.Uvarint("new version")
	d := readBody(&r)
	d, err := finish(&r, d, a.NewVersion)
	if err != nil {
		return Apply{}, err
	}
	a.Doc = d
	return a, nil
}

// flagBit0 is a flags byte with bit 0 set when set is true. The decoders read
// the byte as flags and refuse unknown bits, so it is not a wire bool.
func flagBit0(set bool) byte {
	if set {
		return 1
	}
	return 0
}

// AppendInstall encodes an install payload: the document (version, body).
func AppendInstall(dst []byte, d *Document) []byte { return AppendDocument(dst, d) }

// AppendPatch encodes a patch payload:
//
//	byte flags (bit 0: has expected), [uvarint expected],
//	byte target kind, [string tenant (target kind 1)],
//	uvarint op count, op count × (byte op, string key, string value)
func AppendPatch(dst []byte, p Patch) []byte {
	w := wire.Encoder{Buf: dst}
	w.Byte(flagBit0(p.HasExpected))
	if p.HasExpected {
		w.Uvarint(p.Expected)
	}
	w.Byte(byte(p.Target.Kind))
	if p.Target.Kind == TargetTenant {
		w.String(p.Target.Tenant)
	}
	w.Uvarint(uint64(len(p.Ops)))
	for _, op := range p.Ops {
		w.Byte(byte(op.Kind))
		w.String(op.Key)
		w.String(op.Value)
	}
	return w.Buf
}

// Bounds of the text in a patch operation.
const (
	maxKeyLen   = 128
	maxValueLen = 256
)

// DecodePatch decodes a patch payload. It checks the framing only: whether the
// keys and values make sense is the patch's application, which every replica
// decides alike.
func DecodePatch(b []byte) (Patch, error) {
	r := wire.NewDecoder(b, ErrCorrupt)
	var p Patch
	flags := r.Byte("flags")
	if flags&^1 != 0 {
		r.Failf("patch flags %#x have unknown bits", flags)
	}
	if flags&1 != 0 {
		p.HasExpected = true
		p.Expected = r.Uvarint("expected version")
	}
	p.Target.Kind = TargetKind(r.Byte("target"))
	switch p.Target.Kind {
	case TargetDefaults, TargetGlobal:
	case TargetTenant:
		p.Target.Tenant = r.String("tenant id", 1<<10)
	default:
		r.Failf("unknown target kind %d", p.Target.Kind)
	}
	n := r.Count("op count", MaxOps)
	for i := 0; i < n && r.Err() == nil; i++ {
		op := Op{Kind: OpKind(r.Byte("op"))}
		if op.Kind < OpSet || op.Kind > OpClear {
			r.Failf("unknown op %d", op.Kind)
		}
		op.Key = r.String("key", maxKeyLen)
		op.Value = r.String("value", maxValueLen)
		p.Ops = append(p.Ops, op)
	}
	if err := r.Finish(); err != nil {
		return Patch{}, err
	}
	return p, nil
}

// ConflictError is the refusal of a compare-and-set: the document changed
// since the caller read it.
type ConflictError struct {
	Expected, Current uint64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("runtime config is at version %d, not %d: it changed since you read it; read it again (tollgate limits get / diff) and retry", e.Current, e.Expected)
}

// Result is what applying one of the module's entries returns through raft's
// ApplyFuture.Response. Err is a refusal (*ConflictError, *FieldError): every
// replica refuses alike and nothing changes.
type Result struct {
	Version uint64 // the version after the entry
	Changed bool
	Err     error
}
