package api

import "github.com/tollgate-io/tollgate/layout"

// RateGroup returns the raft group whose leader owns a tenant's rate state:
// the group of partition Partition(fnv1a64(tenant), p). Server and clients
// compute it identically, so a client sends a tenant's reports straight to
// the owner.
func RateGroup(tenant string, p, g int) int {
	return layout.GroupOf(RatePartition(tenant, p), p, g)
}

// RatePartition is the partition of a tenant's rate state: the layout table
// names its group once partitions have moved (RateGroupIn).
func RatePartition(tenant string, p int) int {
	// FNV-1a, 64 bit: spreads short, similar tenant names over the top bits
	// that Partition reads.
	h := uint64(14695981039346656037)
	for i := 0; i < len(tenant); i++ {
		h ^= uint64(tenant[i])
		h *= 1099511628211
	}
	return layout.Partition(h, p)
}

// RateGroupIn is RateGroup by a layout table: the group that owns the
// tenant's partition in t. A raise's moves carry a tenant's rate state to
// the new group's leader as a takeover (docs/online-groups.md).
func RateGroupIn(tenant string, t *layout.Table) int {
	return t.GroupOf(RatePartition(tenant, t.Partitions()))
}
