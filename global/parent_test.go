package global

import (
	"testing"
	"time"
)

// TestParentGrantRenewedEveryRound: a parent's entry gives back the grant
// it did not use at every round's end, busy or not, and asks for a new
// one if it was busy; another GLOBAL entry keeps a grant while it is
// busy.
func TestParentGrantRenewedEveryRound(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		parent, active              bool
		release, want, send, forget bool
	}{
		{"a busy parent: renewed", true, true, true, true, true, false},
		{"an idle parent: given back", true, false, true, false, true, false},
		{"a busy GLOBAL counter: kept", false, true, false, false, true, false},
		{"an idle GLOBAL counter: given back", false, false, true, false, true, false},
	} {
		// 10 granted, 4 admitted, 2 of them not yet reported.
		e := &entry{known: true, granted: 10, admitted: 4, sent: 4, epoch: 7, parent: tc.parent, active: tc.active}
		if tc.active {
			e.admitted, e.granted = 6, 12
		}
		send, forget := e.endRound(time.Unix(0, 0))
		if e.release != tc.release || e.want != tc.want || send != tc.send || forget != tc.forget {
			t.Errorf("%s: release %v, want %v, send %v, forget %v; want %v, %v, %v, %v",
				tc.name, e.release, e.want, send, forget, tc.release, tc.want, tc.send, tc.forget)
		}
		if tc.release && (e.granted != e.admitted || e.known || e.epoch != 8) {
			t.Errorf("%s: after giving back: granted %d of %d admitted, known %v, epoch %d; want none left, a new epoch", tc.name, e.granted, e.admitted, e.known, e.epoch)
		}
	}
}

// TestForcedHitsAreKept: forced hits not yet acknowledged are reported,
// keep their entry from being forgotten or evicted, and go to a new owner
// with the new account.
func TestForcedHitsAreKept(t *testing.T) {
	e := &entry{forced: 5, forcedSent: 2, parent: true}
	if send, forget := e.endRound(time.Unix(0, 0)); !send || forget {
		t.Errorf("unacknowledged forced hits: send %v, forget %v; want sent, kept", send, forget)
	}
	if rep := e.report(); rep.GetForced() != 5 || rep.GetForcedAcked() != 2 {
		t.Errorf("report: forced %d, acked %d; want 5, 2", rep.GetForced(), rep.GetForcedAcked())
	}
	sh := &shard{entries: map[key]*entry{{"api", "all"}: e, {"api", "idle"}: {}}}
	sh.evictOne()
	if sh.entries[key{"api", "all"}] == nil {
		t.Error("evicted the entry with forced hits to report while another had nothing")
	}
	e.reown("node-b", 99)
	if e.forced != 3 || e.forcedSent != 0 || !e.parent || e.owner != "node-b" {
		t.Errorf("after a new owner: forced %d, acked %d, parent %v; want the 3 unacknowledged as the new account's, still a parent", e.forced, e.forcedSent, e.parent)
	}
}
