package nodeport

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const credMethod = "/tollgate.v1.Shares/Give"

// testKeys returns a signer and a verifier of one cluster whose clocks read
// *at.
func testKeys(at *time.Time) (signer, verifier *Keys) {
	signer, verifier = NewKeys("n1", clusterKey), NewKeys("n2", clusterKey)
	signer.now = func() time.Time { return *at }
	verifier.now = signer.now
	return signer, verifier
}

func verifyOnce(t *testing.T, signer, verifier *Keys) string {
	t.Helper()
	c := signer.Sign("127.0.0.1:7300", credMethod, "")
	if id, err := verifier.Verify(c, []string{"127.0.0.1:7300"}, credMethod, ""); err != nil || id != "n1" {
		t.Fatalf("a fresh credential: id %q, %v", id, err)
	}
	return c
}

// The replay cache forgets each nonce two windows after its time, and only
// then: within that, a replay is refused as a replay; after it, by its time.
// What a sweep costs is what it removes (see BenchmarkNodeCredentialCached).
func TestReplayCacheForgetsByTime(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	signer, verifier := testKeys(&now)
	var creds []string
	for range 1000 {
		creds = append(creds, verifyOnce(t, signer, verifier))
		now = now.Add(10 * time.Millisecond) // 10 s in all
	}
	if n := len(verifier.seen); n != 1000 {
		t.Fatalf("the cache holds %d nonces after 1,000 credentials, want 1,000", n)
	}
	check := func(c, want string) {
		t.Helper()
		_, err := verifier.Verify(c, []string{"127.0.0.1:7300"}, credMethod, "")
		if !errors.Is(err, ErrBadCredential) || !strings.Contains(err.Error(), want) {
			t.Fatalf("a credential used before: %v, want %q", err, want)
		}
	}
	// Just inside the window of the last credential: every one is a replay.
	now = now.Add(CredentialWindow - time.Second)
	for _, c := range creds[990:] {
		check(c, "replayed")
	}
	// Two windows after the last one's time, every nonce is gone, and each
	// credential is refused by its time.
	now = now.Add(CredentialWindow + 3*time.Second)
	verifyOnce(t, signer, verifier)
	if n, e := len(verifier.seen), len(verifier.expiry); n != 1 || e != 1 {
		t.Fatalf("two windows on, the cache holds %d nonces in %d seconds, want 1 in 1", n, e)
	}
	for _, c := range creds[:10] {
		check(c, "from this node's clock")
	}
}

// A verifier whose clock steps back by more than a window keeps refusing a
// replay: a nonce whose expiry second was swept already is kept to the next
// sweep after the clock is back there.
func TestReplayCacheClockStepsBack(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	signer, verifier := testKeys(&now)
	verifyOnce(t, signer, verifier)
	now = now.Add(-5 * time.Minute)
	c := verifyOnce(t, signer, verifier)
	now = now.Add(time.Minute)
	if _, err := verifier.Verify(c, []string{"127.0.0.1:7300"}, credMethod, ""); err == nil || !strings.Contains(err.Error(), "replayed") {
		t.Fatalf("a replay after the clock stepped back 5 min: %v", err)
	}
}

// The cache is bounded: past the bound a valid credential is refused (and
// says why), and once the nonces expire it is accepted again.
func TestReplayCacheBound(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	signer, verifier := testKeys(&now)
	verifier.maxSeen = 10
	for range 10 {
		verifyOnce(t, signer, verifier)
	}
	c := signer.Sign("127.0.0.1:7300", credMethod, "")
	if _, err := verifier.Verify(c, []string{"127.0.0.1:7300"}, credMethod, ""); err == nil || !strings.Contains(err.Error(), "too many credentials") {
		t.Fatalf("the 11th credential with a bound of 10: %v", err)
	}
	now = now.Add(2*CredentialWindow + 2*time.Second)
	verifyOnce(t, signer, verifier)
}
