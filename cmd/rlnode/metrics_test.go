package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// TestMetricsAreExported runs forwarded, GLOBAL and invalid checks through
// a 3-node cluster and checks that node 0's /metrics has every metric the
// issues name, with values where the traffic fixes them.
func TestMetricsAreExported(t *testing.T) {
	c := startCluster(t, 3, "--global-sync", "20ms")
	ctx := context.Background()
	keys := c.keysNotOwnedBy(0, 5)
	for _, key := range keys {
		for _, b := range []pb.Behavior{pb.Behavior_BATCHED, pb.Behavior_GLOBAL} {
			c.clients[0].Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "m", Key: key, Limit: 10, DurationMs: 60_000, Behavior: b}}})
		}
	}
	c.clients[0].Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "m", Key: "", Limit: 10, DurationMs: 60_000}}})

	want := []string{
		`ringlimit_forwarded_checks_total{behavior="BATCHED"} 5`,
		`ringlimit_checks_total{algorithm="TOKEN_BUCKET",behavior="BATCHED",route="local",status="UNDER_LIMIT"} 0`,
		`ringlimit_invalid_items_total{field="key"} 1`,
		`ringlimit_check_duration_seconds_bucket{interface="grpc"`,
		`ringlimit_counters `,
		`ringlimit_counters_evicted_total 0`,
		`ringlimit_cluster_members 3`,
		`ringlimit_ring_rebuilds_total`,
		`ringlimit_peer_batch_size_count`,
		`ringlimit_peer_forward_duration_seconds_bucket{mode="batched"`,
		`ringlimit_forward_fallbacks_total 0`,
		`ringlimit_handoff_counters_total`,
		`ringlimit_global_sync_seconds_count`,
		`ringlimit_peer_refused_total{reason="not_member"} 0`,
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + c.nodes[0].HTTPAddr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var missing []string
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q", missing)
		}
		time.Sleep(50 * time.Millisecond) // polling: a GLOBAL round must pass
	}
}
