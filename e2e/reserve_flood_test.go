package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// reservationFlood sends requests POST /v1/check to n from the source
// address from, each of 1,000 one-hit reservations of fresh keys made
// from prefix (limit 10^9), for ttlMs, naming policy if not empty, from 4
// connections, and returns how many items reserved and the error of one
// item that did not.
func reservationFlood(t *testing.T, n *node, from, prefix, policy string, requests int, ttlMs int64) (reserved int64, refusal string) {
	t.Helper()
	type item struct {
		Name         string `json:"name"`
		Key          string `json:"key"`
		Limit        int64  `json:"limit,omitempty"`
		DurationMs   int64  `json:"duration_ms,omitempty"`
		Policy       string `json:"policy,omitempty"`
		ReserveTtlMs int64  `json:"reserve_ttl_ms"`
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext, MaxConnsPerHost: 4}}
	defer client.CloseIdleConnections()
	var next, got atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 4 {
		wg.Go(func() {
			for {
				r := next.Add(1) - 1
				if r >= int64(requests) {
					return
				}
				var req struct {
					Requests []item `json:"requests"`
				}
				for i := range 1000 {
					it := item{Name: "tokens", Key: fmt.Sprintf("%s%d:%d", prefix, r, i), Policy: policy, ReserveTtlMs: ttlMs}
					if policy == "" {
						it.Limit, it.DurationMs = 1_000_000_000, 60_000
					}
					req.Requests = append(req.Requests, it)
				}
				body, _ := json.Marshal(req)
				resp, err := client.Post("http://"+n.http+"/v1/check", "application/json", bytes.NewReader(body))
				if err != nil {
					once.Do(func() { t.Errorf("a flood request: %v", err) })
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var out struct {
					Responses []struct {
						ReservationID string `json:"reservation_id"`
						Error         string `json:"error"`
					} `json:"responses"`
				}
				if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
					once.Do(func() { t.Errorf("a flood request: %d %s", resp.StatusCode, b) })
					return
				}
				for _, res := range out.Responses {
					if res.ReservationID != "" {
						got.Add(1)
					} else {
						mu.Lock()
						refusal = res.Error
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	return got.Load(), refusal
}

// TestReservationFloodLeavesOthersRoom is issue 33's reservation flood
// against a 3-node cluster over HTTP: 360 requests from one address, each
// of 1,000 one-hit reservations of fresh keys with reserve_ttl_ms
// 86,400,000 (limit 10^9). On main they filled --max-reservations on
// every owner in seconds, and every other client's reservation was
// refused "too many reservations" for a day. Now a day's reservation
// needs a policy that allows it, so the flood as sent reserves nothing;
// sent again naming such a policy, one client (an address range) reserves
// at most --max-reservations-per-client through the node it reaches; and
// either way a client from another range still reserves.
func TestReservationFloodLeavesOthersRoom(t *testing.T) {
	const perClient = 10_000 // limiter.DefaultMaxReservationsPerClient
	dir := t.TempDir()
	path := filepath.Join(dir, "llm.yaml")
	yaml := "domain: llm\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: minute, requests_per_unit: 1000000000, algorithm: TOKEN_BUCKET, reserve_ttl_ms: 86400000}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, 3, "--policy-file", path)
	n := c.nodes[0]

	start := time.Now()
	reserved, refusal := reservationFlood(t, n, "127.0.0.1", "flood:", "", 360, 86_400_000)
	t.Logf("the flood as sent: %d of 360,000 reserved in %v; refused with %q", reserved, time.Since(start).Round(time.Millisecond), refusal)
	if reserved != 0 || !strings.Contains(refusal, "reserve_ttl_ms") {
		t.Errorf("a day's reservations without a policy: %d reserved, refused with %q; want none, naming reserve_ttl_ms", reserved, refusal)
	}

	start = time.Now()
	reserved, refusal = reservationFlood(t, n, "127.0.0.1", "policy:", "llm/tokens", 360, 86_400_000)
	t.Logf("the flood under a day's policy: %d of 360,000 reserved in %v; refused with %q", reserved, time.Since(start).Round(time.Millisecond), refusal)
	if reserved > perClient || !strings.Contains(refusal, "--max-reservations-per-client") {
		t.Errorf("one client reserved %d (want at most %d), refused with %q (want the per-client bound named)", reserved, perClient, refusal)
	}

	for _, other := range c.nodes {
		got, refusal := reservationFlood(t, other, "127.0.1.1", "other:"+other.name+":", "", 1, 60_000)
		if got != 1000 {
			t.Errorf("another client (127.0.1.0/24) through %s: %d of 1,000 reserved, refused with %q", other.name, got, refusal)
		}
	}
}
