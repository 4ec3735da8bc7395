package top

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

// A report covers the interval under way and the one before; the one
// before that is forgotten. Rates are counts over the time since the
// older interval began.
func TestTrackerReportTimeline(t *testing.T) {
	tr := New(Config{Window: 10 * time.Second}, t0)
	for range 30 {
		tr.Record("api", "old", true) // forgotten after two rotations
	}
	tr.Rotate(t0.Add(10 * time.Second))
	for i := range 40 {
		tr.Record("api", "user:1", i%4 != 0) // 10 refused
	}
	tr.Rotate(t0.Add(20 * time.Second))
	for i := range 20 {
		tr.Record("api", "user:1", i%2 == 0) // 10 refused
		tr.Record("login", "ip:9", false)
	}
	r := tr.Report(t0.Add(25*time.Second), 0)
	if r.Seconds != 15 || r.Checks != 80 || r.Refusals != 40 {
		t.Fatalf("seconds %v checks %d refusals %d, want 15, 80, 40", r.Seconds, r.Checks, r.Refusals)
	}
	if len(r.Limits) != 2 || r.Limits[0].Name != "api" || r.Limits[0].Checks != 60 || r.Limits[1].Name != "login" {
		t.Fatalf("limits %+v, want api (60 checks) then login", r.Limits)
	}
	api := r.Limits[0]
	want := Key{Key: "user:1", Checks: 60, Refusals: 20, ChecksPerSecond: 4, RefusalsPerSecond: 20.0 / 15}
	if len(api.Hot) != 1 || api.Hot[0] != want {
		t.Errorf("api hot %+v, want [%+v]", api.Hot, want)
	}
	if len(api.Refused) != 1 || api.Refused[0] != want {
		t.Errorf("api refused %+v, want [%+v]", api.Refused, want)
	}
	if got := r.Limits[1].Refused; len(got) != 1 || got[0].Refusals != 20 || got[0].Checks != 20 {
		t.Errorf("login refused %+v, want ip:9 with 20 of 20 refused", got)
	}
}

// Names are kept in fixed memory too: a flood of distinct names leaves
// the busiest in place, and a name that loses its slot takes none of its
// keys to the name that takes it.
func TestTrackerNameFlood(t *testing.T) {
	tr := New(Config{Names: 2, Keys: 2}, t0)
	for i := range 1000 {
		tr.Record("busy", "k", true)
		tr.Record(fmt.Sprint("name", i), fmt.Sprint("key", i), false)
	}
	r := tr.Report(t0.Add(time.Second), 0)
	if len(r.Limits) != 2 || r.Limits[0].Name != "busy" || r.Limits[0].Checks != 1000 {
		t.Fatalf("limits %+v, want busy with 1000 checks first", r.Limits)
	}
	other := r.Limits[1]
	if len(other.Hot) != 1 || other.Hot[0].Key != "key999" {
		t.Errorf("the last name's keys %+v, want only its own key999", other.Hot)
	}
	if r.Checks != 2000 || r.Refusals != 1000 {
		t.Errorf("totals %d/%d, want 2000/1000, exact", r.Checks, r.Refusals)
	}
}

func TestNilTrackerRecordsNothing(t *testing.T) {
	var tr *Tracker
	tr.Record("a", "b", true) // must not panic
}

func TestMergeSumsNodes(t *testing.T) {
	a := Report{Seconds: 10, Checks: 10, Limits: []Limit{{Name: "api", Checks: 10, ChecksPerSecond: 1,
		Hot: []Key{{Key: "x", Checks: 8, ChecksPerSecond: 0.8}, {Key: "y", Checks: 3, ChecksPerSecond: 0.25}}}}}
	b := Report{Seconds: 12, Checks: 6, Refusals: 3, Limits: []Limit{{Name: "api", Checks: 6, ChecksPerSecond: 0.5,
		Hot:     []Key{{Key: "y", Checks: 6, ChecksPerSecond: 0.5, Error: 1}},
		Refused: []Key{{Key: "y", Refusals: 3, RefusalsPerSecond: 0.25}}}}}
	m := Merge([]Report{a, b}, 1)
	if m.Seconds != 12 || m.Checks != 16 || m.Refusals != 3 {
		t.Fatalf("merged %+v", m)
	}
	want := Key{Key: "y", Checks: 9, Refusals: 3, ChecksPerSecond: 0.75, RefusalsPerSecond: 0.25, Error: 1}
	if got := m.Limits[0].Hot; len(got) != 1 || got[0] != want {
		t.Errorf("hot %+v, want [%+v] (ties by key; cut to 1)", got, want)
	}
	if got := m.Limits[0].Refused; len(got) != 1 || got[0].Checks != 9 {
		t.Errorf("refused %+v, want y with its 9 checks", got)
	}
}

func TestHide(t *testing.T) {
	r := Report{Limits: []Limit{{Name: "api", Hot: []Key{{Key: "user:42"}}, Refused: []Key{{Key: "user:42"}}}}}
	r.Hide([]byte("secret"))
	h := r.Limits[0].Hot[0].Key
	if !strings.HasPrefix(h, "#") || len(h) != 17 || strings.Contains(h, "user") {
		t.Errorf("hidden key %q, want # and 16 hex digits", h)
	}
	if r.Limits[0].Refused[0].Key != h {
		t.Errorf("the same key hid as %q and %q", h, r.Limits[0].Refused[0].Key)
	}
	if r.Limits[0].Name != "api" {
		t.Errorf("name %q changed", r.Limits[0].Name)
	}
}

func TestValidate(t *testing.T) {
	ok := Report{Seconds: 10, Limits: []Limit{{Name: "api", Hot: []Key{{Key: "k"}}}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid report: %v", err)
	}
	long := strings.Repeat("k", MaxKeyBytes+1)
	for _, c := range []struct {
		r    Report
		want string
	}{
		{Report{Seconds: 0}, "seconds"},
		{Report{Seconds: MaxSeconds + 1}, "seconds"},
		{Report{Seconds: 1, Limits: make([]Limit, MaxNames+1)}, "limits: 65"},
		{Report{Seconds: 1, Limits: []Limit{{Name: long}}}, "limits[0].name"},
		{Report{Seconds: 1, Limits: []Limit{{Refused: make([]Key, MaxKeys+1)}}}, "limits[0].refused"},
		{Report{Seconds: 1, Limits: []Limit{{Hot: []Key{{Key: long}}}}}, "limits[0].hot[0].key"},
	} {
		if err := c.r.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate = %v, want an error naming %s", err, c.want)
		}
	}
}
