package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/service"
)

// The attacks of issue 24's point 3, each from one host (127.0.0.2; Linux
// routes all of 127.0.0.0/8 to loopback) while the legitimate client is
// another (127.0.0.1). The nodes run with small bounds and short
// timeouts, so that a few hundred connections make the flood.

// floodSource is the attacker's address.
const floodSource = "127.0.0.2"

// slotArgs are the bounds the flood tests run with: 100 connections a
// listener, 20 from one address, timeouts of a second.
var slotArgs = []string{"--max-conns", "100", "--max-conns-per-source", "20", "--handshake-timeout", "1s", "--idle-timeout", "1s"}

// flood opens n connections to addr from floodSource, each greeted by
// hello (which may fail: a connection refused at once is closed), and
// closes them when the test ends.
func flood(t *testing.T, addr string, n int, hello func(net.Conn)) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(floodSource)}, Timeout: 10 * time.Second}
	var conns []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("flood connection %d: %v", len(conns), err)
		}
		t.Cleanup(func() { c.Close() })
		if hello != nil {
			hello(c)
		}
		conns = append(conns, c)
	}
	return conns
}

// eventually polls cond for up to 30s, a bound far beyond what any of
// these tests waits for, so that it asserts no timing.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30s: %s", what)
		}
	}
}

// metricAtLeast reports whether a node's series is at least want.
func metricAtLeast(httpAddr, series string, want float64) func() bool {
	return func() bool {
		v, err := metricValue(httpAddr, series)
		return err == nil && v >= want
	}
}

// allClosedByServer waits until the server has closed every one of conns:
// reading each ends (EOF or a reset) rather than waiting.
func allClosedByServer(t *testing.T, conns []net.Conn) {
	t.Helper()
	var wg sync.WaitGroup
	open := make(chan int, len(conns))
	for i, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
				open <- i
			}
		})
	}
	wg.Wait()
	close(open)
	if n := len(open); n > 0 {
		t.Errorf("%d of %d flood connections still open after 30s", n, len(conns))
	}
}

// checkOnce makes one Check of key on the gRPC port at addr from a new
// connection, within 10s.
func checkOnce(addr string, item *pb.CheckItem) (*pb.CheckResult, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewRateLimiterClient(conn).Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		return nil, err
	}
	return resp.GetResponses()[0], nil
}

// TestIdleConnectionFloodOnClientPort: 300 idle HTTP/2 connections to the
// gRPC port from one host (each completes its handshake, then sends
// nothing) take 20 slots, the rest are closed at once; a client from
// another host is served during the flood; and the idle ones are closed
// after --idle-timeout. Before, they waited in the backlog of
// --max-conns and every later client timed out (issue 24: 4,200
// connections made `rlnode check` fail with DeadlineExceeded).
func TestIdleConnectionFloodOnClientPort(t *testing.T) {
	httpAddr, grpcAddr, _ := startNode(t, slotArgs...)
	var h2 http2.Transport
	conns := flood(t, grpcAddr, 300, func(c net.Conn) { h2.NewClientConn(c) }) // it answers pings and GOAWAY, as a client would
	eventually(t, "the flood refused beyond 20 connections", metricAtLeast(httpAddr, `ringlimit_connections_refused_total{listener="grpc",reason="per_source"}`, 280))
	r, err := checkOnce(grpcAddr, &pb.CheckItem{Name: "flood", Key: "k", Limit: 5, DurationMs: 60_000})
	if err != nil || r.GetStatus() != pb.Status_UNDER_LIMIT {
		t.Fatalf("a check during the flood: %v %v, want it admitted", r, err)
	}
	allClosedByServer(t, conns)
}

// TestKeepAliveFloodOnHTTPPort: 300 keep-alive connections from one host,
// each idle after one request, take 20 slots; /healthz answers a client
// from another host during the flood, and the idle ones are closed after
// --idle-timeout. Before, /healthz timed out (issue 24).
func TestKeepAliveFloodOnHTTPPort(t *testing.T) {
	httpAddr, _, _ := startNode(t, slotArgs...)
	conns := flood(t, httpAddr, 300, func(c net.Conn) {
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", httpAddr)
	})
	eventually(t, "the flood refused beyond 20 connections", metricAtLeast(httpAddr, `ringlimit_connections_refused_total{listener="http",reason="per_source"}`, 280))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz during the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz during the flood: %s", resp.Status)
	}
	allClosedByServer(t, conns)
}

