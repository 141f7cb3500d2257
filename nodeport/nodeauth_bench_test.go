package nodeport

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkNodeCredential: what one node-to-node call pays for its node
// credential, signing on the caller and verifying (with the replay check) on
// the receiver.
func BenchmarkNodeCredential(b *testing.B) {
	k := NewKeys("n1", clusterKey)
	targets := []string{"127.0.0.1:7300"}
	for b.Loop() {
		c := k.Sign(targets[0], "/tollgate.v1.Admin/NodeGroups", "")
		if _, err := k.Verify(c, targets, "/tollgate.v1.Admin/NodeGroups", ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNodeCredentialCached: the same with the replay cache already
// holding that many nonces (a node under a sustained rate of node calls
// holds rate × 2×CredentialWindow of them: 624,000 at 2,600 calls a
// second). Each iteration's cost must not grow with the cache.
func BenchmarkNodeCredentialCached(b *testing.B) {
	for _, n := range []int{0, 530_000} {
		b.Run(fmt.Sprintf("cached=%d", n), func(b *testing.B) {
			now := time.Unix(1_800_000_000, 0)
			k := NewKeys("n1", clusterKey)
			k.now = func() time.Time { return now }
			targets := []string{"127.0.0.1:7300"}
			for range n {
				if _, err := k.Verify(k.Sign(targets[0], "/tollgate.v1.Shares/Give", ""), targets, "/tollgate.v1.Shares/Give", ""); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				c := k.Sign(targets[0], "/tollgate.v1.Shares/Give", "")
				if _, err := k.Verify(c, targets, "/tollgate.v1.Shares/Give", ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
