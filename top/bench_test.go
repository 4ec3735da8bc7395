package top

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkRecord is the cost a check pays on its owner: compare it with
// a check's (service's BenchmarkCheck, limiter's BenchmarkDecide).
func BenchmarkRecord(b *testing.B) {
	for _, distinct := range []int{16, 100000} {
		b.Run(fmt.Sprint("keys=", distinct), func(b *testing.B) {
			tr := New(Config{}, time.Unix(0, 0))
			keys := make([]string, distinct)
			for i := range keys {
				keys[i] = fmt.Sprintf("user:%d", i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tr.Record("api_requests", keys[i%distinct], i%8 != 0)
				i++
			}
		})
	}
}

func BenchmarkRecordParallel(b *testing.B) {
	tr := New(Config{}, time.Unix(0, 0))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tr.Record("api_requests", "user:42", i%8 != 0)
			i++
		}
	})
}
