package fsm

import "testing"

func TestMinuteClock(t *testing.T) {
	if MinuteOf(0) != 0 || MinuteOf(119) != 119 || MinuteOf(120) != 0 || MinuteOf(-1) != 119 {
		t.Fatal("MinuteOf wraps wrong")
	}
	for _, now := range []int64{1000, 29_000_000, 29_000_119} {
		for age := 0; age < RingMinutes; age++ {
			if got := Age(now, MinuteOf(now-int64(age))); got != age {
				t.Fatalf("now=%d age=%d: Age = %d", now, age, got)
			}
		}
	}
}

func TestExpiredTable(t *testing.T) {
	now := int64(29_000_005)
	tbl := ExpiredTable(now, 20)
	for age := 0; age < RingMinutes; age++ {
		if got, want := tbl[MinuteOf(now-int64(age))], age >= 20; got != want {
			t.Fatalf("age %d: expired=%v want %v", age, got, want)
		}
	}
	for m := RingMinutes; m < 256; m++ {
		if !tbl[m] {
			t.Fatalf("invalid clock value %d not marked expired", m)
		}
	}
}
