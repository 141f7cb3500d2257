package fsm

// The minute clock: a series' last-seen time is stored as one byte,
// the minutes elapsed since the last 2-hour boundary of Unix time. Only relative
// ages are ever needed and idle timeouts are at most an hour, so a 120-minute ring
// is unambiguous as long as nothing older than ~119 minutes stays in the map. The
// FSM guarantees that (see FSM.applyTrack: it expires on its own when expire entries
// stopped arriving for a while).

// RingMinutes is the period of the minute clock.
const RingMinutes = 120

// MaxIdleMinutes bounds the configured idle timeout so that the ring never wraps
// for a live series (age < MaxIdleAge + selfExpireAfter < RingMinutes).
const MaxIdleMinutes = 60

// MaxIdleAge is the largest idle age an expire entry may carry: IdleAge of
// MaxIdleMinutes.
const MaxIdleAge = MaxIdleMinutes + 1

// IdleAge returns the age, in whole minutes of the clock, at which a series is
// idle under an idle timeout of timeoutMinutes (a series seen within
// the timeout is active).
//
// Ages are whole minutes: a series stamped in minute m and judged in minute n has
// age n−m, but was last seen between n−m−1 and n−m+1 minutes earlier. Idle at
// age ≥ timeout would expire a series seen at :59 of minute m at the start of
// minute m+timeout, a minute early. Idle at age ≥ timeout+1 means it was seen more
// than timeout minutes ago: the effective timeout lies in (timeout, timeout+1]
// minutes, never below the configured one, at most a minute above it.
func IdleAge(timeoutMinutes int) int { return timeoutMinutes + 1 }

// selfExpireAfter: if this many minutes pass between expire entries, the FSM expires
// by itself before applying the next entry.
const selfExpireAfter = 30

// MinuteOf returns the one-byte clock value of a Unix minute.
func MinuteOf(unixMinute int64) uint8 {
	m := unixMinute % RingMinutes
	if m < 0 {
		m += RingMinutes
	}
	return uint8(m)
}

// Age returns how many minutes before now the clock value m was written, in [0, 120).
func Age(nowUnixMinute int64, m uint8) int {
	a := (int(MinuteOf(nowUnixMinute)) - int(m)) % RingMinutes
	if a < 0 {
		a += RingMinutes
	}
	return a
}

// ExpiredTable returns, for every byte value, whether a series last seen at that
// clock value is idle at now with the given idle timeout (age ≥ idle). Byte values
// outside the ring (≥ 120) never occur in a valid map and are marked expired.
func ExpiredTable(nowUnixMinute int64, idleMinutes int) *[256]bool {
	var t [256]bool
	for m := 0; m < 256; m++ {
		t[m] = m >= RingMinutes || Age(nowUnixMinute, uint8(m)) >= idleMinutes
	}
	return &t
}
