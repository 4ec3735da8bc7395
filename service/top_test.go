package service

import (
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/top"
)

// TestTopCountsDecisions: every check the service decides is counted by
// name and key, refused ones as refusals, items in error included.
func TestTopCountsDecisions(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tr := top.New(top.Config{}, now)
	s := New(Config{Top: tr, Now: func() time.Time { return now }})
	for range 5 {
		if _, err := s.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{
			{Name: "api", Key: "user:1", Limit: 3, DurationMs: 60_000},
			{Name: "login", Key: "ip:9", Limit: 100, DurationMs: 60_000},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(time.Second)
	r := s.Top(5)
	if r.Checks != 10 || r.Refusals != 2 || len(r.Limits) != 2 {
		t.Fatalf("report %+v, want 10 checks, 2 refused, in 2 limits", r)
	}
	for _, l := range r.Limits {
		want := map[string]top.Key{
			"api":   {Key: "user:1", Checks: 5, Refusals: 2, ChecksPerSecond: 5, RefusalsPerSecond: 2},
			"login": {Key: "ip:9", Checks: 5, ChecksPerSecond: 5},
		}[l.Name]
		if len(l.Hot) != 1 || l.Hot[0] != want {
			t.Errorf("%s: hot %+v, want [%+v]", l.Name, l.Hot, want)
		}
	}
}

// BenchmarkCheckTracked is BenchmarkCheck with the counts of package top:
// the difference is what counting who is being limited costs a check.
func BenchmarkCheckTracked(b *testing.B) {
	benchCheck(b, func() Config { return Config{Top: top.New(top.Config{}, time.Now())} })
}
