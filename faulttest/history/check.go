package history

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Model is a porcupine model with the operation kinds it checks.
type Model struct {
	name  string
	kinds []Kind
	// skip, if set, leaves out operations that are legal at any point and
	// change nothing: fewer operations for porcupine to place.
	skip func(Op) bool
	pm   porcupine.Model
}

// ErrNotLinearizable is wrapped by Check's error when a history is illegal.
var ErrNotLinearizable = errors.New("history is not linearizable")

// Check checks the operations of m's kinds in ops. An illegal history returns
// an error wrapping ErrNotLinearizable and, when htmlPath is set, writes
// porcupine's visualisation there. A check that does not finish within
// timeout is an error too: a history too large to check proves nothing.
func Check(m Model, ops []Op, htmlPath string, timeout time.Duration) error {
	hist := m.operations(ops)
	if len(hist) == 0 {
		return nil
	}
	res, info := porcupine.CheckOperationsVerbose(m.pm, hist, timeout)
	switch res {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("history: %s: %d operations not checked within %v", m.name, len(hist), timeout)
	}
	// Name the keys that fail and draw only those: a whole fault test's
	// visualisation runs to tens of megabytes.
	var bad []string
	var badOps []porcupine.Operation
	for _, part := range partitionByKey(hist) {
		if r, _ := porcupine.CheckOperationsVerbose(m.pm, part, timeout); r == porcupine.Illegal {
			bad = append(bad, part[0].Input.(Op).Key)
			badOps = append(badOps, part...)
		}
	}
	if len(badOps) > 0 {
		_, info = porcupine.CheckOperationsVerbose(m.pm, badOps, timeout)
	}
	shown, more := bad, ""
	if len(shown) > 20 { // a broken build fails hundreds of keys
		shown, more = shown[:20], fmt.Sprintf(" and %d more", len(bad)-20)
	}
	err := fmt.Errorf("history: %s: %w (%d operations; keys %q%s)", m.name, ErrNotLinearizable, len(hist), shown, more)
	if htmlPath != "" {
		if verr := porcupine.VisualizePath(m.pm, info, htmlPath); verr != nil {
			return fmt.Errorf("%w; visualisation: %w", err, verr)
		}
		err = fmt.Errorf("%w; see %s", err, htmlPath)
	}
	return err
}

// operations converts the ops of m's kinds. An unknown-outcome operation may
// take effect at any time after its call, so it returns after everything
// else (etcd's robustness tests do the same).
func (m Model) operations(ops []Op) []porcupine.Operation {
	var end int64
	for _, op := range ops {
		end = max(end, op.Call, op.Return)
	}
	var out []porcupine.Operation
	for _, op := range ops {
		if !slices.Contains(m.kinds, op.Kind) || (m.skip != nil && m.skip(op)) {
			continue
		}
		ret := op.Return
		if op.Outcome == Unknown {
			ret = end + 1
		}
		in := op
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: in, Call: op.Call, Output: in, Return: ret})
	}
	return out
}

// partitionByKey checks each key on its own.
func partitionByKey(h []porcupine.Operation) [][]porcupine.Operation {
	idx := map[string]int{}
	var out [][]porcupine.Operation
	for _, o := range h {
		k := o.Input.(Op).Key
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], o)
	}
	return out
}
