package limiter

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// ceilingPair returns the requests of a check's own limit (10 a minute)
// and of its ceiling (30 a minute) for key, of hits each: one name, key
// and algorithm, two roles.
func ceilingPair(a Algorithm, key string, hits int64) [2]Request {
	own := Request{Name: "api", Key: key, Algorithm: a, Limit: algorithms.Limit{Count: 10, Period: time.Minute}, Hits: hits, Now: t0}
	ceiling := own
	ceiling.Role, ceiling.Limit.Count = RoleCeiling, 30
	return [2]Request{own, ceiling}
}

// TestRolesSeparateCounters: the counters of two roles of one name, key
// and algorithm are two counters, charged apart; in an all-or-nothing
// group they are two members, each checked with its own hits only.
func TestRolesSeparateCounters(t *testing.T) {
	for a := range NumAlgorithms {
		if a == Spacing {
			continue
		}
		s := New(Config{})
		pair := ceilingPair(a, "k", 10)
		var ds [2]algorithms.Decision
		s.DecideAll(pair[:], ds[:])
		if !ds[0].Allowed || !ds[1].Allowed || ds[0].Remaining != 0 || ds[1].Remaining != 20 {
			t.Errorf("%v: the pair of 10 hits: %+v; want both admitted, 0 and 20 remaining", a, ds)
		}
		if d := s.Decide(&pair[1]); !d.Allowed || d.Remaining != 10 {
			t.Errorf("%v: 10 more on the ceiling alone: %+v; want admitted, 10 remaining", a, d)
		}
		if s.Len() != 2 {
			t.Errorf("%v: %d counters, want 2", a, s.Len())
		}
	}
}

// TestCeilingCounterMoves: a ceiling counter leaves a store in version
// 2's record, and another store takes it back as a ceiling: the check's
// own counter beside it is untouched. Holds and TakeOut of the check's
// own request see its ceiling counter too, for failover.
func TestCeilingCounterMoves(t *testing.T) {
	from := New(Config{})
	pair := ceilingPair(TokenBucket, "k", 10)
	from.Decide(&pair[1]) // the ceiling alone: 20 left of 30
	to := New(Config{})
	for c := range from.Extract(func(string) bool { return true }) {
		b, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != 2 || c.Role != RoleCeiling {
			t.Errorf("a ceiling counter in a record of version %d, role %s; want version 2, ceiling", b[0], c.Role)
		}
		var back Counter
		if err := back.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if err := to.Merge(back, t0, skew); err != nil {
			t.Fatal(err)
		}
	}
	if !to.Holds(&pair[0]) {
		t.Error("Holds of the check's own request: false with its ceiling counter here")
	}
	own := pair[0]
	if d := to.Check(&own); !d.Allowed || d.Remaining != 0 {
		t.Errorf("the own counter after the move: %+v; want full, untouched", d)
	}
	if d := to.Check(&pair[1]); d.Remaining != 10 {
		t.Errorf("the moved ceiling counter: %+v; want 10 remaining after 10 more", d)
	}
	to.Decide(&own)
	if out := to.TakeOut(&own); len(out) != 2 || to.Len() != 0 {
		t.Errorf("TakeOut: %d counters, %d left; want the own and the ceiling counter, none left", len(out), to.Len())
	}
}

func TestIDs(t *testing.T) {
	for _, tc := range []struct {
		role      Role
		name, key string
	}{
		{RoleLimit, "api", "k"},
		{RoleCeiling, "api", "k"},
		{RoleLimit, "a", "\x00\x01b"},
		{RoleCeiling, "a", "\x00"},
	} {
		id := string(appendID(nil, tc.role, tc.name, tc.key))
		if role, name, key := splitID(id); role != tc.role || name != tc.name || key != tc.key {
			t.Errorf("splitID(appendID(%v, %q, %q)) = %v, %q, %q", tc.role, tc.name, tc.key, role, name, key)
		}
	}
}
