package checker

// AckedHashes returns, per tenant name, every hash acknowledged so far (a
// copy). Tests that must tell "still stored" from "accepted again" read the
// cluster's state for these hashes instead of re-sending them.
func (ck *Checker) AckedHashes() map[string][]uint64 {
	ck.mu.Lock()
	defer ck.mu.Unlock()
	out := make(map[string][]uint64, len(ck.cfg.Tenants))
	for ti, ts := range ck.cfg.Tenants {
		hs := make([]uint64, 0, len(ck.acked[ti]))
		for h := range ck.acked[ti] {
			hs = append(hs, h)
		}
		out[ts.Name] = hs
	}
	return out
}
