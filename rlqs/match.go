package rlqs

import (
	"github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/rls"
)

// Match finds how a bucket of domain is served: entries (a bucket_id's,
// sorted by key) are matched as an RLS descriptor's with the same entries
// in that order (policy.Set.Match). A leased bucket's counter is keyed as
// the RLS keys a descriptor's (rls.CounterKey) under the name
// "rlqs/<unit>": apart from the RLS's, which counts refused requests too.
func Match(set *policy.Set, domain string, entries []policy.Entry) (kind, *ringlimitv1.CheckItem) {
	m := set.Match(domain, entries)
	l := m.Limit
	switch {
	case l == nil || l.Unlimited || l.ShadowMode:
		return allowAll, nil
	case l.MinInterval > 0 || l.Ceiling > 0:
		return unsupported, nil
	case l.Enforced() == 0:
		return denyAll, nil
	}
	return leased, &ringlimitv1.CheckItem{
		Name:       "rlqs/" + l.WindowName(),
		Key:        rls.CounterKey(domain, entries, m.Shared),
		Limit:      l.Enforced(),
		DurationMs: l.Window().Milliseconds(),
		Algorithm:  ringlimitv1.Algorithm(l.Algorithm),
	}
}
