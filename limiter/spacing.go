package limiter

import (
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// A minimum spacing between requests (a check's min_interval_ms) is a
// counter of its own, of kind Spacing (algorithms.Spacing: one timestamp),
// under the name and key of the request that asks for it. The store, not
// its caller, joins the two: a Request with a MinInterval is decided
// together with its spacing counter, under the one shard lock both share
// (they share a key), as DecideAll decides a group. So every caller that
// decides a request (a check here, a forward at the key's owner, a relay,
// a pull, a failover, a fallback with this node's share) gets the
// all-or-nothing decision without knowing of it, one request stays one
// decision, and the spacing counter is a counter like any other: it is
// evicted, dropped when idle (once its Next has passed), handed off,
// replicated and merged (the later Next wins) with no code of its own.
// Expanding the request into two in the service instead would have made
// every path there (grouping by owner, forwarding, results by position)
// handle two decisions for one item.

// SpacingLimit is the Limit of a spacing counter of interval d: one
// request per d. algorithms.Spacing reads only its Period; Count 1 and
// Burst 0 make it the one limit a spacing counter of interval d can have,
// which is what a node checks of a spacing counter another node sends.
func SpacingLimit(d time.Duration) algorithms.Limit {
	return algorithms.Limit{Count: 1, Period: d}
}

// spaced reports whether r is decided together with a spacing counter.
func (r *Request) spaced() bool {
	return r.MinInterval > 0 && r.Algorithm != Spacing
}

// spacing returns the request of r's spacing counter: r's name, key,
// hits, reset and time, under SpacingLimit(r.MinInterval).
func (r *Request) spacing() Request {
	return Request{Name: r.Name, Key: r.Key, Algorithm: Spacing, Limit: SpacingLimit(r.MinInterval),
		Hits: r.Hits, Reset: r.Reset, Now: r.Now}
}

// decideSpaced decides r, which is spaced, and its spacing together on sh,
// whose lock is held: both are charged (if charge) when both admit, and
// neither otherwise, or ErrFull when the store has no room for either's
// counter. It allocates nothing.
func (s *Store) decideSpaced(sh *shard, r *Request, charge bool) (algorithms.Decision, error) {
	rs := [2]Request{*r, r.spacing()}
	rs[0].MinInterval = 0
	var ds [2]algorithms.Decision
	err := s.decideAll(sh, rs[:], ds[:], charge)
	return withSpacing(ds[0], ds[1]), err
}

// withSpacing is the decision of a spaced request from the decisions of
// its own counter and of its spacing, decided together (so both admit, or
// neither does): the own counter's Remaining and Delay, refused with the
// longer RetryAfter of the two if either refused, and back to full
// (ResetAfter) only when both are, so that a client that waits for the
// reset is not then refused by the spacing.
func withSpacing(own, spacing algorithms.Decision) algorithms.Decision {
	own.ResetAfter = max(own.ResetAfter, spacing.ResetAfter)
	if !spacing.Allowed {
		own.Allowed = false
		own.RetryAfter = algorithms.LongerWait(own.RetryAfter, spacing.RetryAfter)
	}
	return own
}

// spaceAll returns, if any request of rs is spaced, rs without their
// MinInterval followed by their spacing requests, and for each request of
// rs the index of its spacing in that slice, or -1; otherwise nil. The
// requests share a key, so two that share a name share one spacing
// counter, which is then one member of the group (the first request's
// interval applies), as is a request of kind Spacing of that name: the
// group never checks one counter twice and then charges it twice.
func spaceAll(rs []Request) (all []Request, spacing []int) {
	n := 0
	for i := range rs {
		if rs[i].spaced() {
			n++
		}
	}
	if n == 0 {
		return nil, nil
	}
	all = make([]Request, len(rs), len(rs)+n)
	copy(all, rs)
	byName := make(map[string]int, n)
	for i := range rs {
		if rs[i].Algorithm == Spacing {
			byName[rs[i].Name] = i
		}
	}
	spacing = make([]int, len(rs))
	for i := range rs {
		spacing[i] = -1
		if !rs[i].spaced() {
			continue
		}
		all[i].MinInterval = 0
		j, ok := byName[rs[i].Name]
		if !ok {
			j = len(all)
			all = append(all, rs[i].spacing())
			byName[rs[i].Name] = j
		}
		spacing[i] = j
	}
	return all, spacing
}
