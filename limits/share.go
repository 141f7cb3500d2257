package limits

// Split is how a tenant-wide max_series is divided among the raft groups.
type Split uint8

const (
	// Movable divides the limit so that the groups' bases telescope to
	// exactly the limit: ⌊limit·hi/P⌋ − ⌊limit·lo/P⌋. Headroom then moves
	// between groups (the delta), never beyond the limit.
	Movable Split = iota
	// Static gives each group ⌈limit·(hi−lo)/P⌉, fixed: the shares may sum
	// to a little more than the limit (less than one series per group).
	Static
)

// NoHeadroom is the share of a limited tenant whose group has no headroom
// left (its base was lowered, or given away, to zero or below): the group
// admits no new series.
const NoHeadroom int64 = -1

// GroupShare is the one rule for a group's share of a tenant-wide
// max_series, used by the state machine's shares module, the share mover,
// the server and the fault checker. The group owns partitions [lo, hi) of
// p. base is its part of limit, divided by split; share is what the group
// admits new series up to (ShareOver: base + delta − reservedOut). An
// unlimited tenant (limit 0) has base and share 0.
func GroupShare(limit int64, lo, hi, p int, split Split, delta, reservedOut int64) (base, share int64) {
	if limit <= 0 {
		return 0, 0
	}
	if split == Static {
		num := limit * int64(hi-lo)
		base = (num + int64(p) - 1) / int64(p)
	} else {
		base = mulDiv(limit, hi, p) - mulDiv(limit, lo, p)
	}
	return base, ShareOver(limit, base, delta, reservedOut)
}

// ShareOver is GroupShare's share for a caller that holds the group's base
// already (the share mover asks its host for it): base + delta − reservedOut,
// where delta is the headroom the group received minus what it gave, and
// reservedOut the headroom its leader promised to gives not applied yet. 0
// for an unlimited tenant; NoHeadroom when nothing positive is left.
func ShareOver(limit, base, delta, reservedOut int64) int64 {
	if base == 0 && limit == 0 {
		return 0
	}
	if v := base + delta - reservedOut; v > 0 {
		return v
	}
	return NoHeadroom
}

// mulDiv is ⌊limit·n/p⌋ without overflowing int64 for huge limits: split
// into quotient and remainder first.
func mulDiv(limit int64, n, p int) int64 {
	q, r := limit/int64(p), limit%int64(p)
	return q*int64(n) + r*int64(n)/int64(p)
}
