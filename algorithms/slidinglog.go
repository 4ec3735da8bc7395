package algorithms

import (
	"fmt"
	"iter"
	"math"
	"time"
)

// MaxSlidingLogLimit is the largest Count a SlidingLog accepts. A log keeps
// one entry per distinct admission instant in the last Period, up to Count
// entries of 16 bytes, so its memory grows with Count: a limit above this
// is refused (see ValidateSlidingLog) rather than allowed to eat the node.
// Use SlidingWindow for larger limits.
const MaxSlidingLogLimit = 10000

// ValidateSlidingLog returns an error wrapping ErrInvalidLimit if l is
// invalid or its Count is above MaxSlidingLogLimit. Callers check it once
// before using l with a SlidingLog, whose Take refuses such a limit with
// RetryAfter Never.
func ValidateSlidingLog(l Limit) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if l.Count > MaxSlidingLogLimit {
		return fmt.Errorf("count %d above the sliding log maximum %d: %w",
			l.Count, MaxSlidingLogLimit, ErrInvalidLimit)
	}
	return nil
}

// SlidingLog is the state of an exact sliding-window limit: it logs the
// hits admitted, and admits n hits at t while the hits in (t-Period, t]
// plus n are at most Count. It ignores Burst.
//
// The log is a ring buffer of (Unix ns, hits) entries, oldest first, that
// grows by doubling up to the entries a full window needs and is then
// reused, so that steady-state decisions do not allocate. Its fields are
// unexported to keep the ring consistent: serialise it with Entries and
// rebuild it with Append. The zero value is an empty log.
//
// A SlidingLog holds a slice, so a copy shares its buffer: copy it with
// Clone.
type SlidingLog struct {
	ring []logEntry // len(ring) is the capacity; entries are ring[head:head+n] modulo it
	head int
	n    int
	hits int64 // the sum of the entries' counts
}

// logEntry is count hits admitted at Unix ns ts.
type logEntry struct{ ts, count int64 }

// Take logs n hits at time now if the last Period holds room for them, and
// reports the decision; a refused request changes nothing but dropping
// entries that have left the window.
//
// Remaining is Count minus the hits in the window; RetryAfter the time
// until enough old hits leave the window for n to fit, or Never if n >
// Count (or Count > MaxSlidingLogLimit); ResetAfter the time until the
// newest logged hit leaves the window.
func (s *SlidingLog) Take(now time.Time, l Limit, n int64) Decision {
	if !s.usable(l, n) {
		return refused()
	}
	t := now.UnixNano()
	for s.n > 0 && s.at(0).ts <= t-int64(l.Period) {
		s.hits -= s.at(0).count
		s.head = s.index(1)
		s.n--
	}
	d := s.decide(t, l, n, 0, s.hits)
	if d.Allowed && n > 0 {
		s.push(t, n, l.Count)
	}
	return d
}

// Check reports what Take would decide, without changing the log.
func (s *SlidingLog) Check(now time.Time, l Limit, n int64) Decision {
	if !s.usable(l, n) {
		return refused()
	}
	t := now.UnixNano()
	first, hits := 0, s.hits
	for ; first < s.n && s.at(first).ts <= t-int64(l.Period); first++ {
		hits -= s.at(first).count
	}
	return s.decide(t, l, n, first, hits)
}

// usable reports whether a decision on l and n can be made at all.
func (s *SlidingLog) usable(l Limit, n int64) bool {
	return l.valid() && l.Count <= MaxSlidingLogLimit && n >= 0
}

// decide answers a request for n hits at t, given that the entries from
// first on, holding hits hits, are in the window.
func (s *SlidingLog) decide(t int64, l Limit, n int64, first int, hits int64) Decision {
	period := time.Duration(l.Period)
	d := Decision{Remaining: max(l.Count-hits, 0)}
	if hits > 0 {
		d.ResetAfter = time.Duration(s.at(s.n-1).ts-t) + period
	}
	switch {
	case n > l.Count:
		d.RetryAfter = Never
	case n > l.Count-hits:
		// Wait until the oldest entries holding the excess have left.
		excess := hits + n - l.Count
		i := first
		for ; excess > s.at(i).count; i++ {
			excess -= s.at(i).count
		}
		d.RetryAfter = time.Duration(s.at(i).ts-t) + period
	default:
		d.Allowed = true
		d.Remaining -= n
		if n > 0 {
			d.ResetAfter = period
			if hits > 0 {
				d.ResetAfter = max(d.ResetAfter, time.Duration(s.at(s.n-1).ts-t)+period)
			}
		}
	}
	return d
}

