package algorithms

import (
	"fmt"
	"strings"
)

// Kind names one of the six algorithms, or KindSpacing. It is the single
// source of truth for the algorithm enum: its values are the tag byte of
// every encoded state (see CODEC.md), the limiter's table index, and, for
// the six Public kinds, the values of the ringlimit.v1 Algorithm enum (a
// test in package api keeps the two equal), so the API converts with a
// checked cast.
type Kind uint8

// The algorithms, in the order of the ringlimit.v1 Algorithm enum, then
// KindSpacing. Never renumber them: the numbers are on the wire.
const (
	KindTokenBucket Kind = iota
	KindGCRA
	KindLeakyBucket
	KindFixedWindow
	KindSlidingWindow
	KindSlidingLog
	// KindSpacing is Spacing, the minimum spacing between requests: not an
	// algorithm a check names, but the kind of the counter that a check's
	// min_interval_ms keeps beside its own, under the same name and key.
	// The ringlimit.v1 Algorithm enum reserves its value, so that no
	// public algorithm ever takes it.
	KindSpacing
	// NumKinds is the number of kinds, for arrays indexed by a Kind.
	NumKinds
)

// NumPublic is the number of Public kinds: KindTokenBucket to
// KindSlidingLog, the values of the ringlimit.v1 Algorithm enum.
const NumPublic = KindSpacing

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
		KindSpacing:       "SPACING",
	}
}

// String returns the algorithm's wire name, e.g. "TOKEN_BUCKET" (and
// "SPACING" for KindSpacing, the name metrics label it with).
func (k Kind) String() string {
	if k.Valid() {
		return kindNames()[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Valid reports whether k names a kind of counter: one of the six
// algorithms or KindSpacing.
func (k Kind) Valid() bool { return k < NumKinds }

// Public reports whether k is one of the six algorithms a check may name
// in its algorithm field; KindSpacing is not.
func (k Kind) Public() bool { return k < NumPublic }

// ParseKind returns the Public algorithm with the given wire name; the
// match ignores case, so "token_bucket" works on the command line.
// "SPACING" is not one: a check asks for a spacing with min_interval_ms.
func ParseKind(name string) (Kind, error) {
	all := kindNames()
	names := all[:NumPublic]
	for i, n := range names {
		if strings.EqualFold(n, name) {
			return Kind(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", name, strings.Join(names, ", "))
}
