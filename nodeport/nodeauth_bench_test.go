package nodeport

import "testing"

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