// at returns the i-th entry, oldest first.
func (s *SlidingLog) at(i int) logEntry {
	return s.ring[s.index(i)]
}

// index returns the ring index of the i-th entry, 0 <= i <= len(s.ring).
// It wraps by subtraction: a % here would cost a division per access.
func (s *SlidingLog) index(i int) int {
	j := s.head + i
	if j >= len(s.ring) {
		j -= len(s.ring)
	}
	return j
}

// push appends count hits at ts. A ts not after the newest entry's (a clock
// that went back, or the same instant) is added to that entry, which keeps
// the log in order and those hits in the window no shorter. The ring grows
// by doubling, but not past want entries unless it must.
func (s *SlidingLog) push(ts, count, want int64) {
	if s.n > 0 {
		last := &s.ring[s.index(s.n-1)]
		if ts <= last.ts {
			last.count += count
			s.hits += count
			return
		}
	}
	if s.n == len(s.ring) {
		size := max(min(2*len(s.ring), int(want)), s.n+1, 4)
		ring := make([]logEntry, size)
		for i := range s.n {
			ring[i] = s.at(i)
		}
		s.ring, s.head = ring, 0
	}
	s.ring[s.index(s.n)] = logEntry{ts, count}
	s.n++
	s.hits += count
}

// Entries yields the log's (Unix ns, hits) entries, oldest first, for
// serialisation. It may include entries that have left the window but
// have not yet been dropped by a Take.
func (s *SlidingLog) Entries() iter.Seq2[int64, int64] {
	return func(yield func(ts, count int64) bool) {
		for i := range s.n {
			if e := s.at(i); !yield(e.ts, e.count) {
				return
			}
		}
	}
}

// Append adds count hits at Unix ns ts to the end of the log, to rebuild
// one from Entries. Entries must come oldest first: a ts before the newest
// entry's is counted at that entry's time. A count <= 0 is ignored.
func (s *SlidingLog) Append(ts, count int64) {
	if count > 0 {
		s.push(ts, count, math.MaxInt)
	}
}

// Cap returns the entries s has memory for, 16 bytes each: at most
// MaxSlidingLogLimit after a Take, up to twice that after a Merge.
func (s *SlidingLog) Cap() int { return len(s.ring) }

// Clone returns a copy of s that shares no memory with it.
func (s *SlidingLog) Clone() SlidingLog {
	c := SlidingLog{ring: make([]logEntry, s.n), n: s.n, hits: s.hits}
	for i := range s.n {
		c.ring[i] = s.at(i)
	}
	return c
}

// Merge makes s the more charged of s and o at every instant: after it,
// the hits s holds in any window (x, now] are the larger of those s and o
// held, so a log arriving from another node never uncounts hits, and hits
// both logs saw are not counted twice. It allocates a new ring and leaves
// o's untouched.
func (s *SlidingLog) Merge(o SlidingLog) {
	merged := make([]logEntry, s.n+o.n)
	// Walk both logs newest first, keeping each one's hits at or after the
	// current instant; the merged log holds the larger of the two there.
	i, j, k := s.n-1, o.n-1, len(merged)
	var sa, sb, kept int64
	for i >= 0 || j >= 0 {
		ts := int64(0)
		switch {
		case j < 0 || i >= 0 && s.at(i).ts >= o.at(j).ts:
			ts = s.at(i).ts
		default:
			ts = o.at(j).ts
		}
		for ; i >= 0 && s.at(i).ts == ts; i-- {
			sa += s.at(i).count
		}
		for ; j >= 0 && o.at(j).ts == ts; j-- {
			sb += o.at(j).count
		}
		if m := max(sa, sb); m > kept {
			k--
			merged[k] = logEntry{ts, m - kept}
			kept = m
		}
	}
	*s = SlidingLog{ring: merged[k:], n: len(merged) - k, hits: kept}
}
