package limiter

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

const benchKeys = 1_000_000

// benchKeyNames are ~20-byte keys, as the memory target assumes.
func benchKeyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%015d", i)
	}
	return keys
}

// BenchmarkStore measures decisions/s over a million token-bucket keys
// from all cores.
func BenchmarkStore(b *testing.B) { benchStore(b, false) }

// BenchmarkStoreStandIn is BenchmarkStore with every check a stand-in's
// (Request.StandIn: the keys of a member gone from the ring, or of an
// owner that cannot be reached), each admitted hit counted apart too.
func BenchmarkStoreStandIn(b *testing.B) { benchStore(b, true) }

func benchStore(b *testing.B, standIn bool) {
	keys := benchKeyNames(benchKeys)
	s := New(Config{MaxKeys: benchKeys})
	l := algorithms.Limit{Count: 1000, Period: time.Second}
	for _, k := range keys {
		s.Decide(&Request{Name: "api", Key: k, Hits: 1, Now: t0, Limit: l, StandIn: standIn})
	}
	var next atomic.Uint64
	runtime.GC() // so that setup's garbage is not collected on the clock
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(7919) * 104729
		r := Request{Name: "api", Hits: 1, Now: t0, Limit: l, StandIn: standIn}
		for pb.Next() {
			i++
			r.Key = keys[i%benchKeys]
			s.Decide(&r)
		}
	})
}

// mutexMap is the baseline: one lock, one Go map, the same algorithm.
type mutexMap struct {
	mu sync.Mutex
	m  map[string]*algorithms.TokenBucket
}

// BenchmarkMutexMapBaseline is BenchmarkStore's workload on a single
// sync.Mutex and map.
func BenchmarkMutexMapBaseline(b *testing.B) {
	keys := benchKeyNames(benchKeys)
	mm := mutexMap{m: make(map[string]*algorithms.TokenBucket, benchKeys)}
	l := algorithms.Limit{Count: 1000, Period: time.Second}
	for _, k := range keys {
		tb := new(algorithms.TokenBucket)
		tb.Take(t0, l, 1)
		mm.m["api\x00"+k] = tb
	}
	var next atomic.Uint64
	runtime.GC() // so that setup's garbage is not collected on the clock
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(7919) * 104729
		buf := make([]byte, 0, 64)
		for pb.Next() {
			i++
			buf = append(append(buf[:0], "api\x00"...), keys[i%benchKeys]...)
			mm.mu.Lock()
			tb := mm.m[string(buf)]
			tb.Take(t0, l, 1)
			mm.mu.Unlock()
		}
	})
}

// BenchmarkMemoryPerKey reports the heap cost of a token-bucket counter
// with a ~20-byte key, as the metric bytes/key (its ns/op is the cost of
// filling a store with a million counters), all under one limit.
func BenchmarkMemoryPerKey(b *testing.B) {
	l := algorithms.Limit{Count: 1000, Period: time.Hour}
	memoryPerKey(b, func(int) algorithms.Limit { return l })
}

// BenchmarkMemoryPerKeyOwnLimit is BenchmarkMemoryPerKey with every
// counter under a limit of its own, so each interns one: the most a
// counter costs (see limits).
func BenchmarkMemoryPerKeyOwnLimit(b *testing.B) {
	memoryPerKey(b, func(i int) algorithms.Limit { return algorithms.Limit{Count: int64(1000 + i), Period: time.Hour} })
}

// BenchmarkMemoryPerKeyStandIn is BenchmarkMemoryPerKey with every
// counter charged by a stand-in, so each has its count of stand-in hits
// beside it: what the keys of a member gone from the ring cost.
func BenchmarkMemoryPerKeyStandIn(b *testing.B) {
	l := algorithms.Limit{Count: 1000, Period: time.Hour}
	memoryPerKeyOf(b, func(int) algorithms.Limit { return l }, true)
}

// memoryPerKey fills a store with a million token buckets, counter i
// under limit(i), and reports the heap they take as bytes/key.
func memoryPerKey(b *testing.B, limit func(i int) algorithms.Limit) { memoryPerKeyOf(b, limit, false) }

// memoryPerKeyOf is memoryPerKey with the checks a stand-in's or not.
func memoryPerKeyOf(b *testing.B, limit func(i int) algorithms.Limit, standIn bool) {
	keys := benchKeyNames(benchKeys)
	var perKey float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := New(Config{MaxKeys: benchKeys})
		for i, k := range keys {
			s.Decide(&Request{Name: "api", Key: k, Hits: 1, Now: t0, Limit: limit(i), StandIn: standIn})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if s.Len() != benchKeys {
			b.Fatalf("store holds %d counters, want %d", s.Len(), benchKeys)
		}
		perKey = float64(after.HeapAlloc-before.HeapAlloc) / benchKeys
		runtime.KeepAlive(s)
	}
	b.ReportMetric(perKey, "bytes/key")
}

// BenchmarkDecideSpaced is the cost of a MinInterval: one key's token
// bucket decided alone, and with its spacing, all or nothing.
func BenchmarkDecideSpaced(b *testing.B) {
	for _, interval := range []time.Duration{0, time.Nanosecond} {
		b.Run(fmt.Sprint("min_interval=", interval), func(b *testing.B) {
			s := New(Config{})
			r := Request{Name: "api", Key: "user:000000000000042", Hits: 1, Now: t0,
				Limit: algorithms.Limit{Count: 1_000_000_000, Period: time.Second}, MinInterval: interval}
			b.ReportAllocs()
			for b.Loop() {
				r.Now = r.Now.Add(time.Microsecond) // every request admitted
				s.Decide(&r)
			}
		})
	}
}

// BenchmarkStoreFlood measures a check of a new key in a store that holds
// MaxKeys counters, every one still owing (a key flood, issue 33): each
// evicts the least recently used and keeps its debt (debts.go). /restore
// checks keys whose counters were evicted so, each restored from its debt.
func BenchmarkStoreFlood(b *testing.B) {
	const maxKeys = 100_000
	l := algorithms.Limit{Count: 1, Period: time.Hour}
	for _, restore := range []bool{false, true} {
		name := "new"
		if restore {
			name = "restore"
		}
		b.Run(name, func(b *testing.B) {
			s := New(Config{MaxKeys: maxKeys})
			keys := benchKeyNames(4 * maxKeys)
			for _, k := range keys[:maxKeys] {
				s.Decide(&Request{Name: "api", Key: k, Hits: 1, Now: t0, Limit: l})
			}
			runtime.GC()
			b.ReportAllocs()
			r := Request{Name: "api", Hits: 1, Now: t0.Add(time.Second), Limit: l}
			i := maxKeys
			if restore {
				i = 0
			}
			for b.Loop() {
				r.Key = keys[i%len(keys)]
				i++
				s.Decide(&r)
			}
		})
	}
}

// BenchmarkMemoryPerReservation reports the heap 100,000 reservations of
// distinct keys take beyond their counters, as bytes/reservation: what
// ReservationMemory accounts one at.
func BenchmarkMemoryPerReservation(b *testing.B) {
	const n = 100_000
	keys := benchKeyNames(n)
	l := algorithms.Limit{Count: 1000, Period: time.Hour}
	var per float64
	for b.Loop() {
		s := New(Config{MaxKeys: n, MaxReservations: n})
		for _, k := range keys {
			s.Decide(&Request{Name: "api", Key: k, Hits: 1, Now: t0, Limit: l})
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, k := range keys {
			if _, _, err := s.Reserve(&Request{Name: "api", Key: k, Hits: 1, Now: t0, Limit: l}, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(per, "bytes/reservation")
}
