package node_test

// Every way a client can end a connection, at every stage, on every port
// of a node (issue 33's first point): each case connects, gets as far as
// its stage, ends the connection, and then a new client of the same port
// must be served.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/hashicorp/memberlist"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/node"
)

// endPort is one port as a client of it speaks: how it connects, the
// bytes that set a connection up (HTTP/2's preface) and those of
// successive commands, and a legitimate client's probe.
type endPort struct {
	name string
	addr string
	// tls is the client side of the port's TLS; nil: plaintext.
	tls *tls.Config
	// session returns the bytes that set a connection up and n commands,
	// encoded as one connection sends them (HTTP/2's header compression
	// carries from one to the next).
	session func(n int) (setup []byte, commands [][]byte)
	// probe is a new client's request, which must be answered.
	probe func(ctx context.Context) error
}

// stage is how far a connection gets before it ends: it writes to the
// raw connection raw, or through c, its TLS over raw where the port has
// TLS.
type stage struct {
	name string
	// tlsOnly: the stage is the TLS handshake's.
	tlsOnly bool
	// commands is how many commands of the session it needs.
	commands int
	run      func(raw *net.TCPConn, c net.Conn, setup []byte, commands [][]byte)
}

// pipelined is how many commands "answers unread" sends: far more
// answers than a receive buffer of 4 KiB holds.
const pipelined = 400

var stages = []stage{
	{name: "during the TLS handshake", tlsOnly: true, run: func(*net.TCPConn, net.Conn, []byte, [][]byte) {}},
	{name: "before a command", run: func(_ *net.TCPConn, c net.Conn, setup []byte, _ [][]byte) {
		c.Write(setup)
	}},
	{name: "mid-command", commands: 1, run: func(_ *net.TCPConn, c net.Conn, setup []byte, cmds [][]byte) {
		c.Write(append(setup, cmds[0][:len(cmds[0])/2]...))
	}},
	{name: "mid-pipeline", commands: 3, run: func(_ *net.TCPConn, c net.Conn, setup []byte, cmds [][]byte) {
		c.Write(slicesConcat(setup, cmds[0], cmds[1], cmds[2][:len(cmds[2])/2]))
	}},
	{name: "answers unread", commands: pipelined, run: func(raw *net.TCPConn, c net.Conn, setup []byte, cmds [][]byte) {
		// The writes stop where the server stops reading (it does once
		// its answers wait on this client): the deadline bounds the
		// stage, it is no assertion.
		raw.SetWriteDeadline(time.Now().Add(2 * time.Second))
		c.Write(slicesConcat(append([][]byte{setup}, cmds...)...))
	}},
}

func slicesConcat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// ending is how a client ends its connection.
var endings = []struct {
	name string
	end  func(raw *net.TCPConn)
}{
	{"reset", func(raw *net.TCPConn) { raw.SetLinger(0); raw.Close() }},
	{"half-close", func(raw *net.TCPConn) { raw.CloseWrite() }}, // then left open
	{"abandon", func(*net.TCPConn) {}},                          // left open, silent
}

