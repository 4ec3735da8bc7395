package limiter

import (
	"fmt"
	"strings"
)

// Algorithm names one of the six algorithms of package algorithms. The
// values match the ringlimit.v1 Algorithm enum, so the API converts with a
// checked cast.
type Algorithm uint8

// The algorithms, in the order of the ringlimit.v1 Algorithm enum.
const (
	TokenBucket Algorithm = iota
	GCRA
	LeakyBucket
	FixedWindow
	SlidingWindow
	SlidingLog
	// NumAlgorithms is the number of algorithms, for arrays indexed by one.
	NumAlgorithms
)

var algorithmNames = [NumAlgorithms]string{
	TokenBucket:   "TOKEN_BUCKET",
	GCRA:          "GCRA",
	LeakyBucket:   "LEAKY_BUCKET",
	FixedWindow:   "FIXED_WINDOW",
	SlidingWindow: "SLIDING_WINDOW",
	SlidingLog:    "SLIDING_LOG",
}

// String returns the algorithm's wire name, e.g. "TOKEN_BUCKET".
func (a Algorithm) String() string {
	if a < NumAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Valid reports whether a names one of the six algorithms.
func (a Algorithm) Valid() bool { return a < NumAlgorithms }

// ParseAlgorithm returns the algorithm with the given wire name; the match
// ignores case, so "token_bucket" works on the command line.
func ParseAlgorithm(name string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if strings.EqualFold(n, name) {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", name, strings.Join(algorithmNames[:], ", "))
}
