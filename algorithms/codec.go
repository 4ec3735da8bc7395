package algorithms

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// StateVersion is the format version every encoded state starts with. The
// layouts it names are pinned by golden-bytes tests and described in
// CODEC.md: changing any of them, even reordering two fields, means a new
// version, so that a node of another version refuses the state (with
// ErrUnknownVersion) instead of misreading it.
const StateVersion = 1

var (
	// ErrUnknownVersion reports an encoded state, or a record holding one,
	// in a format version this build does not know.
	ErrUnknownVersion = errors.New("unknown format version")
	// ErrBadState reports bytes that are not an encoded state of the
	// expected algorithm, or a state that is impossible for its algorithm
	// and limit.
	ErrBadState = errors.New("bad state")
)

// stateHeader is the version byte and the Kind tag byte that start every
// encoded state.
const stateHeader = 2

// The sizes of encoded states, for whoever bounds what it stores or
// reads: an encoding is at most MaxFixedStateBytes plus LogEntryBytes for
// each sliding-log entry it holds, so never more than MaxStateBytes (a
// full sliding log).
const (
	MaxFixedStateBytes = stateHeader + 4*8 // a sliding window's four words
	LogEntryBytes      = slidingLogEntry
	MaxStateBytes      = stateHeader + 4 + LogEntryBytes*MaxSlidingLogLimit
)

// badState returns an error wrapping ErrBadState that names k and says what
// is wrong.
func badState(k Kind, format string, args ...any) error {
	return fmt.Errorf("%s state: %s: %w", k, fmt.Sprintf(format, args...), ErrBadState)
}

// appendWords appends the encoding of a fixed-size state of kind k: the
// header, then each word as 8 bytes little-endian.
func appendWords(b []byte, k Kind, words ...int64) []byte {
	b = append(b, StateVersion, byte(k))
	for _, w := range words {
		b = binary.LittleEndian.AppendUint64(b, uint64(w))
	}
	return b
}

// stateBody checks the header of an encoded state of kind k and returns
// the bytes after it.
func stateBody(data []byte, k Kind) ([]byte, error) {
	switch {
	case len(data) < stateHeader:
		return nil, badState(k, "%d bytes, shorter than the %d-byte header", len(data), stateHeader)
	case data[0] != StateVersion:
		return nil, fmt.Errorf("%s state: version %d, this build reads %d: %w", k, data[0], StateVersion, ErrUnknownVersion)
	case Kind(data[1]) != k:
		return nil, badState(k, "tagged %s", Kind(data[1]))
	}
	return data[stateHeader:], nil
}

// readWords decodes a fixed-size state of kind k into words, refusing any
// length but the exact one.
func readWords(data []byte, k Kind, words ...*int64) error {
	body, err := stateBody(data, k)
	if err != nil {
		return err
	}
	if want := 8 * len(words); len(body) != want {
		return badState(k, "%d bytes, want %d", len(data), stateHeader+want)
	}
	for i, w := range words {
		*w = int64(binary.LittleEndian.Uint64(body[8*i:]))
	}
	return nil
}

// AppendBinary appends b's encoding (encoding.BinaryAppender):
//
//	offset  size  field
//	0       1     version (StateVersion)
//	1       1     tag (KindTokenBucket = 0)
//	2       8     Full, Unix ns, int64 little-endian
//	10      8     FullFrac, int64 little-endian
func (b *TokenBucket) AppendBinary(buf []byte) ([]byte, error) {
	return appendWords(buf, KindTokenBucket, b.Full, b.FullFrac), nil
}

// UnmarshalBinary decodes AppendBinary's bytes into b, refusing any other
// version, tag or length. It does not check the state against a limit:
// that is Validate's job.
func (b *TokenBucket) UnmarshalBinary(data []byte) error {
	var s TokenBucket
	if err := readWords(data, KindTokenBucket, &s.Full, &s.FullFrac); err != nil {
		return err
	}
	*b = s
	return nil
}

// AppendBinary appends g's encoding (encoding.BinaryAppender):
//
//	offset  size  field
//	0       1     version (StateVersion)
//	1       1     tag (KindGCRA = 1)
//	2       8     TAT, Unix ns, int64 little-endian
//	10      8     TATFrac, int64 little-endian
func (g *GCRA) AppendBinary(buf []byte) ([]byte, error) {
	return appendWords(buf, KindGCRA, g.TAT, g.TATFrac), nil
}

// UnmarshalBinary decodes AppendBinary's bytes into g, refusing any other
// version, tag or length.
func (g *GCRA) UnmarshalBinary(data []byte) error {
	var s GCRA
	if err := readWords(data, KindGCRA, &s.TAT, &s.TATFrac); err != nil {
		return err
	}
	*g = s
	return nil
}

