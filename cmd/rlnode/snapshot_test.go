package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/snapshot"
)

// metricValue reads one series from a node's /metrics; a series it does
// not export reads as an error.
func metricValue(httpAddr, series string) (float64, error) {
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s: no series %s", httpAddr, series)
}

// TestLoadedCountersGoToTheirOwners: a node that starts from its snapshot
// alone owns every key; when another node joins, the loaded counters of
// the keys the newcomer owns are handed off to it, as any counter is after
// a ring change.
func TestLoadedCountersGoToTheirOwners(t *testing.T) {
	const counters = 200
	dir := t.TempDir()
	c := &testCluster{}
	c.add(t, "--snapshot-dir", dir)
	c.spend(t, counters)
	if err := c.stops[0](); err != nil {
		t.Fatalf("stopping node-0: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshot.FileName)); err != nil {
		t.Fatalf("no snapshot after the shutdown: %v", err)
	}

	n0, _ := startNamedNode(t, "node-0", "--snapshot-dir", dir)
	loaded, err := metricValue(n0.httpAddr, "ringlimit_snapshot_counters_loaded_total")
	if err != nil || loaded != counters {
		t.Fatalf("node-0 loaded %v counters (%v), want %d", loaded, err, counters)
	}
	n1, _ := startNamedNode(t, "node-1", "--join", n0.cluster.GossipAddr())
	cl, err := client.New(n1.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pollKept(t, cl, counters, "after node-1 joined node-0, which loaded them")
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := metricValue(n1.httpAddr, `ringlimit_handoff_counters_total{direction="received"}`)
		if err == nil && got > counters/4 && got < counters {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-1 received %v counters by hand-off (%v), want its share of the %d loaded by node-0", got, err, counters)
		}
		time.Sleep(50 * time.Millisecond) // polling a node, not waiting for an effect
	}
}
