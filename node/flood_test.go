package node_test

// The floods of issue 33's second point: nine source addresses
// (127.0.0.2 to 127.0.0.10; Linux routes all of 127.0.0.0/8 to loopback)
// reconnecting as fast as the node cuts them, against nodes with small
// bounds (300 connections a listener, 40 from one address), so that the
// nine together could hold every connection slot of a listener.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/node/nodetest"
	"github.com/ringlimit/ringlimit/service"
)

// floodBounds are the bounds of the nodes flooded: nine addresses of 40
// connections each hold more than 300. The timeouts are the defaults.
func floodBounds(c *node.Config) { c.MaxConns, c.MaxConnsPerSource = 300, 40 }

// floodHolders is how many connections each flooding address keeps
// trying to hold, more than its bound.
const floodHolders = 50

// floodSources are the flooding addresses, in one /24.
var floodSources = func() []string {
	var out []string
	for i := 2; i <= 10; i++ {
		out = append(out, fmt.Sprintf("127.0.0.%d", i))
	}
	return out
}()

// clientSource is a legitimate client's address, in another /24.
const clientSource = "127.0.1.1"

// flood has floodHolders connections from each of floodSources try to
// hold a connection to addr, greeted by hello, until ctx ends (or two
// minutes have passed): each reconnects as soon as the node closes the
// one it holds, and 50ms after one refused at once. It returns how many
// connections were made, once every holder has stopped.
func flood(ctx context.Context, addr string, hello func(net.Conn)) (wait func() int64) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	var dials atomic.Int64
	var wg sync.WaitGroup
	for _, src := range floodSources {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
		for range floodHolders {
			wg.Go(func() {
				for ctx.Err() == nil {
					c, err := d.DialContext(ctx, "tcp", addr)
					if err != nil {
						pause(ctx, time.Second)
						continue
					}
					dials.Add(1)
					began := time.Now()
					stop := context.AfterFunc(ctx, func() { c.Close() })
					if hello != nil {
						hello(c)
					}
					io.Copy(io.Discard, c) // until the node closes it
					stop()
					c.Close()
					if time.Since(began) < 50*time.Millisecond {
						pause(ctx, 50*time.Millisecond) // refused at once
					}
				}
			})
		}
	}
	return func() int64 {
		wg.Wait()
		cancel()
		return dials.Load()
	}
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// startFlood floods addr until the test ends, and waits until n has
// refused 300 of its connections on listener: the flood holds what it
// can.
func startFlood(t *testing.T, n *node.Node, listener, addr string, hello func(net.Conn)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	wait := flood(ctx, addr, hello)
	t.Cleanup(func() {
		cancel()
		t.Logf("the flood of %s made %d connections", listener, wait())
	})
	for deadline := time.Now().Add(30 * time.Second); refused(t, n, listener) < 300; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the flood was not refused 300 connections on %s within 30s", listener)
		}
	}
}

// refused sums n's ringlimit_connections_refused_total of listener, over
// its reasons.
func refused(t *testing.T, n *node.Node, listener string) float64 {
	t.Helper()
	var sum float64
	for line := range strings.Lines(metrics(t, n)) {
		if strings.HasPrefix(line, "ringlimit_connections_refused_total{") && strings.Contains(line, `listener="`+listener+`"`) {
			v, _ := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, ' ')+1:]), 64)
			sum += v
		}
	}
	return sum
}

// speakGRPC greets a connection as a gRPC client does, and makes one
// health check on it, which it never reads: the connection has carried
// an RPC, and then idles.
func speakGRPC(c net.Conn) {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Check"},
		{":authority", "node"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}) // an empty HealthCheckRequest
	c.Write(b.Bytes())
}

// clientCheck makes a check on the gRPC port at addr from a new
// connection from clientSource, within 10s.
func clientCheck(addr string, item *pb.CheckItem) (*pb.CheckResult, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientSource)}}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewRateLimiterClient(cc).Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		return nil, err
	}
	return resp.GetResponses()[0], nil
}

