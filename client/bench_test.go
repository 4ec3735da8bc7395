package client_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/service"
)

// benchAllow runs b.N Allow calls from callers concurrent goroutines (1:
// one after another), each on a key of its own among 10,000.
func benchAllow(b *testing.B, c *client.Client, callers int) {
	l := client.Limit{Name: "bench", Count: 1_000_000_000, Period: time.Second}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("user:", i)
	}
	b.ReportAllocs()
	if callers == 1 {
		i := 0
		for b.Loop() {
			i++
			if ok, err := c.Allow(context.Background(), l, keys[i%len(keys)]); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
		return
	}
	b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if ok, err := c.Allow(context.Background(), l, keys[i%len(keys)]); !ok || err != nil {
				b.Error(ok, err)
				return
			}
		}
	})
}

// BenchmarkAllow measures the client's hot path against one node on
// loopback, the node sharing this process and its cores: Allow one call
// after another (batching cannot help, and must not cost), and from 4, 16
// and 64 concurrent callers (few, and more), batched and not.
func BenchmarkAllow(b *testing.B) {
	addr := client.ServeForTest(b)
	for _, callers := range []int{1, 4, 16, 64} {
		for _, batched := range []bool{true, false} {
			name := fmt.Sprintf("callers=%d/batched=%v", callers, batched)
			b.Run(name, func(b *testing.B) {
				var opts []client.Option
				if !batched {
					opts = append(opts, client.WithoutBatching())
				}
				c, err := client.Open([]string{addr}, opts...)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				benchAllow(b, c, callers)
			})
		}
	}
}

// BenchmarkAllowPorts measures the batching client's Allow against one
// node on loopback whose checks travel on its gRPC stream (a node
// without a RESP port) or as RL.CHECK on its RESP port, from 1, 4, 16
// and 64 concurrent callers.
func BenchmarkAllowPorts(b *testing.B) {
	nodes := map[string]string{"stream": client.ServeForTest(b), "resp": client.ServeRESPForTest(b)}
	for _, callers := range []int{1, 4, 16, 64} {
		for _, port := range []string{"stream", "resp"} {
			b.Run(fmt.Sprintf("callers=%d/port=%s", callers, port), func(b *testing.B) {
				c, err := client.New(nodes[port])
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				warm(b, c)
				benchAllow(b, c, callers)
			})
		}
	}
}

// warm makes checks until c has sent its first ones, connected and
// learned the RESP port: 200 ms of checks, unmeasured.
func warm(b *testing.B, c *client.Client) {
	l := client.Limit{Name: "warm", Count: 1_000_000_000, Period: time.Second}
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		if _, err := c.Allow(context.Background(), l, "k"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllowRouted measures a routing client of three nodes on
// loopback (which never forward: see staticCluster), from 64 concurrent
// callers: each Allow goes, batched, to its key's owner.
func BenchmarkAllowRouted(b *testing.B) {
	sc := newStaticCluster(b, 3)
	c := sc.routingClient(b)
	sc.unrecorded.Store(true)
	benchAllow(b, c, 64)
}

// BenchmarkLeasedAllow measures a leased Allow on one hot key, decided in
// the process from the grant, at 1 and 50 concurrent callers, and, in the
// same run, golang.org/x/time/rate's Allow on one Limiter (a limiter of
// one process, with no cluster behind it) as the baseline. The owner is
// a service in this process (Wrap), so the rounds' reports cost no
// network; its limit is far above the load, so every check is admitted.
func BenchmarkLeasedAllow(b *testing.B) {
	for _, callers := range []int{1, 50} {
		b.Run(fmt.Sprintf("lease/callers=%d", callers), func(b *testing.B) {
			c := client.Wrap(service.New(service.Config{}))
			defer c.Close()
			l := client.Limit{Name: "bench", Count: 1_000_000_000, Period: time.Second, Lease: true}
			for range 100_000 { // a round's demand, so that the grant covers the run's
				c.Allow(context.Background(), l, "hot")
			}
			time.Sleep(2 * client.DefaultLeaseInterval)
			parallel(b, callers, func() bool {
				ok, err := c.Allow(context.Background(), l, "hot")
				return ok && err == nil
			})
		})
		b.Run(fmt.Sprintf("x-time-rate/callers=%d", callers), func(b *testing.B) {
			lim := rate.NewLimiter(rate.Limit(1_000_000_000), 1_000_000_000)
			parallel(b, callers, lim.Allow)
		})
	}
}

// parallel runs b.N calls of allow from callers goroutines (1: one after
// another), and fails if one is refused.
func parallel(b *testing.B, callers int, allow func() bool) {
	b.ReportAllocs()
	if callers == 1 {
		for b.Loop() {
			if !allow() {
				b.Fatal("refused")
			}
		}
		return
	}
	b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !allow() {
				b.Error("refused")
				return
			}
		}
	})
}
