package limiter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// The bounds of a counter's identity, and so of a check's name and key:
// package checks, which owns a check's other bounds, imports this one and
// takes these as they are, so that no counter can cross a port that a
// check could not create, and no check is made whose counter could not.
const (
	MaxNameLen = 256
	MaxKeyLen  = 1024
)

// CounterVersion is the newest format version a Counter record starts
// with. Any change to the record's layout (see AppendBinary) is a new
// version; the algorithm state inside has its own
// (algorithms.StateVersion). Versions 2 (a Role), 3 (reservations) and 4
// (stand-in hits) are written only for the counters that hold what they
// added, so that the build before each, which refuses them per counter
// (ErrUnknownVersion: the sender keeps them), still takes every other
// counter in a rolling upgrade. See docs/design.md, "The counter record".
const CounterVersion = 4

var (
	// ErrBadCounter reports a Counter record that does not decode, or a
	// counter whose name, key, limit, time or state is impossible.
	ErrBadCounter = errors.New("bad counter")
	// ErrUnknownVersion reports a record, or the state inside it, in a
	// format version this build does not know. It is
	// algorithms.ErrUnknownVersion, so one errors.Is answers for both.
	ErrUnknownVersion = algorithms.ErrUnknownVersion
)

// Counter is one counter's whole state as a value: the form in which
// counters leave the store (Counters, Extract), cross the network on
// hand-off and replication and come back in (Merge). Snapshots will use
// it too. Its binary form is versioned (see AppendBinary).
type Counter struct {
	Name, Key string
	Algorithm Algorithm
	// Role tells a check's ceiling counter from its own (see Role).
	Role Role
	// Limit is the limit the counter was last evaluated with: State is
	// valid under it.
	Limit algorithms.Limit
	// Last is the latest time the counter was evaluated at, Unix ns.
	Last int64
	// State is the algorithm state in its own versioned encoding
	// (algorithms' AppendBinary; see algorithms/CODEC.md).
	State []byte
	// Reservations are the counter's reservations, open or settled and
	// remembered, at most MaxCounterReservations; only a counter of
	// RoleLimit of an algorithm that can give hits back (Reservable)
	// holds any. Their hits are charged in State already.
	Reservations []Reservation
	// StandInHits are the hits this counter was charged by checks
	// decided for a counter that was elsewhere (Request.StandIn): on a
	// member that stood in for an owner it could not reach, or on an owner
	// whose counter had not arrived when it stopped waiting for it. They
	// are charged in State already; a store that holds the key's counter
	// adds them to it rather than keep the more charged of the two (see
	// Store.Merge). Zero for every other counter.
	StandInHits int64
}

// counterFixed is the bytes of a version 1 record besides name, key and
// state; a version 2 record has one more, its role, and a version 4 record
// standInFixed more than that.
const counterFixed = 1 + 1 + 2 + 2 + 4*8

// standInFixed is what a version 4 record adds to version 2's besides
// its reservations: the stand-in's hits and the count of reservations.
const standInFixed = 8 + 2

// The sizes of records, for whoever bounds what it stores or reads: a
// record is at most MaxFixedCounterBytes plus algorithms.LogEntryBytes for
// each sliding-log entry its state holds, plus ReservationBytes for each
// reservation it carries, so never more than MaxCounterBytes (a full
// sliding log holding MaxCounterReservations under the longest name and
// key, in version 4).
const (
	MaxFixedCounterBytes = counterFixed + 1 + standInFixed + MaxNameLen + MaxKeyLen + algorithms.MaxFixedStateBytes
	MaxCounterBytes      = MaxFixedCounterBytes - algorithms.MaxFixedStateBytes + algorithms.MaxStateBytes +
		MaxCounterReservations*ReservationBytes
)

