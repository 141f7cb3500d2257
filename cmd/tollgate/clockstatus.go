package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/tollgate-io/tollgate/api"
)

// clockRow is one node's clock as the answering node measures it.
type clockRow struct {
	node    string
	offset  time.Duration // the node's clock minus the cluster's median clock
	rtt     time.Duration
	age     time.Duration
	err     string
	self    bool
	unknown bool
}

// clockRows turns one node's Offsets answer into every node's offset from
// the median clock: the answering node's measurements put every clock in its
// own frame (peer = −offset), and the median of those is the reference.
func clockRows(o *api.ClockOffsetsResponse) []clockRow {
	median := -time.Duration(o.MedianOffsetNanos) // the median clock in the answering node's frame
	rows := []clockRow{{node: o.NodeId, offset: -median, self: true}}
	for _, p := range o.Peers {
		r := clockRow{node: p.NodeId, rtt: time.Duration(p.RttNanos), age: time.Duration(p.AgeNanos), err: p.Error}
		if p.RttNanos == 0 && p.AgeNanos == 0 {
			r.unknown = true
		} else {
			r.offset = -time.Duration(p.OffsetNanos) - median
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b clockRow) int {
		switch {
		case a.node < b.node:
			return -1
		case a.node > b.node:
			return 1
		}
		return 0
	})
	return rows
}

func fmtOffset(d time.Duration) string {
	s := d.Round(100 * time.Microsecond).String()
	if d >= 0 {
		s = "+" + s
	}
	return s
}

// printClock writes the CLOCK section of `tollgate status`.
func printClock(out io.Writer, o *api.ClockOffsetsResponse) {
	bound := time.Duration(o.MaxOffsetNanos)
	fmt.Fprintf(out, "\nclock: max offset %s; offsets from the cluster's median clock, measured by %s\n", bound, o.NodeId)
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tOFFSET\tRTT\tAGE\tCLOCK")
	for _, r := range clockRows(o) {
		state := "ok"
		switch {
		case r.unknown:
			state = "not measured"
			if r.err != "" {
				state += ": " + r.err
			}
		case r.offset > bound || r.offset < -bound:
			state = "OUT OF BOUND: may not lead"
		case r.self && !o.InBound:
			// Within bound of the median but not confirmed by a majority
			// of clocks (the reason is printed below the table).
			state = "NOT CONFIRMED: may not lead"
		}
		off, rtt, age := fmtOffset(r.offset), r.rtt.Round(10*time.Microsecond).String(), r.age.Round(100*time.Millisecond).String()
		if r.self {
			rtt, age = "-", "-"
		}
		if r.unknown {
			off, rtt, age = "?", "-", "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.node, off, rtt, age, state)
	}
	w.Flush()
	if o.Reason != "" {
		fmt.Fprintf(out, "%s: %s\n", o.NodeId, o.Reason)
	}
}

// clockOffsets asks the node behind cc for its clock measurements; nil when
// it predates the Clock service.
func clockOffsets(ctx context.Context, cc api.ClockClient) *api.ClockOffsetsResponse {
	o, err := cc.Offsets(ctx, &api.ClockOffsetsRequest{})
	if err != nil {
		return nil
	}
	return o
}
