package resp

import (
	"bufio"
	"bytes"
	"fmt"
	"testing"

	"github.com/ringlimit/ringlimit/service"
)

// BenchmarkThrottle sends CL.THROTTLE over loopback to a server deciding
// with a single-node service, one command a round trip and in pipelines
// of 16, and reports the server and client allocations together.
func BenchmarkThrottle(b *testing.B) {
	for _, depth := range []int{1, 16} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			s := New(Config{Checker: service.New(service.Config{})})
			lis := listen(b)
			go s.Serve(lis)
			b.Cleanup(func() { s.Shutdown(b.Context()) })
			conn := dial(b, lis.Addr().String())
			var pipeline []byte
			for i := range depth {
				pipeline = append(pipeline, encode("CL.THROTTLE", fmt.Sprint("bench:", i), "999999", "1000000", "1")...)
			}
			br := bufio.NewReader(conn)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := conn.Write(pipeline); err != nil {
					b.Fatal(err)
				}
				for range depth {
					for range 6 { // the array header and its five integers
						line, err := br.ReadSlice('\n')
						if err != nil || bytes.HasPrefix(line, []byte("-")) {
							b.Fatalf("%q, %v", line, err)
						}
					}
				}
			}
			b.ReportMetric(float64(b.N*depth)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}
