package main

import (
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/node"
)

// secureArgs returns the flags of a node with mutual TLS on the peer port,
// from one certificate shared by node-0 .. node-2 (as the Helm chart's),
// and an encrypted gossip.
func secureArgs(t testing.TB) []string {
	t.Helper()
	ca := testpki.NewCA(t, "cluster")
	f := ca.Issue(t, "ringlimit", "node-0", "node-1", "node-2").Write(t, t.TempDir(), "peer", ca)
	key := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))
	return []string{"--peer-tls-cert", f.Cert, "--peer-tls-key", f.Key, "--peer-tls-ca", f.CA, "--gossip-key", key}
}

// TestClusterOverMutualTLS runs a cluster with peer TLS and a gossip key:
// it converges, checks forwarded between nodes are decided exactly, and
// forwards, GLOBAL reports and grants pass the identity checks (nothing
// is refused while they run). While the cluster forms, a node may refuse
// a call, a hand-off say, from a member its gossip has not told it of yet
// (not_member: the sender tries again): the refusals are counted from the
// converged cluster on.
func TestClusterOverMutualTLS(t *testing.T) {
	c := startCluster(t, 2, append(secureArgs(t), "--global-sync", "20ms")...)
	reasons := []string{"no_certificate", "wrong_name", "not_member"}
	refused := func(n *node.Node) (sum float64) {
		for _, reason := range reasons {
			sum += metric(t, n, `ringlimit_peer_refused_total{reason="`+reason+`"} `)
		}
		return sum
	}
	before := make([]float64, len(c.nodes))
	for i, n := range c.nodes {
		before[i] = refused(n)
	}
	item := &pb.CheckItem{Name: "tls", Key: "user:1", Limit: 10, DurationMs: 60_000}
	if got := c.burst(t, item, 300); got != 10 {
		t.Errorf("admitted %d of 300 on a limit of 10 over mutual TLS, want 10", got)
	}
	global := &pb.CheckItem{Name: "tls-global", Key: "user:2", Limit: 10, DurationMs: 60_000, Behavior: pb.Behavior_GLOBAL}
	if got := c.burst(t, global, 300); got < 1 || got > 10 {
		t.Errorf("GLOBAL admitted %d of 300 on a limit of 10, want 1 to 10", got)
	}
	for i, n := range c.nodes {
		if body := get(t, "http://"+n.HTTPAddr()+"/readyz"); body != "ready\n" {
			t.Errorf("node %d: /readyz = %q, want no warning", i, body)
		}
		for _, reason := range reasons {
			if metric(t, n, `ringlimit_peer_refused_total{reason="`+reason+`"} `) < 0 {
				t.Errorf("node %d: /metrics lacks ringlimit_peer_refused_total{reason=%q}", i, reason)
			}
		}
		if got := refused(n) - before[i]; got != 0 {
			t.Errorf("node %d refused %v peer calls for who sent them while the checks ran, want none", i, got)
		}
	}
}

// TestImpostorCertificateRefused: a node whose peer certificate, from the
// cluster CA, names another node gets through the handshake and holds the
// gossip key, but is not admitted to the ring: the honest node dials its
// peer port, finds a certificate for node-9 where node-1 should be, leaves
// it out of its ring (ringlimit_cluster_admission_failures_total counts
// it) and refuses its GLOBAL reports, as it is no member.
func TestImpostorCertificateRefused(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "cluster")
	key := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))
	args := func(cert testpki.Pair, prefix string) []string {
		f := cert.Write(t, dir, prefix, ca)
		return []string{"--peer-tls-cert", f.Cert, "--peer-tls-key", f.Key, "--peer-tls-ca", f.CA, "--gossip-key", key, "--global-sync", "20ms"}
	}
	c := &testCluster{}
	c.add(t, args(ca.Issue(t, "node-0", "node-0"), "honest")...)
	c.add(t, args(ca.Issue(t, "node-9", "node-9"), "impostor")...) // runs as node-1
	honest := c.nodes[0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling: gossip must reach it
		seen := slices.ContainsFunc(honest.Cluster().Members(), func(m cluster.MemberInfo) bool { return m.Name == "node-1" && m.State == cluster.Alive })
		if seen && metric(t, honest, "ringlimit_cluster_admission_failures_total ") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-0 saw node-1 (%v) but counted no failed admission", seen)
		}
	}
	for range 3 {
		c.clients[1].Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "imp", Key: "k", Limit: 10, DurationMs: 60_000, Behavior: pb.Behavior_GLOBAL}}})
	}
	if got := honest.Cluster().Ring().Len(); got != 1 {
		t.Errorf("node-0's ring holds %d members, want 1: node-1's certificate names node-9", got)
	}
	if honest.Cluster().Member("node-1") {
		t.Error("node-0 takes node-1 for a member")
	}
}

// metric returns the value of the series that starts with series on n's
// /metrics, or -1.
func metric(t testing.TB, n *node.Node, series string) float64 {
	t.Helper()
	body := get(t, "http://"+n.HTTPAddr()+"/metrics")
	i := strings.Index(body, "\n"+series)
	if i < 0 {
		return -1
	}
	v, _, _ := strings.Cut(body[i+1+len(series):], "\n")
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s%s: %v", series, v, err)
	}
	return f
}

// get returns the body of a GET of url.
func get(t testing.TB, url string) string {
	t.Helper()
	_, body := getStatus(t, url)
	return body
}

