package peer

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
)

// tlsSource loads a certificate for name from ca, trusting trust.
func tlsSource(t *testing.T, ca, trust *testpki.CA, name string) *tlsfiles.Source {
	t.Helper()
	f := ca.Issue(t, name, name).Write(t, t.TempDir(), "node", trust)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// serveMutualTLS serves h on a loopback port with mutual TLS from ca.
func serveMutualTLS(t *testing.T, ca *testpki.CA, srv peerpb.PeerServer) string {
	t.Helper()
	src := tlsSource(t, ca, ca, "a")
	return serveService(t, srv, grpc.Creds(credentials.NewTLS(src.ServerConfig())))
}

// TestPeerPortRefusesStrangers is the attack of issue 7 "the peer port
// trusts anyone": a plain gRPC client, and one whose certificate comes from
// another CA, call every peer RPC. Each call fails and the node's handler
// never sees it; a peer of the cluster CA, the control, gets through.
func TestPeerPortRefusesStrangers(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	other := testpki.NewCA(t, "other")
	h := &fakeHandler{}
	addr := serveMutualTLS(t, ca, NewServer(h, nil))

	calls := map[string]func(peerpb.PeerClient) error{
		"Forward": func(c peerpb.PeerClient) error {
			_, err := c.Forward(t.Context(), &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{check("k", 1)}})
			return err
		},
		"HandOff": func(c peerpb.PeerClient) error {
			_, err := c.HandOff(t.Context(), &peerpb.HandOffRequest{From: "b", Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})
			return err
		},
		"AddGlobalHits": func(c peerpb.PeerClient) error {
			_, err := c.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "b", Reports: []*peerpb.GlobalReport{{Admitted: 1e9}}})
			return err
		},
		"UpdateGlobals": func(c peerpb.PeerClient) error {
			_, err := c.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{States: []*peerpb.GlobalState{{Name: "n", Key: "k", Remaining: 1e9}}})
			return err
		},
	}
	strangers := map[string]grpc.DialOption{
		"plaintext":             grpc.WithTransportCredentials(insecure.NewCredentials()),
		"TLS without a cert":    grpc.WithTransportCredentials(credentials.NewTLS(trustOnly(t, ca).ClientConfig(""))),
		"cert from another CA":  grpc.WithTransportCredentials(credentials.NewTLS(tlsSource(t, other, ca, "b").ClientConfig(""))),
		"self-trusting foreign": grpc.WithTransportCredentials(credentials.NewTLS(tlsSource(t, other, other, "b").ClientConfig(""))),
	}
	for who, dial := range strangers {
		cc, err := grpc.NewClient(addr, dial)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		for rpc, call := range calls {
			if err := call(peerpb.NewPeerClient(cc)); err == nil {
				t.Errorf("%s: %s succeeded", who, rpc)
			}
		}
	}
	h.mu.Lock()
	changed := h.forwards.Load() != 0 || len(h.hits) != 0 || len(h.states) != 0 || h.handedBy != ""
	h.mu.Unlock()
	if changed {
		t.Fatalf("a refused call reached the handler: %d forwards, %d reports, %d states, hand-off from %q",
			h.forwards.Load(), len(h.hits), len(h.states), h.handedBy)
	}

	// The control: a node of the cluster, through a Pool as nodes dial.
	p := NewPool(Config{DialOptions: []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsSource(t, ca, ca, "b").ClientConfig(""))),
	}})
	defer p.Close()
	if _, err := p.ForwardNow(t.Context(), addr, check("k", 1)); err != nil {
		t.Fatalf("a peer with a cluster certificate: %v", err)
	}
	if h.forwards.Load() != 1 {
		t.Errorf("handler saw %d forwards, want 1", h.forwards.Load())
	}
}

// trustOnly is a TLS source that trusts ca and has no certificate.
func trustOnly(t *testing.T, ca *testpki.CA) *tlsfiles.Source {
	t.Helper()
	src, err := tlsfiles.Load(tlsfiles.Files{CA: ca.Issue(t, "x").Write(t, t.TempDir(), "x", ca).CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return src
}
