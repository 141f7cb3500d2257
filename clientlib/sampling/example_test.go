package sampling_test

import (
	"fmt"

	"github.com/tollgate-io/tollgate/clientlib/sampling"
)

func Example() {
	s := sampling.New(sampling.Options{})
	// What the runtime config pushes: the seed's example, an API key at 60% of
	// locate traffic under a global locate rate of 50%.
	err := s.Update(sampling.Rates{
		Version: 7,
		Global:  map[string]float64{"locate": 50},
		Keys:    map[string]map[string]float64{"key-a": {"locate": 60}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.Rate("key-a", "locate"), s.Rate("key-b", "locate"), s.Rate("key-a", "submit"))

	kept := 0
	for id := range uint64(100_000) {
		if s.ShouldSampleItem("key-a", "locate", id) {
			kept++
		}
	}
	fmt.Printf("kept ≈ %.0f%%\n", float64(kept)/1000)

	fmt.Println(s.Update(sampling.Rates{Version: 6}))
	// Output:
	// 30 50 100
	// kept ≈ 30%
	// sampling: stale rates version: got version 6, version 7 is in force
}