// getStatus returns the status and body of a GET of url.
func getStatus(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestReadyzWarnsWithoutSecurity: a node with neither peer TLS nor a gossip
// key says so in /readyz, and stays ready; one with only a gossip key names
// what is still missing.
func TestReadyzWarnsWithoutSecurity(t *testing.T) {
	plain, _ := startNamedNode(t, "plain")
	key := base64.StdEncoding.EncodeToString(make([]byte, 32))
	keyed, _ := startNamedNode(t, "keyed", "--gossip-key", key)
	for _, tc := range []struct {
		n        *node.Node
		want     []string
		unwanted string
	}{
		{plain, []string{"ready\nwarning: ", "--peer-tls-cert", "--gossip-key"}, ""},
		{keyed, []string{"ready\nwarning: ", "--peer-tls-cert"}, "--gossip-key"},
	} {
		var body string
		for deadline := time.Now().Add(10 * time.Second); !strings.HasPrefix(body, "ready"); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not ready: %q", body)
			}
			body = get(t, "http://"+tc.n.HTTPAddr()+"/readyz")
		}
		for _, w := range tc.want {
			if !strings.Contains(body, w) {
				t.Errorf("/readyz = %q, want it to contain %q", body, w)
			}
		}
		if tc.unwanted != "" && strings.Contains(body, tc.unwanted) {
			t.Errorf("/readyz = %q, names %q, which is configured", body, tc.unwanted)
		}
	}
}

func TestParseConfigTLS(t *testing.T) {
	k16 := base64.StdEncoding.EncodeToString(make([]byte, 16))
	k32 := base64.StdEncoding.EncodeToString(make([]byte, 32))
	c, err := parseConfig([]string{"--gossip-key", k32 + ", " + k16, "--peer-addr", ":8082"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.GossipKeys) != 2 || len(c.GossipKeys[0]) != 32 || len(c.GossipKeys[1]) != 16 {
		t.Errorf("gossip keys: %d, want 32 then 16 bytes", len(c.GossipKeys))
	}
	secret := base64.StdEncoding.EncodeToString([]byte("ten bytes!"))
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--gossip-key", secret}, nil, "--gossip-key: key 1: 10 bytes, want 16, 24 or 32"},
		{nil, map[string]string{"RLNODE_GOSSIP_KEY": k16 + ",%%%"}, "--gossip-key: key 2: not base64"},
		{[]string{"--gossip-key", ","}, nil, "--gossip-key: no key"},
		{[]string{"--peer-tls-cert", "a.crt", "--peer-tls-key", "a.key"}, nil, "--peer-tls-ca"},
		{[]string{"--tls-cert", "a.crt"}, nil, "--tls-key"},
		{[]string{"--tls-client-ca", "ca.crt"}, nil, "--tls-cert"},
	} {
		_, err := parseConfig(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want an error containing %q", tc.args, tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%v: the error repeats the key: %v", tc.args, err)
		}
	}
}

func TestServeRefusesMissingTLSFiles(t *testing.T) {
	dir := t.TempDir()
	conf, err := parseConfig([]string{"--peer-tls-cert", dir + "/no.crt", "--peer-tls-key", dir + "/no.key", "--peer-tls-ca", dir + "/ca.crt",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = serve(t.Context(), conf, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), "--peer-tls-") || !strings.Contains(err.Error(), "no.crt") {
		t.Errorf("serve with missing certificate files: %v, want an error naming the flag and the file", err)
	}
}

// TestClientCommandsOverTLS serves TLS with client certificates on the
// public ports and runs check, members and bench (both protocols) against
// it, with the matching flags and without them.
func TestClientCommandsOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "public")
	srv := ca.Issue(t, "rlnode", "127.0.0.1").Write(t, dir, "server", ca)
	cli := ca.Issue(t, "ops").Write(t, dir, "client", ca)
	n, _ := startNamedNode(t, "tls-node", "--tls-cert", srv.Cert, "--tls-key", srv.Key, "--tls-client-ca", srv.CA)
	flags := []string{"--tls-ca", srv.CA, "--tls-cert", cli.Cert, "--tls-key", cli.Key}
	bench := []string{"--count", "20", "--concurrency", "2", "--duration", "10s"}

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"check", []string{"check", "--addr", n.GRPCAddr(), "--key", "user:1", "--limit", "10"}},
		{"members", []string{"members", "--addr", n.HTTPAddr()}},
		{"bench grpc", append([]string{"bench", "--addr", n.GRPCAddr(), "--protocol", "grpc"}, bench...)},
		{"bench http", append([]string{"bench", "--addr", n.HTTPAddr(), "--protocol", "http"}, bench...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			if err := run(t.Context(), slices.Concat(tc.args, flags), env(nil), &out, &errOut); err != nil {
				t.Fatalf("with TLS flags: %v\n%s", err, errOut.String())
			}
			if err := run(t.Context(), slices.Concat(tc.args, []string{"--timeout", "2s"}), env(nil), io.Discard, io.Discard); err == nil {
				t.Error("without TLS flags: succeeded against a TLS node")
			}
			noCert := slices.Concat(tc.args, []string{"--tls-ca", srv.CA, "--timeout", "2s"})
			if err := run(t.Context(), noCert, env(nil), io.Discard, io.Discard); err == nil {
				t.Error("without a client certificate: succeeded against a node with --tls-client-ca")
			}
		})
	}
}
