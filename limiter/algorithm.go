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
	// NumAlgorithms is the number of algorithms, for arrays indexed by one.
	NumAlgorithms = algorithms.NumKinds
)