// AppendBinary appends c's record (encoding.BinaryAppender), all integers
// little-endian, in the oldest version that holds it: version 1 (algorithm,
// Name, Key, Limit, Last, State) for a counter of RoleLimit; version 2
// (the role after the algorithm) for another role; version 3 (version 1's
// with the reservations between Last and State) for a counter of RoleLimit
// with reservations; version 4 (version 2's, RoleLimit included, with
// StandInHits and the reservations between Last and State) for one with
// stand-in hits. The layout of each: docs/design.md, "The counter record".
//
// So each counter has one encoding. It refuses a name or key out of
// bounds, an unknown role, a spacing of a role other than RoleLimit, and
// reservations on a counter that cannot hold them, or more than
// MaxCounterReservations, or two of one id, and negative stand-in hits,
// which no decoder would accept.
func (c *Counter) AppendBinary(b []byte) ([]byte, error) {
	if err := c.checkID(); err != nil {
		return b, err
	}
	switch {
	case c.StandInHits > 0:
		b = append(b, 4, byte(c.Algorithm), byte(c.Role))
	case len(c.Reservations) > 0:
		b = append(b, 3, byte(c.Algorithm))
	case c.Role == RoleLimit:
		b = append(b, 1, byte(c.Algorithm))
	default:
		b = append(b, 2, byte(c.Algorithm), byte(c.Role))
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Name)))
	b = append(b, c.Name...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Key)))
	b = append(b, c.Key...)
	for _, w := range [...]int64{c.Limit.Count, int64(c.Limit.Period), c.Limit.Burst, c.Last} {
		b = binary.LittleEndian.AppendUint64(b, uint64(w))
	}
	if c.StandInHits > 0 {
		b = binary.LittleEndian.AppendUint64(b, uint64(c.StandInHits))
	}
	if c.StandInHits > 0 || len(c.Reservations) > 0 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Reservations)))
		for i := range c.Reservations {
			b = c.Reservations[i].AppendBinary(b)
		}
	}
	return append(b, c.State...), nil
}

// UnmarshalBinary decodes AppendBinary's record, of version 1 to 4, into
// c. It refuses another version (ErrUnknownVersion), an unknown
// algorithm or role, a version 2 record of RoleLimit (written in version
// 1), a version 3 record of no reservations (written in version 1), a
// version 4 record of no stand-in hits (written in another), a
// name or key out of bounds, a record too short for its lengths, and
// reservations as AppendBinary refuses them or as
// Reservation.UnmarshalBinary does (ErrBadCounter). The count of
// reservations is checked before any is allocated. It copies what it
// keeps, so data may be reused. It checks neither the limit nor the
// state, nor the reservations' times and amounts: Store.Merge does.
func (c *Counter) UnmarshalBinary(data []byte) error {
	if len(data) < counterFixed {
		return fmt.Errorf("counter record of %d bytes, shorter than the %d fixed ones: %w", len(data), counterFixed, ErrBadCounter)
	}
	d := Counter{Algorithm: Algorithm(data[1])}
	rest := data[2:]
	switch data[0] {
	case 1, 3:
	case 2:
		if d.Role, rest = Role(rest[0]), rest[1:]; d.Role == RoleLimit {
			return fmt.Errorf("counter record version 2 of role %s, which is written in version 1: %w", d.Role, ErrBadCounter)
		}
	case 4:
		d.Role, rest = Role(rest[0]), rest[1:]
	default:
		return fmt.Errorf("counter record version %d, this build reads 1 to %d: %w", data[0], CounterVersion, ErrUnknownVersion)
	}
	var ok bool
	if d.Name, rest, ok = lengthPrefixed(rest); !ok {
		return fmt.Errorf("counter record: name runs past the end: %w", ErrBadCounter)
	}
	if d.Key, rest, ok = lengthPrefixed(rest); !ok {
		return fmt.Errorf("counter record: key runs past the end: %w", ErrBadCounter)
	}
	if len(rest) < 4*8 {
		return fmt.Errorf("counter record: %d bytes after the key, want at least %d: %w", len(rest), 4*8, ErrBadCounter)
	}
	word := func(i int) int64 { return int64(binary.LittleEndian.Uint64(rest[8*i:])) }
	d.Limit = algorithms.Limit{Count: word(0), Period: time.Duration(word(1)), Burst: word(2)}
	d.Last = word(3)
	rest = rest[4*8:]
	switch data[0] {
	case 3:
		var err error
		if d.Reservations, rest, err = decodeReservations(rest, 1); err != nil {
			return err
		}
	case 4:
		if len(rest) < 8 {
			return fmt.Errorf("counter record: stand-in hits run past the end: %w", ErrBadCounter)
		}
		if d.StandInHits, rest = int64(binary.LittleEndian.Uint64(rest)), rest[8:]; d.StandInHits <= 0 {
			return fmt.Errorf("counter record version 4 of %d stand-in hits, want at least 1: %w", d.StandInHits, ErrBadCounter)
		}
		var err error
		if d.Reservations, rest, err = decodeReservations(rest, 0); err != nil {
			return err
		}
	}
	d.State = append([]byte(nil), rest...)
	if err := d.checkID(); err != nil {
		return err
	}
	*c = d
	return nil
}

