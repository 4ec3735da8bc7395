package global

import (
	"math"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// How an owner splits a limit among the parties that hold parts of it
// (lessees, Envoy streams, and the cluster's own checks): each party i
// gets at least its floor, and what the floors leave is split in
// proportion to the parties' demand. A party whose proportional part
// would fall below its floor is held at its floor, and the rest is split
// again among the others (water-filling), so that the parts always sum to
// one and no floor is broken however large another party's demand.

// party is one party of a split: its demand (hits a second) and its floor
// (a part of the whole, at most one in all).
type party struct {
	demand, floor float64
}

// split returns each party's part of the whole, in order; they sum to 1.
// floors must sum to at most 1. Parties with no demand get their floor;
// if none has any, all get equal parts.
func split(ps []party) []float64 {
	w := make([]float64, len(ps))
	if len(ps) == 0 {
		return w
	}
	// Parties in the order they fall to their floor: by demand per floor.
	order := make([]int, len(ps))
	for i := range order {
		order[i] = i
	}
	ratio := func(i int) float64 {
		if ps[i].floor <= 0 {
			return math.Inf(1)
		}
		return ps[i].demand / ps[i].floor
	}
	slices.SortFunc(order, func(a, b int) int {
		ra, rb := ratio(a), ratio(b)
		switch {
		case ra < rb:
			return -1
		case ra > rb:
			return 1
		}
		return a - b
	})
	var demand float64
	for _, p := range ps {
		demand += p.demand
	}
	if demand <= 0 {
		for i := range w {
			w[i] = 1 / float64(len(w))
		}
		return w
	}
	rest := 1.0
	k := 0 // order[:k] are held at their floors
	for ; k < len(order); k++ {
		i := order[k]
		if rest*ps[i].demand/demand >= ps[i].floor {
			break // this one, and every one after it, is above its floor
		}
		w[i] = ps[i].floor
		rest -= ps[i].floor
		demand -= ps[i].demand
	}
	rest = max(0, rest)
	for _, i := range order[k:] {
		w[i] = rest * ps[i].demand / demand
	}
	return w
}

// MaxDemandFactor bounds the demand a lessee's report counts: at most
// this many times the limit's own rate (limit / duration), or the limit's
// whole capacity in one of the lessee's report intervals if that is more
// (a burst of a long window), whatever its asked total says. Demand is a
// lessee's word, and a lessee could claim any; the floors of split hold
// whatever it claims, and the cap keeps a liar's part from growing past
// what a demand many times the limit already gets. A cap at the limit's
// rate itself would make every party asking beyond the limit equal, and so
// give a party asking 70% of the demand no more than one asking 10% of it
// (docs/leases.md, "The split").
const MaxDemandFactor = 32

// demandCap is the most demand counted, in hits a second, for a limit l
// of a lessee that reports every interval.
func demandCap(l algorithms.Limit, interval time.Duration) float64 {
	return max(MaxDemandFactor*float64(l.Count)/l.Period.Seconds(), float64(l.Capacity())/max(interval, time.Millisecond).Seconds())
}
