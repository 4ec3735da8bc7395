package rlqs

import (
	"math/rand/v2"
	"testing"
	"time"

	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// envoyBucket is Envoy's filter's side of one bucket, on a virtual clock:
// the behaviours bucket.go relies on (docs/envoy.md).
type envoyBucket struct {
	strategy *typepb.RateLimitStrategy
	expires  time.Time
	tokens   float64
	rate     float64
	at       time.Time
	admitted int64 // in all
	allowed  int64 // since the last report
	denied   int64
}

func (e *envoyBucket) apply(s *typepb.RateLimitStrategy, ttl time.Duration, now time.Time) {
	if e.strategy != nil && !now.Before(e.expires) {
		e.strategy = nil
	}
	if tb := s.GetTokenBucket(); tb != nil {
		old := e.strategy.GetTokenBucket()
		if old == nil || old.GetMaxTokens() != tb.GetMaxTokens() || old.GetTokensPerFill().GetValue() != tb.GetTokensPerFill().GetValue() ||
			old.GetFillInterval().GetNanos() != tb.GetFillInterval().GetNanos() {
			e.tokens, e.at = float64(tb.GetMaxTokens()), now
			e.rate = float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
		}
	}
	e.strategy, e.expires = s, now.Add(ttl.Truncate(time.Second))
}

func (e *envoyBucket) request(now time.Time) {
	ok := false
	if e.strategy != nil && now.Before(e.expires) {
		if tb := e.strategy.GetTokenBucket(); tb != nil {
			e.tokens = min(float64(tb.GetMaxTokens()), e.tokens+e.rate*now.Sub(e.at).Seconds())
			e.at = now
			if e.tokens >= 1 {
				e.tokens--
				ok = true
			}
		} else {
			ok = e.strategy.GetBlanketRule() == typepb.RateLimitStrategy_ALLOW_ALL
		}
	}
	if ok {
		e.admitted++
		e.allowed++
	} else {
		e.denied++
	}
}

// TestAssignWithinGrant: whatever the owner lends, however the reports
// and assignments cross on the way (each takes up to deliveryMargin),
// an Envoy that does what the filter does never admits more than the
// owner's grant to the stream, and while the owner lends, it admits.
func TestAssignWithinGrant(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		ttl := time.Second
		t0 := time.Unix(1e9, 0)
		now := t0
		b := &bucket{kind: leased, epoch: 1}
		env := &envoyBucket{}
		var granted int64
		type msg struct {
			at      time.Time
			s       *typepb.RateLimitStrategy
			allowed int64
			denied  int64
		}
		// A stream delivers in order, each message within deliveryMargin.
		var toEnvoy, toServer []msg
		deliver := func(q []msg, m msg) []msg {
			m.at = now.Add(time.Duration(rng.Int64N(int64(deliveryMargin))))
			if n := len(q); n > 0 && m.at.Before(q[n-1].at) {
				m.at = q[n-1].at
			}
			return append(q, m)
		}
		interval := time.Duration(200+rng.IntN(800)) * time.Millisecond
		nextReport, nextRenew := now, now.Add(ttl/2)
		demand := 1 + rng.IntN(40) // requests a 10ms step
		round := func() {
			// The owner: lends more now and then, never takes back.
			if rng.IntN(3) > 0 {
				granted = max(granted, b.admitted) + int64(rng.IntN(200))
			}
			s := b.assign(granted, b.admitted, now, ttl)
			toEnvoy = deliver(toEnvoy, msg{s: s})
		}
		for now.Before(t0.Add(20 * time.Second)) {
			now = now.Add(10 * time.Millisecond)
			for range rng.IntN(demand + 1) {
				env.request(now)
			}
			if env.admitted > granted {
				t.Fatalf("seed %d at %v: the Envoy admitted %d, the owner lent %d", seed, now.Sub(t0), env.admitted, granted)
			}
			if !now.Before(nextReport) {
				toServer = deliver(toServer, msg{allowed: env.allowed, denied: env.denied})
				env.allowed, env.denied = 0, 0
				nextReport = now.Add(interval)
			}
			for len(toServer) > 0 && !now.Before(toServer[0].at) {
				m := toServer[0]
				toServer = toServer[1:]
				b.report(usage{allowed: m.allowed, denied: m.denied}, now)
				round()
				nextRenew = now.Add(ttl / 2)
			}
			for len(toEnvoy) > 0 && !now.Before(toEnvoy[0].at) {
				env.apply(toEnvoy[0].s, ttl, now)
				toEnvoy = toEnvoy[1:]
			}
			if !now.Before(nextRenew) {
				round()
				nextRenew = now.Add(ttl / 2)
			}
		}
		if granted > 1000 && env.admitted == 0 {
			t.Fatalf("seed %d: the owner lent %d, the Envoy admitted nothing", seed, granted)
		}
	}
}