// TestEveryPortSurvivesEveryEnding: on every port of a node (HTTP, the
// public gRPC port with Envoy's quota streams on it, the RESP port, each
// with and without TLS; the peer port, with mutual TLS; gossip, TCP and
// UDP, with a gossip key), a client resets its connection (SO_LINGER 0),
// half-closes it or abandons it during the TLS handshake, before a
// command, mid-command, mid-pipeline or with its answers unread; after
// each, a new client of the port is served. A connection abandoned, or
// half-closed, stays open until that client has been served.
func TestEveryPortSurvivesEveryEnding(t *testing.T) {
	e := startEndings(t)
	for _, p := range e.ports(t) {
		for _, st := range stages {
			if st.tlsOnly && p.tls == nil {
				continue
			}
			setup, cmds := p.session(st.commands)
			if len(cmds) < st.commands {
				continue // gossip takes one message a connection
			}
			for _, end := range endings {
				t.Run(p.name+"/"+st.name+"/"+end.name, func(t *testing.T) {
					raw := dialRaw(t, p.addr)
					var c net.Conn = raw
					switch {
					case st.tlsOnly:
						halfHello(raw, p.tls)
					case p.tls != nil:
						tc := tls.Client(raw, p.tls)
						raw.SetDeadline(time.Now().Add(10 * time.Second))
						if err := tc.Handshake(); err != nil {
							t.Fatalf("TLS handshake: %v", err)
						}
						raw.SetDeadline(time.Time{})
						c = tc
					}
					st.run(raw, c, setup, cmds)
					end.end(raw)
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if err := p.probe(ctx); err != nil {
						t.Fatalf("the next client of %s: %v", p.name, err)
					}
				})
			}
		}
	}
	t.Run("gossip UDP", func(t *testing.T) {
		addr, err := net.ResolveUDPAddr("udp", e.s.nodes[0].Cluster().GossipAddr())
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.DialUDP("udp", nil, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		whole := sealPacket(e.s.key, []byte{byte(200), 1, 2, 3})
		for name, dgram := range map[string][]byte{
			"an empty":          {},
			"a truncated":       whole[:len(whole)/2],
			"an undecryptable":  sealPacket([]byte(strings.Repeat("x", 32)), []byte{0}),
			"an unknown type's": whole,
			"a TCP frame as a":  sealGossip(e.s.key, []byte{0}),
		} {
			if _, err := c.Write(dgram); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if _, err := e.prober.Ping("node-0", addr); err != nil {
				t.Fatalf("a ping after %s datagram: %v", name, err)
			}
		}
	})
}

// endings is the test's cluster: node-0 with TLS on its public ports,
// node-1 without, both with the RESP port and a policy for quota
// streams; mutual TLS between them and a gossip key.
type endingsEnv struct {
	s         *secure
	publicCA  *testpki.CA
	clientTLS *tls.Config // trusts node-0's public certificate
	member    *tls.Config // node-1's peer certificate, for node-0's peer port
	prober    *memberlist.Memberlist
}

func startEndings(t *testing.T) *endingsEnv {
	t.Helper()
	policy := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(policy, []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &endingsEnv{publicCA: testpki.NewCA(t, "public")}
	public := e.publicCA.Issue(t, "node-0", "127.0.0.1").Write(t, t.TempDir(), "public", e.publicCA)
	e.s = startSecureWith(t, 2, func(i int, c *node.Config) {
		c.RESPAddr = "127.0.0.1:0"
		c.PolicyFile = policy
		if i == 0 {
			c.TLS = tlsfiles.Files{Cert: public.Cert, Key: public.Key}
		}
	})
	roots := x509.NewCertPool()
	roots.AddCert(e.publicCA.Cert)
	e.clientTLS = &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	f := e.s.ca.Issue(t, "node-1", "node-1").Write(t, t.TempDir(), "member", e.s.ca)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.member = src.ClientConfig("node-0")
	e.member.NextProtos = []string{"h2"}

	mc := memberlist.DefaultLocalConfig()
	mc.Name, mc.BindAddr, mc.BindPort, mc.AdvertisePort = "prober", "127.0.0.1", 0, 0
	mc.SecretKey = e.s.key
	mc.LogOutput = io.Discard
	if e.prober, err = memberlist.Create(mc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.prober.Leave(time.Second); e.prober.Shutdown() })
	return e
}

// ports lists every port of the cluster's two nodes, as endPorts.
func (e *endingsEnv) ports(t *testing.T) []endPort {
	n0, n1 := e.s.nodes[0], e.s.nodes[1]
	h2 := e.clientTLS.Clone()
	h2.NextProtos = []string{"h2"}
	var out []endPort
	for _, pub := range []struct {
		suffix string
		n      *node.Node
		tls    *tls.Config
		h2     *tls.Config
	}{{" (TLS)", n0, e.clientTLS, h2}, {"", n1, nil, nil}} {
		scheme := "http"
		if pub.tls != nil {
			scheme = "https"
		}
		out = append(out,
			endPort{name: "HTTP" + pub.suffix, addr: pub.n.HTTPAddr(), tls: pub.tls,
				session: httpSession(pub.n.HTTPAddr()), probe: httpProbe(scheme, pub.n.HTTPAddr(), pub.tls)},
			endPort{name: "gRPC" + pub.suffix, addr: pub.n.GRPCAddr(), tls: pub.h2,
				session: grpcSession(scheme, pub.n.GRPCAddr(), "/ringlimit.v1.RateLimiter/Check", false, checkMessage(t)),
				probe:   grpcProbe(pub.n.GRPCAddr(), pub.h2)},
			endPort{name: "RLQS" + pub.suffix, addr: pub.n.GRPCAddr(), tls: pub.h2,
				session: grpcSession(scheme, pub.n.GRPCAddr(), "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas", true, quotaMessage(t)),
				probe:   quotaProbe(pub.n.GRPCAddr(), pub.h2)},
			endPort{name: "RESP" + pub.suffix, addr: pub.n.RESPAddr(), tls: pub.tls,
				session: respSession, probe: respProbe(pub.n.RESPAddr(), pub.tls)},
		)
	}
	forward, err := proto.Marshal(&peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{endingsItem()}}}})
	if err != nil {
		t.Fatal(err)
	}
	gossip := n0.Cluster().GossipAddr()
	return append(out,
		endPort{name: "peer", addr: n0.PeerAddr(), tls: e.member,
			session: grpcSession("https", n0.PeerAddr(), "/ringlimit.peer.v1.Peer/Forward", false, forward),
			probe:   peerProbe(n0.PeerAddr(), e.member)},
		endPort{name: "gossip TCP", addr: gossip,
			session: func(int) ([]byte, [][]byte) {
				// One message a connection: a frame that decrypts to a
				// message of no known type.
				return nil, [][]byte{sealGossip(e.s.key, []byte{byte(200), 1, 2, 3})}
			},
			probe: func(context.Context) error {
				if n, err := e.prober.Join([]string{gossip}); n != 1 || err != nil {
					return fmt.Errorf("a push-pull: joined %d, %v", n, err)
				}
				return nil
			}},
	)
}

