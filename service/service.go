// Package service answers checks: it validates them, decides the ones this
// node owns with the counter store, and (in a cluster) routes the others.
// The gRPC and HTTP faces in package api only translate to and from it.
package service

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/limiter"
)

// DefaultMaxClockSkew bounds how far created_at_ms may be from the
// server clock.
const DefaultMaxClockSkew = 10 * time.Minute

// Config configures a Service. The zero value is a single node with a
// default store, the real clock and no metrics.
type Config struct {
	// Store holds this node's counters; nil means a store with defaults.
	Store *limiter.Store
	// MaxClockSkew bounds created_at_ms; zero means DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// Now is the server clock; nil means time.Now.
	Now func() time.Time
	// Registerer receives the service's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Service decides checks. It is safe for concurrent use.
type Service struct {
	store   *limiter.Store
	skew    time.Duration
	now     func() time.Time
	metrics metrics
}

// New returns a Service. It starts nothing.
func New(conf Config) *Service {
	s := &Service{store: conf.Store, skew: conf.MaxClockSkew, now: conf.Now}
	if s.store == nil {
		s.store = limiter.New(limiter.Config{})
	}
	if s.skew <= 0 {
		s.skew = DefaultMaxClockSkew
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.metrics = newMetrics(conf.Registerer)
	return s
}

// Check decides every item of req. It returns an error wrapping ErrInvalid
// only for a request that is invalid as a whole (too many items); an
// invalid item gets its own error in its result and the others are
// answered.
func (s *Service) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	items := req.GetRequests()
	if len(items) > MaxItems {
		return nil, ErrTooManyItems
	}
	results := make([]pb.CheckResult, len(items))
	resp := &pb.CheckResponse{Responses: make([]*pb.CheckResult, len(items))}
	for i := range results {
		resp.Responses[i] = &results[i]
	}
	now := s.now()
	reqs := make([]limiter.Request, 0, len(items))
	pos := make([]int, 0, len(items))
	for i, item := range items {
		r, err := toRequest(item, now, s.skew)
		if err != nil {
			setError(&results[i], err)
			s.metrics.invalid(err)
			continue
		}
		reqs = append(reqs, r)
		pos = append(pos, i)
	}
	decisions := make([]algorithms.Decision, len(reqs))
	s.decideLocal(reqs, req.GetAll(), decisions)
	for j, d := range decisions {
		i := pos[j]
		setDecision(&results[i], &reqs[j], d)
		s.metrics.checked(reqs[j].Algorithm, items[i].Behavior, d.Allowed)
	}
	return resp, nil
}

// decideLocal decides reqs against this node's store. With all, requests
// with the same key are decided together.
func (s *Service) decideLocal(reqs []limiter.Request, all bool, out []algorithms.Decision) {
	if !all {
		for i := range reqs {
			out[i] = s.store.Decide(&reqs[i])
		}
		return
	}
	for _, group := range groupByKey(reqs) {
		if len(group) == 1 {
			out[group[0]] = s.store.Decide(&reqs[group[0]])
			continue
		}
		rs := make([]limiter.Request, len(group))
		ds := make([]algorithms.Decision, len(group))
		for j, i := range group {
			rs[j] = reqs[i]
		}
		s.store.DecideAll(rs, ds)
		for j, i := range group {
			out[i] = ds[j]
		}
	}
}

// groupByKey returns the indexes of reqs grouped by key, groups in order of
// first appearance.
func groupByKey(reqs []limiter.Request) [][]int {
	byKey := make(map[string]int, len(reqs))
	var groups [][]int
	for i := range reqs {
		g, ok := byKey[reqs[i].Key]
		if !ok {
			g = len(groups)
			byKey[reqs[i].Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}
