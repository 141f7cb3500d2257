package layouttable

import (
	"testing"

	"github.com/tollgate-io/tollgate/layout"
)

// BenchmarkRoute is the table's cost on the tracking path: Route runs once
// per request (per partition a request's series fall into) on the node that
// decides it. "arithmetic" is what routing cost before the table (a
// division); "replica" routes by group 0's replica, "learned" by a table
// learned from group 0's leader (a node outside group 0: two atomic loads).
//
//	go test -run '^$' -bench BenchmarkRoute ./service/layouttable/
func BenchmarkRoute(b *testing.B) {
	const P, G = 64, 4
	b.Run("arithmetic", func(b *testing.B) {
		sink := 0
		for i := 0; b.Loop(); i++ {
			sink += layout.GroupOf(i%P, P, G)
		}
		_ = sink
	})
	route := func(b *testing.B, s *Service) {
		owners := make([]uint32, P)
		for p := range owners {
			owners[p] = uint32(s.Owner(p))
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			p := i % P
			if _, err := s.Route(p, &owners[p]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("replica", func(b *testing.B) { route(b, newService(b)) })
	b.Run("learned", func(b *testing.B) {
		s := newService(b)
		raised, _, err := layout.ArithmeticTable(P, G).Raise(8)
		if err != nil {
			b.Fatal(err)
		}
		if !s.Learn(raised) {
			b.Fatal("the raised table was not learned")
		}
		route(b, s)
	})
}
