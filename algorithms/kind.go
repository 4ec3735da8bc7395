package algorithms

import (
	"fmt"
	"strings"
)

// Kind names one of the six algorithms. It is the single source of truth
// for the algorithm enum: its values are the tag byte of every encoded
// state (see CODEC.md), the limiter's table index, and the values of the
// ringlimit.v1 Algorithm enum (a test in package api keeps the two equal),
// so the API converts with a checked cast.
type Kind uint8

// The algorithms, in the order of the ringlimit.v1 Algorithm enum. Never
// renumber them: the numbers are on the wire.
const (
	KindTokenBucket Kind = iota
	KindGCRA
	KindLeakyBucket
	KindFixedWindow
	KindSlidingWindow
	KindSlidingLog
	// NumKinds is the number of algorithms, for arrays indexed by a Kind.
	NumKinds
)

// kindNames returns the wire names, indexed by Kind. (A function, not a
// variable, so that no package state can be changed.)
func kindNames() [NumKinds]string {
	return [NumKinds]string{
		KindTokenBucket:   "TOKEN_BUCKET",
		KindGCRA:          "GCRA",
		KindLeakyBucket:   "LEAKY_BUCKET",
		KindFixedWindow:   "FIXED_WINDOW",
		KindSlidingWindow: "SLIDING_WINDOW",
		KindSlidingLog:    "SLIDING_LOG",
	}
}

// String returns the algorithm's wire name, e.g. "TOKEN_BUCKET".
func (k Kind) String() string {
	if k.Valid() {
		return kindNames()[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Valid reports whether k names one of the six algorithms.
func (k Kind) Valid() bool { return k < NumKinds }

// ParseKind returns the algorithm with the given wire name; the match
// ignores case, so "token_bucket" works on the command line.
func ParseKind(name string) (Kind, error) {
	names := kindNames()
	for i, n := range names {
		if strings.EqualFold(n, name) {
			return Kind(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", name, strings.Join(names[:], ", "))
}