func endingsItem() *pb.CheckItem {
	return &pb.CheckItem{Name: "endings", Key: "k", Limit: 1_000_000, DurationMs: 1000}
}

// dialRaw connects to addr with a receive buffer of 4 KiB, so that
// answers the test does not read soon fill it and wait on the server.
func dialRaw(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	raw := c.(*net.TCPConn)
	raw.SetReadBuffer(4 << 10)
	t.Cleanup(func() { raw.Close() })
	return raw
}

// halfHello sends the first half of a TLS ClientHello on raw.
func halfHello(raw net.Conn, conf *tls.Config) {
	tls.Client(halfWriter{raw}, conf).Handshake() // fails at its first write, by design
}

type halfWriter struct{ net.Conn }

func (w halfWriter) Write(p []byte) (int, error) {
	w.Conn.Write(p[:len(p)/2])
	return 0, errors.New("half sent")
}

func httpSession(addr string) func(int) ([]byte, [][]byte) {
	body := `{"requests":[{"name":"endings","key":"k","limit":1000000,"duration_ms":1000}]}`
	req := []byte(fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body))
	return func(n int) ([]byte, [][]byte) { return nil, repeat(req, n) }
}

func repeat(b []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

func httpProbe(scheme, addr string, conf *tls.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: conf, DisableKeepAlives: true}}
		req, err := http.NewRequestWithContext(ctx, "POST", scheme+"://"+addr+"/v1/check",
			strings.NewReader(`{"requests":[{"name":"endings","key":"probe","limit":1000000,"duration_ms":1000}]}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "UNDER_LIMIT") {
			return fmt.Errorf("%s %s", resp.Status, b)
		}
		return nil
	}
}

// grpcSession is a gRPC client's connection: the preface and settings,
// then a call of path per command, or, with stream, one call whose
// messages the commands are.
func grpcSession(scheme, authority, path string, stream bool, msg []byte) func(int) ([]byte, [][]byte) {
	return func(n int) ([]byte, [][]byte) {
		var setup bytes.Buffer
		setup.WriteString(http2.ClientPreface)
		http2.NewFramer(&setup, nil).WriteSettings()
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		framed := make([]byte, 5, 5+len(msg))
		binary.BigEndian.PutUint32(framed[1:], uint32(len(msg)))
		framed = append(framed, msg...)
		cmds := make([][]byte, n)
		for i := range cmds {
			var b bytes.Buffer
			fr := http2.NewFramer(&b, nil)
			id := uint32(2*i + 1)
			if stream {
				id = 1
			}
			if i == 0 || !stream {
				hb.Reset()
				for _, f := range [][2]string{{":method", "POST"}, {":scheme", scheme}, {":path", path}, {":authority", authority},
					{"content-type", "application/grpc"}, {"te", "trailers"}} {
					enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
				}
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
			}
			fr.WriteData(id, !stream, framed)
			cmds[i] = b.Bytes()
		}
		return setup.Bytes(), cmds
	}
}

func checkMessage(t *testing.T) []byte {
	b, err := proto.Marshal(&pb.CheckRequest{Requests: []*pb.CheckItem{endingsItem()}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func quotaMessage(t *testing.T) []byte {
	b, err := proto.Marshal(quotaReport())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func quotaReport() *rlqspb.RateLimitQuotaUsageReports {
	return &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"tenant": "t"}}, NumRequestsAllowed: 1}}}
}

// withGRPC calls f with a new client connection to addr, TLS with conf
// (nil: plaintext), closed when f returns.
func withGRPC(addr string, conf *tls.Config, f func(cc *grpc.ClientConn) error) error {
	creds := insecure.NewCredentials()
	if conf != nil {
		creds = credentials.NewTLS(conf)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer cc.Close()
	return f(cc)
}

func grpcProbe(addr string, conf *tls.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		return withGRPC(addr, conf, func(cc *grpc.ClientConn) error {
			resp, err := pb.NewRateLimiterClient(cc).Check(ctx, &pb.CheckRequest{Requests: []*pb.CheckItem{endingsItem()}})
			if err != nil {
				return err
			}
			if r := resp.GetResponses()[0]; r.GetStatus() != pb.Status_UNDER_LIMIT {
				return fmt.Errorf("answered %v", r)
			}
			return nil
		})
	}
}

func quotaProbe(addr string, conf *tls.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		return withGRPC(addr, conf, func(cc *grpc.ClientConn) error {
			s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
			if err != nil {
				return err
			}
			s.Send(quotaReport()) // a refused stream's Send may say only io.EOF: Recv says why
			resp, err := s.Recv()
			if err != nil {
				return err
			}
			if len(resp.GetBucketAction()) != 1 {
				return fmt.Errorf("answered %v", resp)
			}
			return nil
		})
	}
}

func peerProbe(addr string, conf *tls.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		return withGRPC(addr, conf, func(cc *grpc.ClientConn) error {
			_, err := peerpb.NewPeerClient(cc).Forward(ctx, &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{endingsItem()}}}})
			return err
		})
	}
}

func respSession(n int) ([]byte, [][]byte) {
	return nil, repeat([]byte("*6\r\n$11\r\nCL.THROTTLE\r\n$7\r\nendings\r\n$2\r\n15\r\n$2\r\n30\r\n$2\r\n60\r\n$1\r\n0\r\n"), n)
}

func respProbe(addr string, conf *tls.Config) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		var c net.Conn
		var err error
		if conf != nil {
			c, err = (&tls.Dialer{Config: conf}).DialContext(ctx, "tcp", addr)
		} else {
			c, err = d.DialContext(ctx, "tcp", addr)
		}
		if err != nil {
			return err
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		if _, err := c.Write([]byte("CL.THROTTLE probe 15 30 60 0\r\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "*5\r\n" {
			return fmt.Errorf("CL.THROTTLE answered %q, %v", line, err)
		}
		return nil
	}
}

// memberlist's encryption, version 1: AES-GCM with a random nonce after
// the version byte.
const (
	gossipEncryptMsg = 10
	gossipVersion    = 1
	gossipNonce      = 12
)

// sealGossip is msg as memberlist sends it over TCP with key: the
// encryptMsg type, the length, and msg sealed with the first five bytes as
// additional data.
func sealGossip(key, msg []byte) []byte {
	gcm := gossipGCM(key)
	head := make([]byte, 5)
	head[0] = gossipEncryptMsg
	binary.BigEndian.PutUint32(head[1:], uint32(1+gossipNonce+len(msg)+gcm.Overhead()))
	return seal(gcm, head, msg, head)
}

// sealPacket is msg as memberlist sends it over UDP with key: sealed, no
// additional data.
func sealPacket(key, msg []byte) []byte { return seal(gossipGCM(key), nil, msg, nil) }

func seal(gcm cipher.AEAD, head, msg, ad []byte) []byte {
	nonce := make([]byte, gossipNonce)
	rand.Read(nonce)
	out := append(append(append([]byte{}, head...), gossipVersion), nonce...)
	return gcm.Seal(out, nonce, msg, ad)
}

func gossipGCM(key []byte) cipher.AEAD {
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return gcm
}
