package strict

import (
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// TestStrictTakeLeft: a node takes a member's word that it left only for
// its latest departure of that member, into the ring the word names,
// while its ring lacks the member and within the fence; a member that
// comes back and then drops out again is fenced whatever it said before.
// GLOBAL checks of its keys stay fenced.
func TestStrictTakeLeft(t *testing.T) {
	self, b := ring.Member{Name: "a"}, ring.Member{Name: "b"}
	full := ring.New(self, b, ring.Member{Name: "c"})
	without := full.Without("b")
	key := "k"
	for k := 0; ; k++ {
		if o, _ := full.Owner(key); o.Name == "b" {
			break
		}
		key = fmt.Sprint("k", k)
	}
	r := &limiter.Request{Name: "api", Key: key, Limit: algorithms.Limit{Count: 10, Period: time.Hour}, Hits: 1}
	fence := time.Second
	newMode := func() *Mode {
		m := New(1, fence)
		m.RingChanged(full, "a", t0)
		return m
	}

	off := &Mode{}
	if err := off.TakeLeft("b", without.ID(), t0); err != nil {
		t.Errorf("strict mode off: %v, want nothing to refuse", err)
	}
	m := newMode()
	if err := m.TakeLeft("b", without.ID(), t0); err == nil {
		t.Errorf("a word while the ring has the member: taken, want refused")
	}
	m.RingChanged(without, "a", t0)
	if err := m.TakeLeft("b", full.Without("c").ID(), t0); err == nil {
		t.Errorf("a word naming another ring: taken, want refused")
	}
	if err := m.TakeLeft("c", without.ID(), t0); err == nil {
		t.Errorf("a word from a member that did not drop out: taken, want refused")
	}
	if v := m.Judge(r, false, without, "a", nil, t0); v != Refuse {
		t.Errorf("before the word: verdict %d, want refused", v)
	}
	if err := m.TakeLeft("b", without.ID(), t0.Add(fence/2)); err != nil {
		t.Errorf("the word: %v, want taken", err)
	}
	if v := m.Judge(r, false, without, "a", nil, t0); v != Decide {
		t.Errorf("after the word: verdict %d, want decided at once", v)
	}
	if v := m.Judge(r, true, without, "a", nil, t0); v != Refuse {
		t.Errorf("a GLOBAL check after the word: verdict %d, want refused for the fence", v)
	}
	if v := m.Judge(r, false, without, "a", nil, t0.Add(fence)); v != Decide {
		t.Errorf("after the word, past the fence: verdict %d, want decided, not counted spent", v)
	}

	m.RingChanged(full, "a", t0.Add(2*fence)) // it came back
	if err := m.TakeLeft("b", without.ID(), t0.Add(2*fence)); err == nil {
		t.Errorf("a word while the member is back: taken, want refused")
	}
	m.RingChanged(without, "a", t0.Add(3*fence)) // and dropped out again
	if v := m.Judge(r, false, without, "a", nil, t0.Add(3*fence)); v != Refuse {
		t.Errorf("dropped out again, after an earlier word: verdict %d, want refused for the fence", v)
	}

	late := newMode()
	late.RingChanged(without, "a", t0)
	if err := late.TakeLeft("b", without.ID(), t0.Add(fence)); err == nil {
		t.Errorf("a word once the fence has passed: taken, want refused")
	}
}

// TestStrictKeepsTheLatestDepartures: strict mode remembers maxDrops
// departures, the latest, whatever the churn.
func TestStrictKeepsTheLatestDepartures(t *testing.T) {
	m := New(1, time.Second)
	self := ring.Member{Name: "self"}
	for i := range maxDrops + 5 {
		m.RingChanged(ring.New(self, ring.Member{Name: fmt.Sprint("n", i)}), "self", t0)
		m.RingChanged(ring.New(self), "self", t0)
	}
	drops := *m.drops.Load()
	if len(drops) != maxDrops || drops[0].name != "n5" || drops[maxDrops-1].name != fmt.Sprint("n", maxDrops+4) {
		t.Errorf("%d departures kept, from %s to %s; want the latest %d", len(drops), drops[0].name, drops[len(drops)-1].name, maxDrops)
	}
}
