package latency

import (
	"math"
	"math/bits"
	"time"
)

// Histogram counts durations in log-linear buckets, as HdrHistogram does:
// values below 2^subBits ns have a bucket each; above, each power of two
// is split into 2^(subBits-1) buckets, so a quantile is off by under 1/64
// of its value. Memory is fixed (about 29 KiB) however many values it
// holds. The zero value is empty. A Histogram is not safe for concurrent
// use: give each worker its own and Merge them.
type Histogram struct {
	counts [buckets]int64
	n      int64
	max    time.Duration
}

const (
	subBits = 7 // 2^7 = 128: exact below 128ns, 64 buckets per doubling above
	halfSub = 1 << (subBits - 1)
	buckets = (64-subBits+1)*halfSub + halfSub
)

func bucketOf(v uint64) int {
	if v < 1<<subBits {
		return int(v)
	}
	shift := bits.Len64(v) - subBits // v>>shift is in [64, 128)
	return (shift+1)*halfSub + int(v>>shift) - halfSub
}

// bucketTop is the largest value that falls in bucket i.
func bucketTop(i int) uint64 {
	if i < 1<<subBits {
		return uint64(i)
	}
	shift := i/halfSub - 1
	sub := uint64(i%halfSub + halfSub)
	return (sub+1)<<shift - 1
}

// Record adds d; a negative d counts as 0.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.counts[bucketOf(uint64(d))]++
	h.n++
	h.max = max(h.max, d)
}

// Merge adds every value of o to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Count is the number of values recorded.
func (h *Histogram) Count() int64 { return h.n }

// Max is the largest value recorded, exactly; 0 when empty.
func (h *Histogram) Max() time.Duration { return h.max }

// Quantile returns an upper bound, within 1/64, of the value at or below
// which a fraction q of the recorded values fall (the value of rank
// ceil(q·n), at least 1), never more than the maximum; 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(bucketTop(i)), h.max)
		}
	}
	return h.max
}