// TestHandshakeFloodOnPeerPort: 200 connections to a node's peer port
// (mutual TLS) that never send their TLS hello are dropped within
// --handshake-timeout (1s here; the test waits up to 30s, gRPC's default
// was 120s), and a node that restarts during the flood reaches its peer:
// its forwarded checks are decided by their owner, exactly. Before, the
// restarted node could not reach its peers and decided on its share: a
// limit of 5 admitted 10 (issue 24).
func TestHandshakeFloodOnPeerPort(t *testing.T) {
	args := append(secureArgs(t), slotArgs...)
	c := startCluster(t, 2, args...)
	conns := flood(t, c.nodes[0].PeerAddr(), 200, nil)
	eventually(t, "the flood refused beyond 20 connections", metricAtLeast(c.nodes[0].HTTPAddr(), `ringlimit_connections_refused_total{listener="peer",reason="per_source"}`, 180))
	if err := c.stops[1](); err != nil {
		t.Fatalf("stopping node-1: %v", err)
	}
	n, _ := startNamedNode(t, "node-1", append([]string{"--join", c.nodes[0].Cluster().GossipAddr()}, args...)...)
	c.nodes[1] = n
	c.waitForMembers(t, 2)
	key := c.keyOwnedBy(0, "restart:")
	admitted := 0
	for i := range 10 {
		r, err := checkOnce(n.GRPCAddr(), &pb.CheckItem{Name: "restart", Key: key, Limit: 5, DurationMs: 3_600_000})
		if err != nil {
			t.Fatalf("check %d through the restarted node: %v", i, err)
		}
		if by := r.GetMetadata()[service.MetadataDecidedBy]; by != "" {
			t.Fatalf("check %d through the restarted node was decided by %q, want by its owner: the owner was not reached", i, by)
		}
		if r.GetStatus() == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("a limit of 5 admitted %d of 10 checks through the restarted node, want 5", admitted)
	}
	allClosedByServer(t, conns)
}

// TestUnreadStreamsFreeTheirSlots: a client that fills every CheckStream
// slot (--max-streams 8) with streams whose answers it never reads, or on
// which it sends nothing, has them ended after --stream-send-timeout (and
// its connection closed), or --stream-idle-timeout (DEADLINE_EXCEEDED,
// the trailer saying why), and a new client then
// opens as many. Before, 256 such streams held
// every slot for as long as they liked (issue 24).
func TestUnreadStreamsFreeTheirSlots(t *testing.T) {
	for _, idle := range []bool{false, true} {
		t.Run(map[bool]string{false: "unread answers", true: "idle"}[idle], func(t *testing.T) {
			httpAddr, grpcAddr, _ := startNode(t, "--max-streams", "8", "--stream-send-timeout", "1s", "--stream-idle-timeout", idleTimeout(idle))
			// The attacker's window is the smallest gRPC allows, so that
			// a few answers fill it.
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var streams []pb.RateLimiter_CheckStreamClient
			for range 8 {
				s, err := pb.NewRateLimiterClient(conn).CheckStream(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// The stream holds its slot once a first request is answered.
				if err := s.Send(&pb.CheckStreamRequest{Id: 100, Requests: []*pb.CheckItem{{Name: "first", Key: "k", Limit: 5, DurationMs: 1000}}}); err != nil {
					t.Fatal(err)
				}
				if r, err := s.Recv(); err != nil || r.GetId() != 100 {
					t.Fatalf("a first request of the attacker's: %v %v", r, err)
				}
				if !idle {
					// Answers of about 50 KB: each of 1,000 items has an
					// error. The requests go from their own goroutine: once
					// the node stops reading a stream, its sends block.
					go func() {
						for id := range 8 {
							if s.Send(badRequest(uint64(id+1))) != nil {
								return
							}
						}
					}()
				}
				streams = append(streams, s)
			}
			// Every slot comes free: a new client opens 8 streams. (Until
			// then the attacker reads nothing, which would free its streams.)
			accepted(t, grpcAddr, 8)
			if !idle {
				// The client's connection was closed: its streams end so.
				for i, s := range streams {
					if err := drain(s); status.Code(err) != codes.Unavailable {
						t.Errorf("stream %d ended with %v, want UNAVAILABLE: its connection closed", i, err)
					}
				}
				// The first ended closes the connection, which ends the others.
				eventually(t, "a stream counted", metricAtLeast(httpAddr, `ringlimit_streams_ended_total{reason="not_read",stream="check"}`, 1))
				return
			}
			want := status.Convert(mux.ErrIdle).Message()
			for i, s := range streams {
				err := drain(s)
				if why := s.Trailer().Get(mux.EndedTrailer); status.Code(err) != codes.DeadlineExceeded || len(why) != 1 || why[0] != want {
					t.Errorf("stream %d ended with %v, trailer %q, want DEADLINE_EXCEEDED and %q", i, err, why, want)
				}
			}
			eventually(t, "8 streams counted", metricAtLeast(httpAddr, `ringlimit_streams_ended_total{reason="idle",stream="check"}`, 8))
		})
	}
}

// idleTimeout is --stream-idle-timeout for a test of streams that are
// idle (1s), or that do not read their answers (a minute): with both
// bounds at 1s, an unread stream's last request could be a second old as
// its send blocked, and the stream was ended as idle, by chance.
func idleTimeout(idle bool) string {
	if idle {
		return "1s"
	}
	return "1m"
}

// badRequest is a stream request of 1,000 items with empty keys, so that
// its answer holds 1,000 errors.
func badRequest(id uint64) *pb.CheckStreamRequest {
	req := &pb.CheckStreamRequest{Id: id, Requests: make([]*pb.CheckItem, 1000)}
	for i := range req.Requests {
		req.Requests[i] = &pb.CheckItem{Name: strings.Repeat("n", 20), Limit: 1, DurationMs: 1000}
	}
	return req
}

// accepted has a new client open n CheckStreams on the node, each kept
// open once a request of it is answered, trying again while they are
// refused RESOURCE_EXHAUSTED, for up to 30s; it fails the test if they
// are not all open by then.
func accepted(t *testing.T, addr string, n int) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := 0
	for deadline := time.Now().Add(30 * time.Second); open < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d new streams accepted within 30s", open, n)
		}
		s, err := pb.NewRateLimiterClient(conn).CheckStream(ctx)
		var resp *pb.CheckStreamResponse
		if err == nil {
			// A refused stream's Send may fail with io.EOF; Recv says why.
			s.Send(&pb.CheckStreamRequest{Id: 1, Requests: []*pb.CheckItem{{Name: "legit", Key: "k", Limit: 5, DurationMs: 1000}}})
			resp, err = s.Recv()
		}
		switch {
		case err == nil && resp.GetId() == 1 && len(resp.GetResponses()) == 1:
			open++
		case status.Code(err) != codes.ResourceExhausted:
			t.Fatalf("a legitimate stream: %v %v, want an answer or RESOURCE_EXHAUSTED while the slots are held", resp, err)
		}
	}
}

