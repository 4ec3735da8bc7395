package algorithms_test

import (
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ringlimit/ringlimit/algorithms"
)

// BenchmarkTake measures one decision per algorithm at a steady 1000/s
// limit hit every millisecond (so the sliding log holds a full window of
// 1000 entries), against x/time/rate's AllowN as a baseline.
func BenchmarkTake(b *testing.B) {
	l := algorithms.Limit{Count: 1000, Period: time.Second}
	for _, k := range kinds() {
		b.Run(k.name, func(b *testing.B) {
			c, now := k.new(), t0
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Millisecond)
				c.Take(now, l, 1)
			}
		})
	}
	b.Run("x-time-rate", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1000), 1000)
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Millisecond)
			lim.AllowN(now, 1)
		}
	})
}
