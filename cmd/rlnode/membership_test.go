package main

import (
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/testpki"
)

// readyz returns the status and body of GET /readyz on the HTTP address
// addr.
func readyz(t testing.TB, addr string) (int, string) {
	t.Helper()
	return getStatus(t, "http://"+addr+"/readyz")
}

// TestSharedCertificatePairIsNotReady: two nodes holding one peer
// certificate that names neither (localhost and 127.0.0.1, as was common
// before admission by name) refuse each other as ring members. Each is
// not ready within 20s, and /readyz says why in one line; rlnode members
// shows the other as not admitted, with the reason. Before, both were
// ready, and each decided every key alone.
func TestSharedCertificatePairIsNotReady(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	f := ca.Issue(t, "localhost", "localhost", "127.0.0.1").Write(t, t.TempDir(), "shared", ca)
	key := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))
	args := []string{"--peer-tls-cert", f.Cert, "--peer-tls-key", f.Key, "--peer-tls-ca", f.CA, "--gossip-key", key}
	c := &testCluster{}
	c.add(t, args...)
	c.add(t, args...)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polling
		ok := true
		for _, n := range c.nodes {
			code, _ := readyz(t, n.HTTPAddr())
			ok = ok && code == http.StatusServiceUnavailable
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the shared-certificate pair is still ready after 20s")
		}
	}
	for i, n := range c.nodes {
		_, body := readyz(t, n.HTTPAddr())
		name := []string{"node-0", "node-1"}[i]
		if strings.Count(body, "\n") != 1 || !strings.HasPrefix(body, "not ready: this node's peer certificate") ||
			!strings.Contains(body, `does not name it (--node-name "`+name+`")`) || !strings.Contains(body, "--peer-tls-cert") {
			t.Errorf("%s: /readyz says %q, want one line naming the certificate, the node and the flag that fixes it", name, body)
		}
	}
	// node-1 shows in node-0's members as not admitted, with the reason.
	var out strings.Builder
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "node-1: not admitted: peer port") {
		if time.Now().After(deadline) {
			t.Fatalf("rlnode members printed:\n%s\nwant node-1 not admitted, with the reason", out.String())
		}
		out.Reset()
		if err := run(context.Background(), []string{"members", "--addr", c.nodes[0].HTTPAddr()}, env(nil), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // polling: the first check may be in flight
	}
	if !strings.Contains(out.String(), "not admitted  ") || !strings.Contains(out.String(), `does not name "node-1"`) {
		t.Errorf("rlnode members printed:\n%s\nwant node-1's state not admitted, and the reason below", out.String())
	}
}

// TestJoinTargetDownIsNotReady: a node whose --join answers no one is not
// ready, and /readyz names the address; the node --bootstrap names is
// ready alone. Before, a node that reached no one was not ready but did
// not say why.
func TestJoinTargetDownIsNotReady(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close() // no one listens there now
	waiting, _ := startNamedNode(t, "rl-2", "--join", down, "--bootstrap", "rl-1")
	first, _ := startNamedNode(t, "rl-1", "--join", down, "--bootstrap", "rl-1")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polling
		code, body := readyz(t, waiting.HTTPAddr())
		if code == http.StatusServiceUnavailable && strings.Contains(body, "not joined: no node answered") && strings.Contains(body, down) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rl-2: /readyz %d %q, want 503 saying no node answered --join %s", code, body, down)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polling
		if code, _ := readyz(t, first.HTTPAddr()); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			code, body := readyz(t, first.HTTPAddr())
			t.Fatalf("rl-1, the --bootstrap node: /readyz %d %q, want 200", code, body)
		}
	}
}