// AppendBinary appends q's encoding (encoding.BinaryAppender):
//
//	offset  size  field
//	0       1     version (StateVersion)
//	1       1     tag (KindLeakyBucket = 2)
//	2       8     Drained, Unix ns, int64 little-endian
//	10      8     DrainedFrac, int64 little-endian
func (q *LeakyBucket) AppendBinary(buf []byte) ([]byte, error) {
	return appendWords(buf, KindLeakyBucket, q.Drained, q.DrainedFrac), nil
}

// UnmarshalBinary decodes AppendBinary's bytes into q, refusing any other
// version, tag or length.
func (q *LeakyBucket) UnmarshalBinary(data []byte) error {
	var s LeakyBucket
	if err := readWords(data, KindLeakyBucket, &s.Drained, &s.DrainedFrac); err != nil {
		return err
	}
	*q = s
	return nil
}

// AppendBinary appends w's encoding (encoding.BinaryAppender):
//
//	offset  size  field
//	0       1     version (StateVersion)
//	1       1     tag (KindFixedWindow = 3)
//	2       8     Start, Unix ns, int64 little-endian
//	10      8     Count, int64 little-endian
func (w *FixedWindow) AppendBinary(buf []byte) ([]byte, error) {
	return appendWords(buf, KindFixedWindow, w.Start, w.Count), nil
}

// UnmarshalBinary decodes AppendBinary's bytes into w, refusing any other
// version, tag or length.
func (w *FixedWindow) UnmarshalBinary(data []byte) error {
	var s FixedWindow
	if err := readWords(data, KindFixedWindow, &s.Start, &s.Count); err != nil {
		return err
	}
	*w = s
	return nil
}

// AppendBinary appends w's encoding (encoding.BinaryAppender):
//
//	offset  size  field
//	0       1     version (StateVersion)
//	1       1     tag (KindSlidingWindow = 4)
//	2       8     Start, Unix ns, int64 little-endian
//	10      8     Prev, int64 little-endian
//	18      8     Curr, int64 little-endian
//	26      8     Period, ns, int64 little-endian
func (w *SlidingWindow) AppendBinary(buf []byte) ([]byte, error) {
	return appendWords(buf, KindSlidingWindow, w.Start, w.Prev, w.Curr, w.Period), nil
}

// UnmarshalBinary decodes AppendBinary's bytes into w, refusing any other
// version, tag or length.
func (w *SlidingWindow) UnmarshalBinary(data []byte) error {
	var s SlidingWindow
	if err := readWords(data, KindSlidingWindow, &s.Start, &s.Prev, &s.Curr, &s.Period); err != nil {
		return err
	}
	*w = s
	return nil
}

// AppendBinary appends s's encoding (encoding.BinaryAppender):
//
//	offset  size  field
//	0       1     version (StateVersion)
//	1       1     tag (KindSpacing = 6)
//	2       8     Next, Unix ns, int64 little-endian
func (s *Spacing) AppendBinary(buf []byte) ([]byte, error) {
	return appendWords(buf, KindSpacing, s.Next), nil
}

// UnmarshalBinary decodes AppendBinary's bytes into s, refusing any other
// version, tag or length.
func (s *Spacing) UnmarshalBinary(data []byte) error {
	var d Spacing
	if err := readWords(data, KindSpacing, &d.Next); err != nil {
		return err
	}
	*s = d
	return nil
}

// slidingLogEntry is the encoded size of one SlidingLog entry.
const slidingLogEntry = 16

// AppendBinary appends s's encoding (encoding.BinaryAppender):
//
//	offset    size  field
//	0         1     version (StateVersion)
//	1         1     tag (KindSlidingLog = 5)
//	2         4     n, the number of entries, uint32 little-endian
//	6+16i     8     entry i's Unix ns, int64 little-endian, oldest first
//	14+16i    8     entry i's hits, int64 little-endian
//
// It refuses a log of more than MaxSlidingLogLimit entries, which no
// decoder would accept.
func (s *SlidingLog) AppendBinary(buf []byte) ([]byte, error) {
	if s.n > MaxSlidingLogLimit {
		return buf, badState(KindSlidingLog, "%d entries, more than %d", s.n, MaxSlidingLogLimit)
	}
	buf = append(buf, StateVersion, byte(KindSlidingLog))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(s.n))
	for i := range s.n {
		e := s.at(i)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(e.ts))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(e.count))
	}
	return buf, nil
}

