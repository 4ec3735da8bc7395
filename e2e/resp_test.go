package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/resp"
)

// startRESPCluster starts n nodes, each with a RESP port, and returns
// them with those ports, by node name.
func startRESPCluster(t testing.TB, n int) (*testCluster, func(*node) string) {
	t.Helper()
	var mu sync.Mutex
	addrs := map[string]string{}
	c := startClusterWith(t, n, func(name string) []string {
		addr := loopback(freePorts(t, 1)[0])
		mu.Lock()
		addrs[name] = addr // a retried start gets new ports: the last is the one in use
		mu.Unlock()
		return []string{"--resp-addr", addr}
	})
	return c, func(n *node) string {
		mu.Lock()
		defer mu.Unlock()
		return addrs[n.name]
	}
}

func respClient(t testing.TB, addr string, protocol int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: protocol, PoolSize: 16, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRESPClients checks a counter through a real rlnode's RESP port with
// go-redis (RESP2 and RESP3) and redis-cli, and through the native gRPC
// API, alternately: one counter, whichever way it is checked, with
// redis-cell's answers.
func TestRESPClients(t *testing.T) {
	c, respAddr := startRESPCluster(t, 1)
	n := c.nodes[0]
	ctx := context.Background()
	rdb2, rdb3 := respClient(t, respAddr(n), 2), respClient(t, respAddr(n), 3)

	// redis-cell's README: a fresh key, 30 a minute with a burst of 15.
	got, err := rdb3.Do(ctx, "CL.THROTTLE", "user123", 15, 30, 60).Int64Slice()
	if err != nil || fmt.Sprint(got) != "[0 16 15 -1 2]" {
		t.Fatalf("CL.THROTTLE user123 15 30 60 = %v, %v; want [0 16 15 -1 2]", got, err)
	}

	// The mapping of docs/resp.md: CL.THROTTLE k 4 10 3600 is this check.
	native := &pb.CheckItem{Name: resp.Name, Key: "both", Algorithm: pb.Algorithm_GCRA, Limit: 10, DurationMs: 3_600_000, Burst: 5}
	cli, cliErr := exec.LookPath("redis-cli")
	if cliErr != nil {
		t.Log("redis-cli is not installed (apt-get install redis-tools): its step is skipped")
	}
	host, port, _ := strings.Cut(respAddr(n), ":")
	made := 0 // checks made: the redis-cli way is skipped where it is not installed
	for i := range 7 {
		var remaining int64
		var limited bool
		switch i % 4 {
		case 0:
			v, err := rdb2.Do(ctx, "CL.THROTTLE", "both", 4, 10, 3600).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			remaining, limited = v[2], v[0] == 1
		case 1:
			v, err := rdb3.Do(ctx, "cl.throttle", "both", 4, 10, 3600, 1).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			remaining, limited = v[2], v[0] == 1
		case 2:
			r, err := check(n, native)
			if err != nil {
				t.Fatal(err)
			}
			remaining, limited = r.Remaining, r.Status == pb.Status_OVER_LIMIT
		case 3:
			if cli == "" {
				continue
			}
			out, err := exec.Command(cli, "-h", host, "-p", port, "CL.THROTTLE", "both", "4", "10", "3600", "1").CombinedOutput()
			if err != nil {
				t.Fatalf("redis-cli: %v\n%s", err, out)
			}
			f := strings.Fields(string(out))
			if len(f) != 5 {
				t.Fatalf("redis-cli printed %q, want five integers", out)
			}
			fmt.Sscan(f[2], &remaining)
			limited = f[0] == "1"
		}
		want := max(int64(4-made), 0)
		if made >= 5 != limited || remaining != want {
			t.Errorf("check %d (way %d): remaining %d limited %v, want %d %v", made, i%4, remaining, limited, want, made >= 5)
		}
		made++
	}
	if cli != "" {
		// redis-cli's own start-up (COMMAND DOCS for its hints) and a PING.
		out, err := exec.Command(cli, "-h", host, "-p", port, "PING").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "PONG" {
			t.Errorf("redis-cli PING: %q, %v", out, err)
		}
		out, _ = exec.Command(cli, "-h", host, "-p", port, "MULTI").CombinedOutput()
		if !strings.Contains(string(out), "MULTI is not supported") {
			t.Errorf("redis-cli MULTI: %q, want the error naming it", out)
		}
	}
}

// TestRESPClusterExact spends keys from 3 nodes' RESP ports at once,
// pipelined and not: whichever node a command arrives at, each key's one
// counter on its owner admits exactly its limit.
func TestRESPClusterExact(t *testing.T) {
	c, respAddr := startRESPCluster(t, 3)
	const keys, limit, perKey = 8, 50, 120 // 120 tries of each key for 50 admits
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 12 {
		rdb := respClient(t, respAddr(c.nodes[w%3]), 2+w%2)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// Each worker tries every key perKey/12 times, half of them in
			// pipelines of 5.
			for round := range perKey / 12 {
				pipe := rdb.Pipeline()
				var cmds []*redis.Cmd
				for k := range keys {
					cmds = append(cmds, pipe.Do(ctx, "CL.THROTTLE", fmt.Sprint("exact:", k), limit-1, limit, 3600))
					if round%2 == 0 || len(cmds)%5 == 0 {
						if _, err := pipe.Exec(ctx); err != nil {
							errs <- err
							return
						}
					}
				}
				pipe.Exec(ctx)
				for k, cmd := range cmds {
					v, err := cmd.Int64Slice()
					if err != nil {
						errs <- err
						return
					}
					if v[0] == 0 {
						admitted[k].Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keys {
		if got := admitted[k].Load(); got != limit {
			t.Errorf("key exact:%d: %d admitted across the cluster, want exactly %d", k, got, limit)
		}
	}
}

// TestGoClientThroughRESPExact: the Go client of three real nodes with
// RESP ports, routing each check to its key's owner, sends its checks as
// RL.CHECK once the nodes' streams name the ports; from many goroutines
// at once, the cluster admits exactly the limit of each key.
func TestGoClientThroughRESPExact(t *testing.T) {
	c, _ := startRESPCluster(t, 3)
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.grpc
	}
	cl, err := client.Open(addrs)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const keys, limit, tries = 8, 50, 120
	l := client.Limit{Name: "exact-go", Count: limit, Period: time.Hour}
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 12 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for i := range tries * keys / 12 {
				k := (w + i) % keys
				ok, err := cl.Allow(ctx, l, fmt.Sprint("exact-go:", k))
				if err != nil {
					errs <- err
					return
				}
				if ok {
					admitted[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keys {
		if got := admitted[k].Load(); got != limit {
			t.Errorf("key exact-go:%d: %d admitted across the cluster, want exactly %d", k, got, limit)
		}
	}
	came := 0.0
	for _, n := range c.nodes {
		v, err := metric(n, "ringlimit_check_duration_seconds_count", `interface="resp_check"`)
		if err != nil {
			t.Fatal(err)
		}
		came += v
	}
	if came == 0 {
		t.Error("no check came as RL.CHECK")
	}
}