// drain reads s to its end and returns how it ended.
func drain(s pb.RateLimiter_CheckStreamClient) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// TestWithheldMessagesFreeTheirSlots: Check and Lease RPCs (a lessee's
// call is unary, not a stream: --request-timeout bounds it as it bounds a
// check) whose client sends the headers and never the message take every
// slot of --max-inflight (4 here); each ends after --request-timeout, and
// a legitimate check is then admitted. Before, they held the slots for as
// long as their connection lived.
func TestWithheldMessagesFreeTheirSlots(t *testing.T) {
	_, grpcAddr, _ := startNode(t, "--max-inflight", "4", "--request-timeout", "1s")
	h2 := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(floodSource)}}
		return d.DialContext(ctx, network, addr)
	}}
	defer h2.CloseIdleConnections()
	ended := make(chan int, 4)
	for i := range 4 {
		body, w := io.Pipe() // never written: the message is withheld
		defer w.Close()
		req, err := http.NewRequest(http.MethodPost, "http://"+grpcAddr+"/ringlimit.v1.RateLimiter/"+[]string{"Check", "Lease"}[i%2], body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("TE", "trailers")
		go func() {
			resp, err := h2.RoundTrip(req)
			if err != nil {
				ended <- -1
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code, _ := strconv.Atoi(resp.Trailer.Get("Grpc-Status") + resp.Header.Get("Grpc-Status"))
			ended <- code
		}()
	}
	item := &pb.CheckItem{Name: "withheld", Key: "k", Limit: 5, DurationMs: 60_000}
	eventually(t, "a legitimate check admitted", func() bool {
		r, err := checkOnce(grpcAddr, item)
		if status.Code(err) != codes.ResourceExhausted && err != nil {
			t.Fatalf("a legitimate check: %v, want it admitted or RESOURCE_EXHAUSTED while the slots are held", err)
		}
		return err == nil && r.GetStatus() == pb.Status_UNDER_LIMIT
	})
	// A withheld call that reached the node while every slot was taken
	// (a slow start under load: the legitimate checks hold slots too) is
	// refused at once; every other one is cut at --request-timeout. None
	// hangs.
	cut := 0
	for range 4 {
		switch code := <-ended; code {
		case int(codes.DeadlineExceeded):
			cut++
		case int(codes.ResourceExhausted):
		default:
			t.Errorf("a call whose message was withheld ended with gRPC status %d, want DEADLINE_EXCEEDED (or RESOURCE_EXHAUSTED if it came when the slots were full)", code)
		}
	}
	if cut == 0 {
		t.Error("no withheld call was cut at --request-timeout")
	}
}
