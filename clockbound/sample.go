package clockbound

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"time"
)

const (
	probeEvery   = time.Second
	probeTimeout = 2 * time.Second
	samplesKept  = 8                // samples kept per peer (smallest RTT wins)
	probeBurst   = 3                // probes per peer per round (smallest RTT kept)
	sampleMaxAge = 30 * time.Second // older samples do not count
	// freshAge: a peer's clock confirms this node's only while its
	// newest sample is at most this old (a peer that stopped answering
	// stops counting before serf calls it failed).
	freshAge = 10 * time.Second
	// probeUnconfirmed: the probe period while this node's clock is not
	// confirmed (just started, or a peer restarted), so it can lead again
	// soon after a majority answers.
	probeUnconfirmed = 250 * time.Millisecond
	// BootHeader is the gRPC response header of Clock.Now naming the
	// answering process's boot (random per start): a prober that sees it
	// change drops that peer's earlier samples, which measured a clock the
	// peer may no longer have.
	BootHeader  = "tollgate-clock-boot"
	transferGap = 2 * time.Second // between leadership hand-offs of one group
)

type sample struct {
	offset time.Duration // this node minus the peer
	rtt    time.Duration
	at     time.Time // mono
}

type peerClock struct {
	id, addr string
	samples  []sample // ring of the last samplesKept
	next     int
	boot     string    // the peer's boot its samples were taken in ("" unknown)
	lastAt   time.Time // mono: the newest sample
	lastErr  string
	probed   bool // a probe finished (answered or failed)
}

func (p *peerClock) bestOrNil(now time.Time) (sample, bool) {
	if p == nil {
		return sample{}, false
	}
	return p.best(now)
}

// fresh reports whether the newest sample is recent enough to confirm a clock.
func (p *peerClock) fresh(now time.Time) bool {
	return p != nil && len(p.samples) > 0 && now.Sub(p.lastAt) <= freshAge
}

// best is the freshest-window sample with the smallest round trip.
func (p *peerClock) best(now time.Time) (sample, bool) {
	var out sample
	ok := false
	for _, s := range p.samples {
		if now.Sub(s.at) > sampleMaxAge {
			continue
		}
		if !ok || s.rtt < out.rtt {
			out, ok = s, true
		}
	}
	return out, ok
}

func signed(d time.Duration) string {
	if d >= 0 {
		return "+" + d.String()
	}
	return d.String()
}

// medianOf picks the median of offsets (this node's own 0 included). With
// an even count the middle value closer to this node's clock is taken: a
// tie never makes a node out of bound.
func medianOf(offs []time.Duration) time.Duration {
	slices.Sort(offs)
	n := len(offs)
	if n%2 == 1 {
		return offs[n/2]
	}
	a, b := offs[n/2-1], offs[n/2]
	if abs(a) <= abs(b) {
		return a
	}
	return b
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// reasonKind is the part of a reason before its first colon ("" when
// Confirmed): logged when it changes, not on every new figure.
func reasonKind(why string) string {
	k, _, _ := strings.Cut(why, ":")
	return k
}

func newBootID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
