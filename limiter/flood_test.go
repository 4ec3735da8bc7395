package limiter

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
)

// TestKeyFloodKeepsDebts is issue 24's key flood, in process: 200 users
// spend their limit, then 1.1 million distinct keys arrive at the
// default MaxKeys. On main before issue 24 the flood evicted the spent
// users' counters, least recently used first, and every one of them was
// admitted again; then the store refused the keys it had no room for
// (issue 33's lock-out). Now it keeps the debts of the counters it
// evicts (counted), admits every flood key, and no spent user is
// admitted.
func TestKeyFloodKeepsDebts(t *testing.T) {
	const spent, flood = 200, 1_100_000
	s := New(Config{})
	perHour := algorithms.Limit{Count: 5, Period: time.Hour}
	user := func(i int, hits int64, at time.Duration) Request {
		return Request{Name: "api", Key: fmt.Sprint("user:", i), Hits: hits, Now: t0.Add(at), Limit: perHour}
	}
	for i := range spent {
		r := user(i, perHour.Count, 0)
		if d := s.Decide(&r); !d.Allowed {
			t.Fatalf("user %d spending its limit: %+v", i, d)
		}
	}
	var refused int
	key := make([]byte, 0, 32)
	for i := range flood {
		key = strconv.AppendInt(append(key[:0], "flood:"...), int64(i), 10)
		r := Request{Name: "api", Key: string(key), Hits: 1, Now: t0.Add(time.Second + time.Duration(i)), Limit: perHour}
		if d, err := s.Try(&r); err != nil || !d.Allowed {
			refused++
		}
	}
	admitted := 0
	for i := range spent {
		r := user(i, 1, 2*time.Second)
		if d := s.Decide(&r); d.Allowed {
			admitted++
		}
	}
	if admitted > 0 {
		t.Errorf("%d of %d spent users admitted again after a flood of %d keys", admitted, spent, flood)
	}
	if refused > 0 {
		t.Errorf("%d of %d flood keys refused: new keys locked out", refused, flood)
	}
	most, _, _ := s.Bounds()
	if s.Len() > most {
		t.Errorf("%d counters held, more than the bound %d", s.Len(), most)
	}
	if got := testutil.ToFloat64(s.metrics.evictedOwing); got < flood+spent-DefaultMaxKeys {
		t.Errorf("%v counters evicted owing, want at least %d", got, flood+spent-DefaultMaxKeys)
	}
}

// TestKeyFloodAdmitsNewUsers is issue 33's key flood: at MaxKeys 20,000,
// 100 users spend their limit (1 an hour, checked once), then 100,000
// distinct flood keys do the same, then 100 new users arrive. On main the
// spent users stayed refused but every new user was refused too ("no room
// for a new counter ... retry when they refill", for up to an hour). Now
// at least 99 of each are answered right, and memory stays bounded: the
// counters by MaxKeys, the debts by MaxDebts slots of DebtBytes.
func TestKeyFloodAdmitsNewUsers(t *testing.T) {
	const maxKeys, users, flood = 20_000, 100, 100_000
	s := New(Config{MaxKeys: maxKeys})
	perHour := algorithms.Limit{Count: 1, Period: time.Hour}
	check := func(key string, at time.Duration) bool {
		r := Request{Name: "api", Key: key, Hits: 1, Now: t0.Add(at), Limit: perHour}
		d, err := s.Try(&r)
		return err == nil && d.Allowed
	}
	for i := range users {
		if !check(fmt.Sprint("spent:", i), 0) {
			t.Fatalf("spent:%d, its first check, refused", i)
		}
	}
	for i := range flood {
		check(fmt.Sprint("flood:", i), time.Second+time.Duration(i)*time.Microsecond)
	}
	late := 2 * time.Second
	spentAdmitted, newAdmitted := 0, 0
	for i := range users {
		if check(fmt.Sprint("spent:", i), late) {
			spentAdmitted++
		}
		if check(fmt.Sprint("new:", i), late) {
			newAdmitted++
		}
	}
	if spentAdmitted > 1 {
		t.Errorf("%d of %d spent users admitted again after %d flood keys; want at most 1", spentAdmitted, users, flood)
	}
	if newAdmitted < users-1 {
		t.Errorf("%d of %d new users admitted after %d flood keys; want at least %d", newAdmitted, users, flood, users-1)
	}
	most, _, _ := s.Bounds()
	slots := 0
	for i := range s.shards {
		slots += len(s.shards[i].debts.slots)
	}
	if s.Len() > most || slots > DefaultDebtsPerKey*maxKeys+len(s.shards)*debtWays {
		t.Errorf("%d counters and %d debt slots held; want at most %d and %d", s.Len(), slots, most, DefaultDebtsPerKey*maxKeys)
	}
	t.Logf("%d counters, %d debts in %d slots (%d KiB), %v forgiven", s.Len(), s.debtsHeld.Load(), slots, slots*DebtBytes>>10,
		testutil.ToFloat64(s.metrics.debtsForgiven))
}

// TestMaxBytes: with MaxBytes the store holds counters within their
// accounted bytes, evicting beyond them as beyond MaxKeys, and its count
// of bytes follows every counter that leaves (hand-off, idle drop), back
// to zero when none is left.
func TestMaxBytes(t *testing.T) {
	perHour := algorithms.Limit{Count: 5, Period: time.Hour}
	key := func(i int) string { return fmt.Sprintf("%01000d", i) } // 1 KB keys
	probe := New(Config{})
	cost := probe.shards[0].tables[TokenBucket].cost(len(appendID(nil, RoleLimit, "api", key(0))))
	s := New(Config{MaxKeys: 1000, MaxBytes: 100 * cost}) // one shard
	refused := 0
	for i := range 300 {
		r := Request{Name: "api", Key: key(i), Hits: 1, Now: t0, Limit: perHour}
		if _, err := s.Try(&r); err != nil {
			refused++
		}
	}
	owing := testutil.ToFloat64(s.metrics.evictedOwing)
	if s.Len() != 100 || refused != 0 || owing != 200 || s.bytes.Load() != 100*cost {
		t.Errorf("%d counters held, %d refused, %v evicted owing, %d bytes accounted; want 100, 0, 200 and %d", s.Len(), refused, owing, s.bytes.Load(), 100*cost)
	}
	extracted := 0
	for range s.Extract(func(string) bool { extracted++; return extracted <= 50 }) {
	}
	if s.Len() != 50 || s.bytes.Load() != 50*cost {
		t.Errorf("after extracting half: %d counters, %d bytes; want 50 and %d", s.Len(), s.bytes.Load(), 50*cost)
	}
	// Two hours on the rest are full again, and a new key's insert drops
	// them as idle, two at a time.
	for i := range 30 {
		r := Request{Name: "api", Key: "late", Hits: 0, Now: t0.Add(2*time.Hour + time.Duration(i)), Limit: perHour}
		s.Decide(&r)
		for range s.Extract(func(key string) bool { return key == "late" }) {
		}
	}
	if s.Len() != 0 || s.bytes.Load() != 0 {
		t.Errorf("every counter gone: %d counters, %d bytes accounted; want none", s.Len(), s.bytes.Load())
	}
}
