package policy

import (
	"log/slog"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// UnknownDomains records the domains that Envoy asks for and no policy file has
// (a typo in a filter's domain switches its limits off silently, as in
// envoyproxy/ratelimit): it logs each domain once, counts every request in
// ringlimit_unknown_domain_total{domain}, and lists them for /status.
// Anyone who reaches the gRPC port names the domain, so it keeps at most
// MaxUnknownDomains, each cut to MaxUnknownDomainLen bytes; the requests of
// any further domain are counted under the domain "_other". It is safe
// for concurrent use; the zero value is not: use NewUnknownDomains.
type UnknownDomains struct {
	log   *slog.Logger
	count *prometheus.CounterVec
	mu    sync.Mutex
	seen  map[string]bool
	other bool
}

// The bounds of UnknownDomains.
const (
	MaxUnknownDomains   = 64
	MaxUnknownDomainLen = 128
	otherDomains        = "_other"
)

// NewUnknownDomains returns an UnknownDomains that logs to log (nil discards) and
// registers its counter on reg (nil: none).
func NewUnknownDomains(log *slog.Logger, reg prometheus.Registerer) *UnknownDomains {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	u := &UnknownDomains{log: log, seen: map[string]bool{},
		count: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringlimit_unknown_domain_total",
			Help: "Requests of Envoy's rate limit and quota services for a domain no policy file has (answered as envoyproxy/ratelimit answers them: no limit), by domain; at most 64 domains, the rest as _other."},
			[]string{"domain"}),
	}
	if reg != nil {
		reg.MustRegister(u.count)
	}
	return u
}

// Saw counts one request for domain, which no policy file has.
func (u *UnknownDomains) Saw(domain string) {
	if len(domain) > MaxUnknownDomainLen {
		domain = domain[:MaxUnknownDomainLen]
	}
	u.mu.Lock()
	known := u.seen[domain]
	switch {
	case known:
	case len(u.seen) < MaxUnknownDomains:
		u.seen[domain] = true
		u.log.Warn("a request for a domain no policy file has: it is not limited (as envoyproxy/ratelimit does); check the filter's domain", "domain", domain)
	default:
		domain = otherDomains
		if !u.other {
			u.other = true
			u.log.Warn("more domains no policy file has than are listed; their requests are counted as _other", "listed", MaxUnknownDomains)
		}
	}
	u.mu.Unlock()
	u.count.WithLabelValues(domain).Inc()
}

// Domains returns the domains seen, sorted.
func (u *UnknownDomains) Domains() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.seen))
	for d := range u.seen {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}
