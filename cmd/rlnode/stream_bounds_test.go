package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/peer"
)

// smallWindows dials addr with the smallest receive windows gRPC allows
// (64 KiB), so that a few large answers fill them.
func smallWindows(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// quotaReport is a first report of n buckets of the tenants' policy, each
// id 200 bytes long: with n = 1,000, its answer (and each renewal) is
// about 250 KB.
func quotaReport(n int) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "edge"}
	for i := range n {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("%0200d", i)}}, NumRequestsAllowed: 1})
	}
	return m
}

// quotaStreamsAccepted has a new client open n quota streams on the node,
// each kept open once its first report is answered, trying again while
// they are refused RESOURCE_EXHAUSTED, for up to 30s.
func quotaStreamsAccepted(t *testing.T, addr string, n int) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := 0
	for deadline := time.Now().Add(30 * time.Second); open < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d new quota streams accepted within 30s", open, n)
		}
		s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
		var resp *rlqspb.RateLimitQuotaResponse
		if err == nil {
			s.Send(quotaReport(1)) // a refused stream's Send may say only io.EOF: Recv says why
			resp, err = s.Recv()
		}
		switch {
		case err == nil && len(resp.GetBucketAction()) == 1:
			open++
		case status.Code(err) != codes.ResourceExhausted:
			t.Fatalf("a legitimate quota stream: %v %v, want an answer or RESOURCE_EXHAUSTED while the slots are held", resp, err)
		}
	}
}

// TestQuotaStreamsFreeTheirSlots: Envoy quota streams that take every
// slot of --rlqs-max-streams and read nothing (each reports 1,000
// buckets: the answer and its renewals fill the receive window), or send
// nothing after their first report, are ended after
// --stream-send-timeout (their connection closed) or
// --stream-idle-timeout (DEADLINE_EXCEEDED naming the flag), counted,
// and a new client then opens as many. Before, they held every slot for
// as long as their connections lived.
func TestQuotaStreamsFreeTheirSlots(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unlimited: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, idle := range []bool{false, true} {
		t.Run(map[bool]string{false: "unread answers", true: "idle"}[idle], func(t *testing.T) {
			httpAddr, grpcAddr, _ := startNode(t, "--policy-file", path, "--rlqs-max-streams", "4",
				"--stream-send-timeout", "1s", "--stream-idle-timeout", idleTimeout(idle))
			cc := smallWindows(t, grpcAddr)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var streams []rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
			for range 4 {
				s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// The stream holds its slot once its first report is
				// answered.
				if err := s.Send(quotaReport(1)); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Recv(); err != nil {
					t.Fatalf("stream %d's first report: %v", len(streams), err)
				}
				streams = append(streams, s)
			}
			// Only once all four hold their slots does any stop reading: a
			// stream opened after the first was ended would find its
			// connection closed and be retried by gRPC on a new one, where
			// the slots not yet given back refuse it.
			for _, s := range streams {
				if idle {
					continue // it reads on, and sends nothing more
				}
				if err := s.Send(quotaReport(1000)); err != nil {
					t.Fatal(err)
				}
			}
			quotaStreamsAccepted(t, grpcAddr, 4)
			for i, s := range streams {
				err := drainQuota(s)
				switch {
				case !idle && status.Code(err) != codes.Unavailable:
					t.Errorf("stream %d ended with %v, want UNAVAILABLE: its connection closed", i, err)
				case idle && (status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "--stream-idle-timeout")):
					t.Errorf("stream %d ended with %v, want DEADLINE_EXCEEDED naming --stream-idle-timeout", i, err)
				}
			}
			if idle {
				eventually(t, "4 idle quota streams counted", metricAtLeast(httpAddr, `ringlimit_streams_ended_total{reason="idle",stream="rlqs"}`, 4))
			} else {
				// The first ended closes the connection, which ends the others.
				eventually(t, "an unread quota stream counted", metricAtLeast(httpAddr, `ringlimit_streams_ended_total{reason="not_read",stream="rlqs"}`, 1))
			}
		})
	}
}

// drainQuota reads s to its end and returns how it ended.
func drainQuota(s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// TestPeerStreamsEnded: on a node's peer port, a ForwardStream opened
// under a member's name (no peer TLS: the name is all the Guard can
// check) that reads none of its answers is ended after
// --stream-send-timeout and its connection closed; one that sends
// nothing is asked to end after half --stream-idle-timeout and ended at
// it (DEADLINE_EXCEEDED, the trailer saying why); each is counted.
// Before, either held its handler, and a goroutine, for as long as its
// connection lived.
func TestPeerStreamsEnded(t *testing.T) {
	c := startCluster(t, 2, "--stream-send-timeout", "1s", "--stream-idle-timeout", "1s")
	target, member := c.nodes[0], c.nodes[1].Cluster().LocalMember().Name
	open := func(t *testing.T) peerpb.Peer_ForwardStreamClient {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), peer.SenderHeader, member), time.Minute)
		t.Cleanup(cancel)
		s, err := peerpb.NewPeerClient(smallWindows(t, target.PeerAddr())).ForwardStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("unread answers", func(t *testing.T) {
		s := open(t)
		// Batches of 1,000 items with empty keys: each answer holds 1,000
		// errors, about 50 KB.
		go func() {
			for id := range 20 {
				req := &pb.CheckRequest{Requests: make([]*pb.CheckItem, 1000)}
				for i := range req.Requests {
					req.Requests[i] = &pb.CheckItem{Name: strings.Repeat("n", 20), Limit: 1, DurationMs: 1000}
				}
				if s.Send(&peerpb.ForwardStreamRequest{Id: uint64(id + 1), Requests: []*pb.CheckRequest{req}}) != nil {
					return
				}
			}
		}()
		eventually(t, "an unread forward stream counted", metricAtLeast(target.HTTPAddr(), `ringlimit_streams_ended_total{reason="not_read",stream="forward"}`, 1))
		if err := drainForward(s); status.Code(err) != codes.Unavailable {
			t.Errorf("the stream ended with %v, want UNAVAILABLE: its connection closed", err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		s := open(t)
		notice, err := s.Recv()
		if err != nil || notice.GetId() != 0 || !errors.Is(mux.Err(notice.GetStatus()), mux.ErrIdle) {
			t.Fatalf("an idle stream: %v, %v; want a notice of id 0 with ErrIdle", notice, err)
		}
		err = drainForward(s)
		if why := s.Trailer().Get(mux.EndedTrailer); status.Code(err) != codes.DeadlineExceeded || len(why) != 1 || why[0] != status.Convert(mux.ErrIdle).Message() {
			t.Errorf("the stream ended with %v, trailer %q; want DEADLINE_EXCEEDED and ErrIdle's message", err, why)
		}
		eventually(t, "an idle forward stream counted", metricAtLeast(target.HTTPAddr(), `ringlimit_streams_ended_total{reason="idle",stream="forward"}`, 1))
	})
}

// drainForward reads s to its end and returns how it ended.
func drainForward(s peerpb.Peer_ForwardStreamClient) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}
