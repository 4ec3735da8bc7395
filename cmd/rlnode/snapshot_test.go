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

	"context"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/ring"
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

	// As soon as it serves HTTP (/readyz, /metrics), it has loaded them.
	n0, _ := startNamedNode(t, "node-0", "--snapshot-dir", dir)
	loaded, err := metricValue(n0.HTTPAddr(), "ringlimit_snapshot_counters_loaded_total")
	if err != nil || loaded != counters {
		t.Fatalf("node-0 loaded %v counters (%v), want %d", loaded, err, counters)
	}
	n1, _ := startNamedNode(t, "node-1", "--join", n0.Cluster().GossipAddr())
	cl, err := client.New(n1.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pollKept(t, cl, counters, "after node-1 joined node-0, which loaded them")
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := metricValue(n1.HTTPAddr(), `ringlimit_handoff_counters_total{direction="received"}`)
		if err == nil && got > counters/4 && got < counters {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-1 received %v counters by hand-off (%v), want its share of the %d loaded by node-0", got, err, counters)
		}
		time.Sleep(50 * time.Millisecond) // polling a node, not waiting for an effect
	}
}

// TestFinalSnapshotKeepsWhatWasHandedOff: a node's final snapshot holds
// the counters it handed off as it shut down, not only those it still
// held, because the node that took them may lose them: here node-1, which
// takes node-0's counters, keeps no snapshot (as a node past its own final
// snapshot when a whole cluster stops). Started again alone, node-0 finds
// its counters half spent.
func TestFinalSnapshotKeepsWhatWasHandedOff(t *testing.T) {
	const counters = 200
	dir := t.TempDir()
	c := &testCluster{}
	c.add(t, "--snapshot-dir", dir)
	c.add(t)
	c.waitForMembers(t, 2)
	c.spend(t, counters)
	if err := c.stops[0](); err != nil { // hands its counters to node-1, which takes them
		t.Fatalf("stopping node-0: %v", err)
	}
	c.waitForMembers(t, 1, 0)
	if err := c.stops[1](); err != nil { // and loses them
		t.Fatalf("stopping node-1: %v", err)
	}

	n0, _ := startNamedNode(t, "node-0", "--snapshot-dir", dir)
	cl, err := client.New(n0.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r := ring.New(ring.Member{Name: "node-0"}, ring.Member{Name: "node-1"})
	owned, kept := 0, 0
	for i := range counters {
		key := fmt.Sprint("user:", i)
		if o, _ := r.Owner(key); o.Name != "node-0" {
			continue
		}
		owned++
		item := &pb.CheckItem{Name: "handoff", Key: key, Limit: 10, DurationMs: 3_600_000, Hits: ptr(int64(0))}
		resp, err := cl.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Responses[0].Remaining == 5 {
			kept++
		}
	}
	if owned < counters/4 || kept*100 < owned*99 {
		t.Errorf("%d of the %d counters node-0 owned (and handed off) came back half spent, want >= 99%%", kept, owned)
	}
}
