package snapshot

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/latency"
	"github.com/ringlimit/ringlimit/limiter"
)

// fullStore returns a store of keys token buckets, each charged one hit
// of 1000 an hour at now, and their keys.
func fullStore(keys int, now time.Time) (*limiter.Store, []string, algorithms.Limit) {
	store := limiter.New(limiter.Config{MaxKeys: keys})
	names := make([]string, keys)
	l := algorithms.Limit{Count: 1000, Period: time.Hour} // charged, so every counter is written
	for i := range names {
		names[i] = fmt.Sprintf("user:%015d", i) // ~20-byte keys, as the store's benchmarks
		r := limiter.Request{Name: "api", Key: names[i], Hits: 1, Now: now, Limit: l}
		store.Decide(&r)
	}
	return store, names, l
}

// BenchmarkLoad measures how long a node takes to load a snapshot of
// 1,000,000 counters at start (both passes, every counter validated and
// merged into an empty store), before it serves.
func BenchmarkLoad(b *testing.B) {
	const keys = 1_000_000
	now := time.Now()
	store, _, _ := fullStore(keys, now)
	dir := b.TempDir()
	d, err := Open(Config{Dir: dir, Node: "bench", Store: store})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Write(context.Background()); err != nil {
		b.Fatal(err)
	}
	store = nil
	runtime.GC()
	for b.Loop() {
		into := limiter.New(limiter.Config{MaxKeys: keys})
		d, err := Open(Config{Dir: dir, Node: "bench", Store: into})
		if err != nil {
			b.Fatal(err)
		}
		if n := d.Load(context.Background(), intake); n != keys {
			b.Fatalf("loaded %d counters, want %d", n, keys)
		}
	}
}

// BenchmarkChecksDuringSnapshot measures what writing a snapshot of
// 1,000,000 counters costs the checks decided meanwhile: workers decide
// checks on random keys of the store while a snapshot is written, then for
// as long again while none is, and the benchmark reports the p99, p99.9
// and longest check of each span, the p99 ratio, the write's time and the
// bytes a counter takes on disk. Each iteration is one snapshot; run it
// with -benchtime 3x or so. "all-cores" runs a worker per core, so that
// the snapshot competes for CPU with checks that use all of it; "spare-core"
// leaves it one core, which tells what is left of the cost when it does
// not: the lock held while a shard is copied.
func BenchmarkChecksDuringSnapshot(b *testing.B) {
	store, names, l := fullStore(1_000_000, time.Now())
	d, err := Open(Config{Dir: b.TempDir(), Node: "bench", Store: store})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name    string
		workers int
	}{{"all-cores", runtime.GOMAXPROCS(0)}, {"spare-core", max(1, runtime.GOMAXPROCS(0)-1)}} {
		b.Run(bc.name, func(b *testing.B) {
			runtime.GC() // so that setup's garbage is not collected on the clock
			var during, idle latency.Histogram
			var wrote time.Duration
			for b.Loop() {
				start := time.Now()
				during.Merge(checksWhile(store, names, l, bc.workers, func() {
					if err := d.Write(context.Background()); err != nil {
						b.Fatal(err)
					}
				}))
				took := time.Since(start)
				wrote += took
				idle.Merge(checksWhile(store, names, l, bc.workers, func() { time.Sleep(took) })) // the same span, no snapshot
			}
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			b.ReportMetric(us(idle.Quantile(0.99)), "p99-idle-µs")
			b.ReportMetric(us(during.Quantile(0.99)), "p99-snapshot-µs")
			b.ReportMetric(float64(during.Quantile(0.99))/float64(idle.Quantile(0.99)), "p99-ratio")
			b.ReportMetric(us(idle.Quantile(0.999)), "p99.9-idle-µs")
			b.ReportMetric(us(during.Quantile(0.999)), "p99.9-snapshot-µs")
			b.ReportMetric(us(idle.Max()), "max-idle-µs")
			b.ReportMetric(us(during.Max()), "max-snapshot-µs")
			b.ReportMetric(wrote.Seconds()/float64(b.N), "write-s")
			b.ReportMetric(testutil.ToFloat64(d.metrics.bytes)/testutil.ToFloat64(d.metrics.written), "bytes/counter")
		})
	}
}

// checksWhile decides checks of one hit on random keys of store, from
// workers goroutines, until work returns, and returns their latencies.
func checksWhile(store *limiter.Store, names []string, l algorithms.Limit, workers int, work func()) *latency.Histogram {
	var stop atomic.Bool
	var mu sync.Mutex
	var all latency.Histogram
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var h latency.Histogram
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			r := limiter.Request{Name: "api", Hits: 1, Limit: l}
			for !stop.Load() {
				r.Key = names[rng.IntN(len(names))]
				start := time.Now()
				r.Now = start
				store.Decide(&r)
				h.Record(time.Since(start))
			}
			mu.Lock()
			all.Merge(&h)
			mu.Unlock()
		})
	}
	work()
	stop.Store(true)
	wg.Wait()
	return &all
}
