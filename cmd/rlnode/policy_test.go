package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/syncbuf"
	"github.com/ringlimit/ringlimit/node"
)

// TestServeRLSWithPolicyFile: a node given --policy-file answers Envoy's
// rate limit service on its gRPC port and native checks that name a
// policy, and reloads an edited file.
func TestServeRLSWithPolicyFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "envoy.yaml")
	write := func(rpu string) {
		t.Helper()
		y := "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: " + rpu + "}\n"
		if err := os.WriteFile(file, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	httpAddr, grpcAddr, stop := startNode(t, "--policy-file", dir)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rl := rlspb.NewRateLimitServiceClient(conn)
	ask := func(ip string) *rlspb.RateLimitResponse {
		t.Helper()
		resp, err := rl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
			Descriptors: []*commonpb.RateLimitDescriptor{{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "ip", Value: ip}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := ask("a"); r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit.RequestsPerUnit != 1 {
		t.Errorf("first: %v", r)
	}
	if r := ask("a"); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("second: %v", r)
	}
	resp, err := http.Post("http://"+httpAddr+"/v1/check", "application/json",
		strings.NewReader(`{"requests":[{"key":"user:1","policy":"edge/ip"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"status":"UNDER_LIMIT","limit":1,"remaining":0`) {
		t.Errorf("native check naming a policy: %s", b)
	}

	write("5")
	for deadline := time.Now().Add(10 * time.Second); ask("b").Statuses[0].CurrentLimit.RequestsPerUnit != 5; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the edited policy file was not reloaded within 10s")
		}
	}
	if err := stop(); err != nil {
		t.Errorf("serve: %v", err)
	}
}

func TestServeRLSWithoutPolicyFile(t *testing.T) {
	_, grpcAddr, _ := startNode(t)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
		Descriptors: []*commonpb.RateLimitDescriptor{{Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "ip", Value: "a"}}}}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ShouldRateLimit without policies: %v, want FailedPrecondition", err)
	}
}

func TestServeRejectsBrokenPolicyFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte("domain: a\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf, err := parseConfig([]string{"--policy-file", file, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--peer-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = serve(context.Background(), conf, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), "p.yaml:2: bogus: unknown key") {
		t.Errorf("serve = %v, want the file's error", err)
	}
}

func TestPolicyCheckCommand(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"policy", "check", "../../policy/testdata/example.yaml"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"edge/remote_address     5/second FIXED_WINDOW ",
		"edge/tier=free          100/month SLIDING_WINDOW soft +10% (enforced 110) name=free  ",
		" ../../policy/testdata/example.yaml:32\n",
		"edge/path=%2Fapi%2F*",
		"edge/login              20/hour GCRA min_interval=2s ",
		`edge/tenant             100/minute TOKEN_BUCKET ceiling=1000 parent="edge/tenant":10000/minute `,
		"edge/model              20000/minute TOKEN_BUCKET reserve_ttl=10m0s ",
		"example.yaml: OK, 18 policies",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"policy", "check", file}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.HasSuffix(err.Error(), `p.yaml:4: descriptors[0].rate_limit.unit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)`) {
		t.Errorf("broken file: %v", err)
	}
	var stderr strings.Builder
	if code := exitCode(err, &stderr); code != 1 || !strings.Contains(stderr.String(), "p.yaml:4:") {
		t.Errorf("broken file: exit %d, stderr %q; want 1 and the file's error", code, stderr.String())
	}
	if err := run(context.Background(), []string{"policy", "lint"}, env(nil), io.Discard, io.Discard); err == nil || !strings.HasPrefix(err.Error(), "usage:") {
		t.Errorf("bad usage: %v", err)
	}
}

// TestPolicyCheckFailsOnNothing: a path that holds no policy fails, exit
// 1, saying so, rather than pass as "OK, 0 policies": an empty directory,
// one of other files, and a file whose domains set no rate_limit.
func TestPolicyCheckFailsOnNothing(t *testing.T) {
	empty := t.TempDir()
	others := t.TempDir()
	if err := os.WriteFile(filepath.Join(others, "README.md"), []byte("domain: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	limitless := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(limitless, []byte("domain: a\ndescriptors:\n  - key: k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{empty: "no policy files", others: "no policy files", limitless: "no policy: its 1 domain(s) set no rate_limit"} {
		var out, stderr strings.Builder
		err := run(context.Background(), []string{"policy", "check", path}, env(nil), &out, &stderr)
		if code := exitCode(err, &stderr); code != 1 || !strings.Contains(stderr.String(), want) || strings.Contains(out.String(), "OK") {
			t.Errorf("policy check %s: exit %d, stdout %q, stderr %q; want 1 and an error saying %q", path, code, out.String(), stderr.String(), want)
		}
	}
}

// TestPolicyHelp: `rlnode help policy`, `rlnode policy -h` and `rlnode
// policy check --help` print the usage and exit 0; bad usage exits 2.
func TestPolicyHelp(t *testing.T) {
	for _, args := range [][]string{{"help", "policy"}, {"policy", "-h"}, {"policy", "check", "--help"}, {"policy", "check", "-h", "x.yaml"}} {
		var out strings.Builder
		err := run(context.Background(), args, env(nil), &out, &out)
		if code := exitCode(err, io.Discard); code != 0 || !strings.Contains(out.String(), "Usage: rlnode policy check PATH") ||
			!strings.Contains(out.String(), "Exit status: 0 the policies are valid, 1 they are not") {
			t.Errorf("rlnode %s: exit %d (%v), printed %q; want 0 and the usage", strings.Join(args, " "), code, err, out.String())
		}
	}
	for _, args := range [][]string{{"policy"}, {"policy", "check"}, {"policy", "check", "a", "b"}, {"policy", "lint", "a"}} {
		err := run(context.Background(), args, env(nil), io.Discard, io.Discard)
		if code := exitCode(err, io.Discard); code != 2 || !strings.Contains(err.Error(), "usage: rlnode policy check PATH") {
			t.Errorf("rlnode %s: exit %d (%v); want 2 and the usage", strings.Join(args, " "), code, err)
		}
	}
}

// TestServeLogsPolicies: a node started with policies says which it
// loaded; a reference whose value is not escaped is refused with a hint
// at the escaped one.
func TestServeLogsPolicies(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte("domain: edge\ndescriptors:\n  - key: path\n    value: /api/*\n    rate_limit: {unit: minute, requests_per_unit: 4}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf, err := parseConfig([]string{"--policy-file", file, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--peer-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--node-name", "p"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	nodes, done := make(chan *node.Node, 1), make(chan error, 1)
	go func() {
		done <- serve(ctx, conf, slog.New(slog.NewTextHandler(&logs, nil)), func(n *node.Node) { nodes <- n })
	}()
	defer func() { cancel(); <-done }()
	n := <-nodes
	if want := `msg="policies loaded" path=` + file + ` domains=1 policies=1 domain_names=edge refs="edge/path=%2Fapi%2F*"`; !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs.String())
	}
	resp, err := http.Post("http://"+n.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(`{"requests":[{"key":"k","policy":"edge/path=/api/users"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `did you mean \"edge/path=%2Fapi%2Fusers\"?`; !strings.Contains(string(b), want) {
		t.Errorf("a reference without its escapes: %s; want the error to say %s", b, want)
	}
}
