package rlqs

import (
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ringlimit/ringlimit/rlqs/envoysim"
)

// TestShareStrategy: a share as the Envoy enforces it (envoysim.Bucket,
// the filter's behaviour): from rest it admits its burst at once and its
// rate after, never more; an unchanged share is a renewal that keeps the
// tokens; a share that rounds to nothing is DENY_ALL.
func TestShareStrategy(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	for _, tc := range []struct {
		rateMilli, burst int64
		want             int // admitted in the 10 s from t0, asked 100 a millisecond-tick
	}{
		{400_000, 12, 12 + 4000},
		{97_500, 3, 3 + 975},
		{16, 1, 1 + 0}, // under a token a minute: DENY_ALL
		{1000, 0, 0},
	} {
		s := &envoysim.Settings{}
		var b envoysim.Bucket
		act := func(now time.Time) *rlqspb.RateLimitQuotaResponse_BucketAction {
			return &rlqspb.RateLimitQuotaResponse_BucketAction{BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
				QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(time.Second), RateLimitStrategy: shareStrategy(tc.rateMilli, tc.burst)}}}
		}
		b.Apply(s, act(t0), t0)
		got := 0
		for ms := range 10_000 {
			now := t0.Add(time.Duration(ms) * time.Millisecond)
			if ms%500 == 0 {
				b.Apply(s, act(now), now) // renewed every half second, unchanged
			}
			for range 100 {
				if b.Decide(s, now) {
					got++
				}
			}
		}
		if tc.want == 1 {
			tc.want = 0 // DENY_ALL admits nothing
		}
		if got < tc.want-1 || got > tc.want {
			t.Errorf("share %d milli-hits/s, burst %d: %d admitted in 10 s, want %d (burst plus rate, no more)", tc.rateMilli, tc.burst, got, tc.want)
		}
	}
}
