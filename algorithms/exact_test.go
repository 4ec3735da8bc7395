package algorithms

import (
	"math"
	"testing"
)

func TestU128(t *testing.T) {
	max := mul(math.MaxUint64, math.MaxUint64) // 2^128 - 2^65 + 1
	if got := (u128{0, 1}).sub(u128{0, 2}); !got.isZero() {
		t.Errorf("1-2 = %v, want 0 (spans are never negative)", got)
	}
	if q, r := max.div(math.MaxUint64); q != math.MaxUint64 || r != 0 {
		t.Errorf("(2^64-1)^2 / (2^64-1) = %d r %d, want saturated", q, r)
	}
	if q, r := max.div(2); q != math.MaxUint64 || r != 0 {
		t.Errorf("huge/2 = %d r %d, want saturated", q, r)
	}
	if q, r := mul(1e9, 31536000000000000).add(u128{0, 7}).div(1e9); q != 31536000000000000 || r != 7 {
		t.Errorf("(1e9·1y + 7)/1e9 = %d r %d", q, r)
	}
	if !(u128{1, 0}).less(u128{1, 1}) || (u128{2, 0}).less(u128{1, math.MaxUint64}) {
		t.Error("less is wrong across the word boundary")
	}
	if got := (u128{0, math.MaxUint64}).add(u128{0, 1}); got != (u128{1, 0}) {
		t.Errorf("carry: got %v", got)
	}
}

func TestRational(t *testing.T) {
	r := Limit{Count: 3, Period: 1e9}.ticks() // 333333333⅓ ns per hit
	if got := r.floor(r.hits(1)); got != 333333333 {
		t.Errorf("floor(1s/3) = %d", got)
	}
	if got := r.ceil(r.hits(1)); got != 333333334 {
		t.Errorf("ceil(1s/3) = %d", got)
	}
	// Capacity 3 with 2/3 s used: 1 cell left, full again in 666666667 ns.
	if ns, frac, d, ok := r.admit(10, r.hits(2)); !ok || ns != 10+666666666 || frac != 2 ||
		d != (Decision{Allowed: true, Remaining: 1, ResetAfter: 666666667}) {
		t.Errorf("admit(10, 2/3 s) = %d %d %+v %v", ns, frac, d, ok)
	}
	if got := r.lead(20, 2, 10); got != mul(10, 3).add(u128{0, 2}) {
		t.Errorf("lead = %v", got)
	}
	if got := r.lead(20, 99, 10); got != mul(10, 3).add(u128{0, 2}) {
		t.Errorf("lead with an out-of-range frac = %v, want it clamped", got)
	}
	if got := r.lead(5, 2, 10); !got.isZero() {
		t.Errorf("lead of the past = %v, want 0", got)
	}
	if _, _, _, ok := r.admit(math.MaxInt64-1, r.hits(1)); ok {
		t.Error("admit past 2262 reported ok")
	}
	if got := r.ceil(u128{math.MaxUint64, 0}); got != math.MaxInt64 {
		t.Errorf("ceil of a huge span = %d, want saturated", got)
	}
	for _, tc := range []struct{ t, period, want int64 }{{125, 60, 120}, {-5, 60, -60}, {0, 60, 0}, {60, 60, 60}} {
		if got := windowStart(tc.t, tc.period); got != tc.want {
			t.Errorf("windowStart(%d, %d) = %d, want %d", tc.t, tc.period, got, tc.want)
		}
	}
}
