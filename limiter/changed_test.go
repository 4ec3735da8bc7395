package limiter

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// changedKeys walks s.Changed and returns the sorted "algorithm/key" of what it yields.
func changedKeys(s *Store) []string {
	var out []string
	for c := range s.Changed() {
		out = append(out, fmt.Sprint(c.Algorithm, "/", c.Key))
	}
	slices.Sort(out)
	return out
}

// TestChanged is a timeline of what replication reads: the counters
// charged or merged since the last walk, once each.
func TestChanged(t *testing.T) {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	s := New(Config{})
	decide := func(key string, hits int64, at time.Duration) {
		r := Request{Name: "api", Key: key, Algorithm: TokenBucket, Hits: hits, Now: t0.Add(at), Limit: l}
		s.Decide(&r)
	}
	decide("a", 1, 0)
	decide("b", 1, 0)
	if got, want := changedKeys(s), []string{"TOKEN_BUCKET/a", "TOKEN_BUCKET/b"}; !slices.Equal(got, want) {
		t.Fatalf("first walk: %v, want %v", got, want)
	}
	if got := changedKeys(s); len(got) != 0 {
		t.Fatalf("second walk with nothing charged: %v, want none", got)
	}
	decide("b", 1, time.Second)
	if got, want := changedKeys(s), []string{"TOKEN_BUCKET/b"}; !slices.Equal(got, want) {
		t.Fatalf("after charging b: %v, want %v", got, want)
	}
	// A peek charges nothing, and is no change.
	r := Request{Name: "api", Key: "a", Algorithm: TokenBucket, Now: t0.Add(time.Second), Limit: l}
	s.Check(&r)
	if got := changedKeys(s); len(got) != 0 {
		t.Fatalf("after a Check: %v, want none", got)
	}
	// A merge is a change; so is a counter given back by Restore.
	var b Counter
	for c := range s.Counters() {
		if c.Key == "b" {
			b = c
		}
	}
	b.Key = "c"
	if err := s.Merge(b, t0.Add(time.Second), skew); err != nil {
		t.Fatal(err)
	}
	if got, want := changedKeys(s), []string{"TOKEN_BUCKET/c"}; !slices.Equal(got, want) {
		t.Fatalf("after merging c: %v, want %v", got, want)
	}
	s.Restore([]Counter{b})
	if got, want := changedKeys(s), []string{"TOKEN_BUCKET/c"}; !slices.Equal(got, want) {
		t.Fatalf("after restoring c: %v, want %v", got, want)
	}
	s.MarkChanged(func(key string) bool { return key != "b" })
	if got, want := changedKeys(s), []string{"TOKEN_BUCKET/a", "TOKEN_BUCKET/c"}; !slices.Equal(got, want) {
		t.Fatalf("after MarkChanged of all but b: %v, want %v", got, want)
	}
}

// TestChangedStopEarly: counters a consumer was not yielded stay marked.
func TestChangedStopEarly(t *testing.T) {
	s := New(Config{})
	fill(s)
	n := 0
	for range s.Changed() {
		if n++; n == 3 {
			break
		}
	}
	if got, want := len(changedKeys(s)), s.Len()-3; got != want {
		t.Errorf("after taking 3, the next walk yields %d, want %d", got, want)
	}
}
