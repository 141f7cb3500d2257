package history

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// cfgState is a document's version and value. After an unknown-outcome
// compare-and-set that took effect, the new version is not known, only that
// it is above the old one: Exact is false and Version is the lowest it can
// be, until a read or a compare-and-set pins it.
type cfgState struct {
	Version uint64
	Value   string
	Exact   bool
}

// RuntimeConfigModel checks KindConfigGet and KindConfigCAS operations per
// document (Op.Key), each starting at version and value. The server picks a
// successful write's new version (any version above the one replaced, not
// necessarily the next), and reports it.
func RuntimeConfigModel(version uint64, value string) Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []any { return []any{cfgState{Version: version, Value: value, Exact: true}} },
		Step: func(state, input, _ any) []any {
			return stepConfig(state.(cfgState), input.(Op))
		},
		DescribeOperation: describeConfig,
		DescribeState: func(s any) string {
			st := s.(cfgState)
			if !st.Exact {
				return fmt.Sprintf("version ≥ %d %q", st.Version, st.Value)
			}
			return fmt.Sprintf("version %d %q", st.Version, st.Value)
		},
	}
	return Model{name: "runtime config", kinds: []Kind{KindConfigGet, KindConfigCAS}, pm: nm.ToModel()}
}

// matches reports whether the document can be at version v, and the state
// pinned to it.
func (s cfgState) matches(v uint64) (bool, cfgState) {
	if s.Exact {
		return v == s.Version, s
	}
	return v >= s.Version, cfgState{Version: v, Value: s.Value, Exact: true}
}

func stepConfig(s cfgState, op Op) []any {
	switch op.Kind {
	case KindConfigGet:
		if op.Outcome != OK {
			return []any{s} // a read that failed changed nothing
		}
		if ok, p := s.matches(op.Version); ok && op.Value == s.Value {
			return []any{p}
		}
		return nil // a stale (or invented) read
	case KindConfigCAS:
		switch op.Outcome {
		case OK:
			ok, _ := s.matches(op.Expected)
			if !ok || op.Version <= op.Expected {
				return nil // succeeded on a version that was not current
			}
			return []any{cfgState{Version: op.Version, Value: op.Value, Exact: true}}
		case Rejected:
			if ok, _ := s.matches(op.Expected); ok && s.Exact {
				return nil // lost although its version was current
			}
			if op.Version == 0 {
				return []any{s}
			}
			if ok, p := s.matches(op.Version); ok && op.Version != op.Expected {
				return []any{p}
			}
			return nil // named a current version the document did not have
		case Unknown:
			out := []any{s}
			if ok, _ := s.matches(op.Expected); ok {
				out = append(out, cfgState{Version: op.Expected + 1, Value: op.Value})
			}
			return out
		}
		return []any{s} // Failed: no effect
	}
	return nil
}

func describeConfig(input, _ any) string {
	op := input.(Op)
	if op.Kind == KindConfigGet {
		if op.Outcome == OK {
			return fmt.Sprintf("get → version %d %q", op.Version, op.Value)
		}
		return fmt.Sprintf("get → %s %s", op.Outcome, op.Err)
	}
	switch op.Outcome {
	case OK:
		return fmt.Sprintf("cas(%d, %q) → version %d", op.Expected, op.Value, op.Version)
	case Rejected:
		return fmt.Sprintf("cas(%d, %q) → conflict, version %d", op.Expected, op.Value, op.Version)
	}
	return fmt.Sprintf("cas(%d, %q) → %s %s", op.Expected, op.Value, op.Outcome, op.Err)
}