// UnmarshalBinary decodes AppendBinary's bytes into s, refusing any other
// version, tag or length, more than MaxSlidingLogLimit entries (before
// allocating any), and entries that are not in strictly ascending time
// with positive hits and times, which no log holds. It allocates a ring of
// exactly the entries decoded.
func (s *SlidingLog) UnmarshalBinary(data []byte) error {
	body, err := stateBody(data, KindSlidingLog)
	if err != nil {
		return err
	}
	if len(body) < 4 {
		return badState(KindSlidingLog, "%d bytes, shorter than the entry count", len(data))
	}
	n := binary.LittleEndian.Uint32(body)
	if n > MaxSlidingLogLimit {
		return badState(KindSlidingLog, "%d entries, more than %d", n, MaxSlidingLogLimit)
	}
	body = body[4:]
	if want := int(n) * slidingLogEntry; len(body) != want {
		return badState(KindSlidingLog, "%d bytes for %d entries, want %d", len(data), n, stateHeader+4+want)
	}
	var log SlidingLog
	if n > 0 {
		log.ring = make([]logEntry, n)
	}
	for i := range log.ring {
		e := logEntry{
			ts:    int64(binary.LittleEndian.Uint64(body[slidingLogEntry*i:])),
			count: int64(binary.LittleEndian.Uint64(body[slidingLogEntry*i+8:])),
		}
		switch {
		case e.ts < 0:
			return badState(KindSlidingLog, "entry %d: time %d is negative", i, e.ts)
		case e.count <= 0:
			return badState(KindSlidingLog, "entry %d: hits %d not positive", i, e.count)
		case i > 0 && e.ts <= log.ring[i-1].ts:
			return badState(KindSlidingLog, "entry %d: time %d not after the previous entry's %d", i, e.ts, log.ring[i-1].ts)
		}
		log.ring[i] = e
		log.hits = satAdd(log.hits, e.count)
	}
	log.n = int(n)
	*s = log
	return nil
}

// horizon returns the latest Unix ns a state may name as an event that
// has happened: now plus the allowed clock skew.
func horizon(now time.Time, skew time.Duration) int64 {
	return satAdd(now.UnixNano(), int64(max(skew, 0)))
}

// validInstant checks a bucket state's instant (ns, frac) of kind k under
// l: not negative, frac in [0, Count), and no later than a full drain of
// the bucket (Capacity·Period/Count) after now+skew, the furthest any
// sequence of admitted requests can push it.
func validInstant(k Kind, field string, ns, frac int64, now time.Time, l Limit, skew time.Duration) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("%s state: %w", k, err)
	}
	switch {
	case ns < 0:
		return badState(k, "%s %d is negative", field, ns)
	case frac < 0 || frac >= l.Count:
		return badState(k, "%sFrac %d outside [0, %d)", field, frac, l.Count)
	}
	r := l.ticks()
	if lead := r.lead(ns, frac, horizon(now, skew)); r.capacity.less(lead) {
		return badState(k, "%s %s is more than a full drain (%v) past now+skew",
			field, time.Unix(0, ns).UTC().Format(time.RFC3339Nano), r.ceil(r.capacity))
	}
	return nil
}