// TestNineAddressFloodOnClientPort: nine addresses flood a node's
// public gRPC port, half of their connections silent, half speaking
// HTTP/2 and making one health check before they idle; meanwhile a
// client from another address range makes five checks, each from a new
// connection, and each is answered. Before, the nine held every slot of
// --max-conns, and no check was answered.
func TestNineAddressFloodOnClientPort(t *testing.T) {
	conf := nodetest.Config("flooded")
	floodBounds(&conf)
	n, _ := nodetest.Start(t, conf)
	var greeted atomic.Int64
	startFlood(t, n, "grpc", n.GRPCAddr(), func(c net.Conn) {
		if greeted.Add(1)%2 == 0 {
			speakGRPC(c)
		}
	})
	for i := range 5 {
		r, err := clientCheck(n.GRPCAddr(), &pb.CheckItem{Name: "flood", Key: "client", Limit: 100, DurationMs: 60_000})
		if err != nil || r.GetStatus() != pb.Status_UNDER_LIMIT {
			t.Fatalf("check %d during the flood: %v %v, want it admitted", i, r, err)
		}
	}
}

// TestNineAddressFloodOnPeerPortDuringRestart: nine addresses flood the
// peer port (mutual TLS) of node-0 of three, never completing a TLS
// handshake; node-2 restarts meanwhile, and must rejoin: within 30s every
// node's ring holds the same three members, and no user spent before is
// admitted again by a node that took itself for the owner. Before, the
// restarted node could not reach node-0's peer port to admit it: its ring
// left node-0 out while the others' held it, and spent users were
// admitted again through it. (A check whose owner does not answer within
// the forward's deadline, as happens when the machine is starved by the
// flood and other load, is decided by the node asked on its share of the
// limit, and says so: that is failover's documented bound, logged here,
// not this test's subject.)
func TestNineAddressFloodOnPeerPortDuringRestart(t *testing.T) {
	s := startSecureWith(t, 3, func(_ int, c *node.Config) { floodBounds(c) })
	users := spendUsers(t, checker(t, s.nodes[0]), 30)
	startFlood(t, s.nodes[0], "peer", s.nodes[0].PeerAddr(), nil)

	stopping := time.Now()
	if err := s.stops[2](); err != nil {
		t.Fatalf("stopping node-2: %v", err)
	}
	c := s.config(t, 2)
	floodBounds(&c)
	restarted := time.Now()
	s.nodes[2], s.stops[2] = nodetest.Start(t, c)
	for deadline := time.Now().Add(30 * time.Second); !ringsAgree(s.nodes, 3); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			for _, nd := range s.nodes {
				t.Logf("%s's ring: %v", nd.Cluster().LocalMember().Name, nd.Cluster().Ring().Members())
			}
			t.Fatal("the rings did not agree on the three members within 30s of node-2's restart")
		}
	}
	t.Logf("node-2 stopped in %v; the rings agreed %v after its restart", restarted.Sub(stopping), time.Since(restarted))
	for _, nd := range s.nodes {
		c := checker(t, nd)
		for _, u := range users {
			resp, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{spent(u, 1)}})
			if err != nil {
				t.Fatal(err)
			}
			r := resp.GetResponses()[0]
			switch by := r.GetMetadata()[service.MetadataDecidedBy]; {
			case r.GetStatus() == pb.Status_OVER_LIMIT:
			case by != "":
				t.Logf("spent %s through %s: admitted by %s, the owner not reached in time", u, nd.Cluster().LocalMember().Name, by)
			default:
				t.Errorf("spent %s through %s: %v, want OVER_LIMIT", u, nd.Cluster().LocalMember().Name, r)
			}
		}
	}
}

// ringsAgree reports whether every node's ring holds the same n members.
func ringsAgree(nodes []*node.Node, n int) bool {
	first := nodes[0].Cluster().Ring().Members()
	for _, nd := range nodes {
		if m := nd.Cluster().Ring().Members(); len(m) != n || !slices.Equal(m, first) {
			return false
		}
	}
	return true
}