// decodeReservations splits a version 3 or 4 record's reservations off
// b: the count, at least least, bounded before anything is allocated,
// then each one.
func decodeReservations(b []byte, least int) ([]Reservation, []byte, error) {
	if len(b) < 2 {
		return nil, b, fmt.Errorf("counter record: reservations: the count runs past the end: %w", ErrBadCounter)
	}
	n := int(binary.LittleEndian.Uint16(b))
	b = b[2:]
	switch {
	case n == 0 && least == 0:
		return nil, b, nil
	case n < least || n > MaxCounterReservations:
		return nil, b, fmt.Errorf("counter record: %d reservations, want %d..%d: %w", n, least, MaxCounterReservations, ErrBadCounter)
	case len(b) < n*ReservationBytes:
		return nil, b, fmt.Errorf("counter record: %d reservations need %d bytes, %d left: %w", n, n*ReservationBytes, len(b), ErrBadCounter)
	}
	rs := make([]Reservation, n)
	for i := range rs {
		if err := rs[i].UnmarshalBinary(b[:ReservationBytes]); err != nil {
			return nil, b, fmt.Errorf("counter record: reservation %d: %w", i, err)
		}
		b = b[ReservationBytes:]
	}
	return rs, b, nil
}

// lengthPrefixed splits a uint16-length-prefixed string off b.
func lengthPrefixed(b []byte) (s string, rest []byte, ok bool) {
	if len(b) < 2 {
		return "", b, false
	}
	n := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n {
		return "", b, false
	}
	return string(b[2 : 2+n]), b[2+n:], true
}

// checkID checks c's algorithm, role, name and key against the public
// API's bounds: a ceiling is a check's, so never a spacing's.
func (c *Counter) checkID() error {
	switch {
	case !c.Algorithm.Valid():
		return fmt.Errorf("counter algorithm %d: unknown: %w", uint8(c.Algorithm), ErrBadCounter)
	case c.Role >= numRoles:
		return fmt.Errorf("counter role %d: unknown: %w", uint8(c.Role), ErrBadCounter)
	case c.Role != RoleLimit && c.Algorithm == Spacing:
		return fmt.Errorf("counter role %s of a spacing, which has only its own: %w", c.Role, ErrBadCounter)
	case c.Name == "" || len(c.Name) > MaxNameLen:
		return fmt.Errorf("counter name of %d bytes, want 1..%d: %w", len(c.Name), MaxNameLen, ErrBadCounter)
	case strings.IndexByte(c.Name, 0) >= 0:
		return fmt.Errorf("counter name holds a NUL byte: %w", ErrBadCounter)
	case c.Key == "" || len(c.Key) > MaxKeyLen:
		return fmt.Errorf("counter key of %d bytes, want 1..%d: %w", len(c.Key), MaxKeyLen, ErrBadCounter)
	case c.StandInHits < 0:
		return fmt.Errorf("counter of %d stand-in hits, want none or more: %w", c.StandInHits, ErrBadCounter)
	case len(c.Reservations) == 0:
		return nil
	case c.Role != RoleLimit || !Reservable(c.Algorithm):
		return fmt.Errorf("counter reservations on a %s counter of role %s, which cannot hold any: %w", c.Algorithm, c.Role, ErrBadCounter)
	case len(c.Reservations) > MaxCounterReservations:
		return fmt.Errorf("counter of %d reservations, more than %d: %w", len(c.Reservations), MaxCounterReservations, ErrBadCounter)
	}
	seen := make(map[ReservationID]int, len(c.Reservations))
	for i := range c.Reservations {
		id := c.Reservations[i].ID
		if j, dup := seen[id]; dup {
			return fmt.Errorf("counter reservations %d and %d share the id %s: %w", j, i, id, ErrBadCounter)
		}
		seen[id] = i
	}
	return nil
}

// validate checks everything about c that does not need its decoded
// state: its identity, its limit (as the public API would: valid, and for
// a sliding log no more than algorithms.MaxSlidingLogLimit) and that Last
// is not negative nor after now+skew.
func (c *Counter) validate(now time.Time, skew time.Duration) error {
	if err := c.checkID(); err != nil {
		return err
	}
	err := c.Limit.Validate()
	if c.Algorithm == SlidingLog {
		err = algorithms.ValidateSlidingLog(c.Limit)
	}
	if err != nil {
		return fmt.Errorf("counter limit: %w: %w", ErrBadCounter, err)
	}
	horizon := now.Add(max(skew, 0)).UnixNano()
	if c.Last < 0 || c.Last > horizon {
		return fmt.Errorf("counter last evaluated at %d, outside [0, now+skew = %d]: %w", c.Last, horizon, ErrBadCounter)
	}
	for i := range c.Reservations {
		if err := c.Reservations[i].validate(horizon); err != nil {
			return fmt.Errorf("counter reservation %s: %w: %w", c.Reservations[i].ID, ErrBadCounter, err)
		}
	}
	return nil
}