// validWindow checks a window state's Start of kind k under l: not
// negative, aligned to l.Period since the Unix epoch, and not after
// now+skew.
func validWindow(k Kind, start int64, now time.Time, l Limit, skew time.Duration) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("%s state: %w", k, err)
	}
	switch {
	case start < 0:
		return badState(k, "Start %d is negative", start)
	case start%int64(l.Period) != 0:
		return badState(k, "Start %d is not aligned to the period %v", start, l.Period)
	case start > horizon(now, skew):
		return badState(k, "Start %s is after now+skew", time.Unix(0, start).UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// validCount checks that a window's count of hits lies in [0, l.Count].
func validCount(k Kind, field string, n int64, l Limit) error {
	if n < 0 || n > l.Count {
		return badState(k, "%s %d outside [0, %d]", field, n, l.Count)
	}
	return nil
}

// Validate returns an error wrapping ErrBadState if b is impossible for a
// token bucket under l at now, allowing clock skew between nodes: a Full
// instant that is negative or further ahead of now+skew than a full drain,
// or a FullFrac outside [0, Count). An invalid l is refused with
// ErrInvalidLimit. Nodes call it on every state that crosses the network.
func (b *TokenBucket) Validate(now time.Time, l Limit, skew time.Duration) error {
	return validInstant(KindTokenBucket, "Full", b.Full, b.FullFrac, now, l, skew)
}

// Validate is TokenBucket.Validate for a GCRA's TAT: the TAT is never more
// than Capacity emission intervals ahead of now.
func (g *GCRA) Validate(now time.Time, l Limit, skew time.Duration) error {
	return validInstant(KindGCRA, "TAT", g.TAT, g.TATFrac, now, l, skew)
}

// Validate is TokenBucket.Validate for a leaky bucket's Drained instant: a
// queue never holds more than Capacity hits to drain.
func (q *LeakyBucket) Validate(now time.Time, l Limit, skew time.Duration) error {
	return validInstant(KindLeakyBucket, "Drained", q.Drained, q.DrainedFrac, now, l, skew)
}

// Validate returns an error wrapping ErrBadState if w is impossible for a
// fixed window under l at now, allowing clock skew: a Start that is
// negative, not aligned to l.Period or after now+skew, or a Count outside
// [0, l.Count+1] (l.Count+1 marks a window whose Add counted refused
// hits). An invalid l is refused with ErrInvalidLimit.
func (w *FixedWindow) Validate(now time.Time, l Limit, skew time.Duration) error {
	if err := validWindow(KindFixedWindow, w.Start, now, l, skew); err != nil {
		return err
	}
	// Add keeps a window that counted refused hits at l.Count+1.
	over := l
	over.Count = satAdd(l.Count, 1)
	return validCount(KindFixedWindow, "Count", w.Count, over)
}

// Validate returns an error wrapping ErrBadState if w is impossible for a
// sliding window under l at now, allowing clock skew: a Start as
// FixedWindow.Validate refuses it, a Prev or Curr outside [0, l.Count], or
// a Period other than l.Period (or 0, the zero value's). An invalid l is
// refused with ErrInvalidLimit.
func (w *SlidingWindow) Validate(now time.Time, l Limit, skew time.Duration) error {
	if err := validWindow(KindSlidingWindow, w.Start, now, l, skew); err != nil {
		return err
	}
	if err := validCount(KindSlidingWindow, "Prev", w.Prev, l); err != nil {
		return err
	}
	if err := validCount(KindSlidingWindow, "Curr", w.Curr, l); err != nil {
		return err
	}
	if w.Period != 0 && w.Period != int64(l.Period) {
		return badState(KindSlidingWindow, "Period %v is not the limit's %v", time.Duration(w.Period), l.Period)
	}
	return nil
}

// Validate returns an error wrapping ErrBadState if s is impossible for a
// sliding log under l at now, allowing clock skew: its newest entry after
// now+skew, or more than l.Count hits in some Period-long window (t-Period,
// t]. (Negative times, unordered entries and non-positive hits cannot be
// held by a SlidingLog: UnmarshalBinary refuses them.) A limit that
// ValidateSlidingLog refuses is refused with ErrInvalidLimit.
func (s *SlidingLog) Validate(now time.Time, l Limit, skew time.Duration) error {
	if err := ValidateSlidingLog(l); err != nil {
		return fmt.Errorf("%s state: %w", KindSlidingLog, err)
	}
	if s.n > 0 && s.at(s.n-1).ts > horizon(now, skew) {
		return badState(KindSlidingLog, "newest entry %s is after now+skew",
			time.Unix(0, s.at(s.n-1).ts).UTC().Format(time.RFC3339Nano))
	}
	if i, inWindow := s.overfull(l); i >= 0 {
		if e := s.at(i); e.count > l.Count {
			return badState(KindSlidingLog, "entry %d holds %d hits, above the limit %d", i, e.count, l.Count)
		}
		return badState(KindSlidingLog, "%d hits in the period ending at entry %d, above the limit %d", inWindow, i, l.Count)
	}
	return nil
}

// Validate returns an error wrapping ErrBadState if s is impossible under
// l at now, allowing clock skew: a Next that is negative or more than
// l.Period after now+skew, further than an admitted request moves it. An
// invalid l is refused with ErrInvalidLimit.
func (s *Spacing) Validate(now time.Time, l Limit, skew time.Duration) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("%s state: %w", KindSpacing, err)
	}
	switch {
	case s.Next < 0:
		return badState(KindSpacing, "Next %d is negative", s.Next)
	case s.Next > satAdd(horizon(now, skew), int64(l.Period)):
		return badState(KindSpacing, "Next %s is more than the period %v past now+skew",
			time.Unix(0, s.Next).UTC().Format(time.RFC3339Nano), l.Period)
	}
	return nil
}

// overfull returns the first entry i at which s holds more than l.Count
// hits, in the entry itself or in the window (ts-Period, ts] ending at it,
// and the hits in that window; or -1 if there is none. l must be valid.
func (s *SlidingLog) overfull(l Limit) (i int, inWindow int64) {
	// A window ending at each entry, slid over the log: first is the
	// oldest entry inside it. Each count is checked against l.Count before
	// it is summed, so the sum cannot overflow.
	first := 0
	for i := range s.n {
		e := s.at(i)
		if e.count > l.Count {
			return i, e.count
		}
		inWindow += e.count
		for s.at(first).ts <= e.ts-int64(l.Period) {
			inWindow -= s.at(first).count
			first++
		}
		if inWindow > l.Count {
			return i, inWindow
		}
	}
	return -1, 0
}
