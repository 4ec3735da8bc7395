package limiter

import "github.com/ringlimit/ringlimit/algorithms"

// Algorithm names the algorithm of a counter: it is algorithms.Kind, the
// one definition of the enum, under the name the store's requests use.
type Algorithm = algorithms.Kind

// The algorithms, as the store's callers name them.
const (
	TokenBucket   = algorithms.KindTokenBucket
	GCRA          = algorithms.KindGCRA
	LeakyBucket   = algorithms.KindLeakyBucket
	FixedWindow   = algorithms.KindFixedWindow
	SlidingWindow = algorithms.KindSlidingWindow
	SlidingLog    = algorithms.KindSlidingLog
	// Spacing is the kind of the counters that keep a request's
	// MinInterval (see Request): not an algorithm a check names.
	Spacing = algorithms.KindSpacing
	// NumAlgorithms is the number of kinds of counter, Spacing included,
	// for arrays indexed by one.
	NumAlgorithms = algorithms.NumKinds
)
