package limiter

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// TestExtractMergeKeepsState moves every counter of every algorithm from
// one store to another and checks the new store goes on where the old one
// stopped.
func TestExtractMergeKeepsState(t *testing.T) {
	from, to := New(Config{}), New(Config{})
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for a := range NumAlgorithms {
		for i := range 20 {
			r := Request{Name: "api", Key: fmt.Sprint("k", i), Algorithm: a, Hits: 4, Now: t0, Limit: l}
			from.Decide(&r)
		}
	}
	moved := 0
	for {
		batch := from.Extract(func(key string) bool { return strings.HasPrefix(key, "k1") }, 7)
		if len(batch) == 0 {
			break
		}
		for _, c := range batch {
			if err := to.Merge(c); err != nil {
				t.Fatal(err)
			}
		}
		moved += len(batch)
	}
	if want := 11 * int(NumAlgorithms); moved != want { // k1, k10..k19
		t.Fatalf("moved %d counters, want %d", moved, want)
	}
	if from.Len() != 20*int(NumAlgorithms)-moved || to.Len() != moved {
		t.Errorf("Len: from %d, to %d", from.Len(), to.Len())
	}
	for a := range NumAlgorithms {
		r := Request{Name: "api", Key: "k12", Algorithm: a, Hits: 0, Now: t0.Add(time.Millisecond), Limit: l}
		if d := to.Decide(&r); d.Remaining != 6 {
			t.Errorf("%s: moved counter has %d remaining, want 6", a, d.Remaining)
		}
	}
}

// TestMergeNeverRefills merges a fresher (less charged) state into a more
// charged one: the charged one wins.
func TestMergeNeverRefills(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	for a := range NumAlgorithms {
		charged, fresh := New(Config{}), New(Config{})
		r := Request{Name: "api", Key: "k", Algorithm: a, Hits: 8, Now: t0, Limit: l}
		charged.Decide(&r)
		r.Hits = 1
		fresh.Decide(&r)
		for _, c := range fresh.Extract(func(string) bool { return true }, 10) {
			if err := charged.Merge(c); err != nil {
				t.Fatal(err)
			}
		}
		r.Hits = 0
		if d := charged.Decide(&r); d.Remaining != 2 {
			t.Errorf("%s: after merging a fresher state, %d remaining, want 2", a, d.Remaining)
		}
	}
}

func TestMergeRefusesBadState(t *testing.T) {
	s := New(Config{})
	for _, c := range []Counter{
		{Name: "a", Key: "k", Algorithm: TokenBucket, Words: []int64{1, 2, 3}},
		{Name: "a", Key: "k", Algorithm: SlidingLog, Log: []int64{1}},
		{Name: "a", Key: "k", Algorithm: 42},
	} {
		if err := s.Merge(c); err == nil {
			t.Errorf("Merge(%+v) = nil, want an error", c)
		}
	}
}
