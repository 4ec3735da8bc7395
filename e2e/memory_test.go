package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// The words of the errors a node sheds load with (limiter.ErrFull,
// admit's memory refusal): the tests look for them, so that a node that
// refused for another reason does not pass.
const (
	fullError   = "no room for a new counter"
	memoryError = "share of --memory-limit"
)

// rawClient is a ringlimit.v1 client of n's gRPC port that sends each
// request as given: the Go client would split and route it.
func rawClient(t *testing.T, n *node) pb.RateLimiterClient {
	t.Helper()
	cc, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewRateLimiterClient(cc)
}

// floodKeys sends requests of 1,000 items, each a distinct key of keyLen
// bytes made from prefix, until total keys are sent, from workers
// goroutines, and returns how many items the node answered with
// fullError. Every other item error fails the test.
func floodKeys(t *testing.T, rl pb.RateLimiterClient, prefix string, total, keyLen, workers int) int64 {
	t.Helper()
	const per = 1000
	var next, refused atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for range workers {
		wg.Go(func() {
			pad := strings.Repeat("x", max(0, keyLen-len(prefix)-12))
			for {
				first := next.Add(per) - per
				if first >= int64(total) {
					return
				}
				req := &pb.CheckRequest{Requests: make([]*pb.CheckItem, per)}
				for i := range per {
					req.Requests[i] = &pb.CheckItem{Name: "api", Key: fmt.Sprintf("%s%s%012d", prefix, pad, first+int64(i)),
						Limit: 5, DurationMs: hour}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 4*rpcTimeout)
				resp, err := rl.Check(ctx, req)
				cancel()
				if err != nil {
					once.Do(func() { t.Errorf("flood request at key %d: %v", first, err) })
					return
				}
				for _, r := range resp.GetResponses() {
					switch {
					case r.GetError() == "":
					case strings.Contains(r.GetError(), fullError) && r.GetErrorCode() == pb.ErrorCode_UNAVAILABLE:
						refused.Add(1)
					default:
						once.Do(func() {
							t.Errorf("flood item: error %q (%v), want none or %q", r.GetError(), r.GetErrorCode(), fullError)
						})
					}
				}
			}
		})
	}
	wg.Wait()
	return refused.Load()
}

// TestKeyFloodSpentUsers is issue 24's key flood over gRPC: 200 users
// spend their limit, then 1.1 million distinct keys arrive at the default
// --max-keys. Before issue 24 the flood evicted the spent users' counters
// and every one was admitted again; then the keys the node had no room
// for were refused (issue 33's lock-out). Now no spent user is admitted
// and no key of the flood is refused: the counters evicted keep their
// debts (limiter/debts.go).
func TestKeyFloodSpentUsers(t *testing.T) {
	c := startCluster(t, 1, "--memory-limit", "1GiB") // not the host's: room for the default --max-keys
	rl := rawClient(t, c.nodes[0])
	users := func(hits int64) *pb.CheckRequest {
		req := &pb.CheckRequest{}
		for i := range 200 {
			req.Requests = append(req.Requests, &pb.CheckItem{Name: "api", Key: fmt.Sprint("user:", i), Hits: &hits, Limit: 5, DurationMs: hour})
		}
		return req
	}
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	resp, err := rl.Check(ctx, users(5))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.GetResponses() {
		if r.GetStatus() != pb.Status_UNDER_LIMIT || r.GetError() != "" {
			t.Fatalf("user %d spending its limit: %v", i, r)
		}
	}
	start := time.Now()
	refused := floodKeys(t, rl, "flood:", 1_100_000, 0, 4)
	t.Logf("1,100,000 keys sent in %v; %d refused", time.Since(start).Round(time.Millisecond), refused)
	if refused > 0 {
		t.Errorf("%d keys of the flood refused with %q: new keys locked out", refused, fullError)
	}
	ctx, cancel = context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	if resp, err = rl.Check(ctx, users(1)); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for _, r := range resp.GetResponses() {
		if r.GetStatus() == pb.Status_UNDER_LIMIT {
			admitted++
		}
	}
	if admitted > 0 {
		t.Errorf("%d of 200 spent users admitted again after the flood", admitted)
	}
}

// TestKeyFloodNewUsers is issue 33's key flood over gRPC against a node
// with --max-keys 20000: 100 users spend their limit (1 an hour), then
// 100,000 distinct keys each spend part of theirs, then the 100 spent
// users and 100 new users check. On main the spent users stayed refused
// but every new user was refused too ("no room for a new counter",
// until the debts refill, up to an hour); now at least 99 of each are
// answered right, and the node's RSS stays small.
func TestKeyFloodNewUsers(t *testing.T) {
	c := startCluster(t, 1, "--max-keys", "20000")
	n := c.nodes[0]
	rl := rawClient(t, n)
	one := int64(1)
	users := func(prefix string) *pb.CheckRequest {
		req := &pb.CheckRequest{}
		for i := range 100 {
			req.Requests = append(req.Requests, &pb.CheckItem{Name: "api", Key: fmt.Sprint(prefix, i), Hits: &one, Limit: 1, DurationMs: hour})
		}
		return req
	}
	admitted := func(prefix string) int {
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer cancel()
		resp, err := rl.Check(ctx, users(prefix))
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, r := range resp.GetResponses() {
			if r.GetStatus() == pb.Status_UNDER_LIMIT && r.GetError() == "" {
				k++
			}
		}
		return k
	}
	if k := admitted("spent:"); k != 100 {
		t.Fatalf("%d of 100 users admitted spending their limit", k)
	}
	start := time.Now()
	refused := floodKeys(t, rl, "flood:", 100_000, 0, 4)
	t.Logf("100,000 keys sent in %v; %d refused", time.Since(start).Round(time.Millisecond), refused)
	spent, fresh := admitted("spent:"), admitted("new:")
	t.Logf("after the flood: %d of 100 spent users admitted, %d of 100 new users", spent, fresh)
	if spent > 1 || fresh < 99 {
		t.Errorf("%d of 100 spent users admitted (want at most 1), %d of 100 new users (want at least 99)", spent, fresh)
	}
	if _, err := procStatusKB(n.cmd.Process.Pid, "VmHWM"); err == nil {
		report(t, n, "after the flood")
	}
}

// memoryMargin is what TestMemoryLimitHolds lets the node's peak RSS
// exceed --memory-limit by: what the Go runtime's soft limit does not
// cover (the binary's text and data, and memory the runtime has freed but
// the kernel has not yet taken back).
const memoryMargin = 40 << 20

// TestMemoryLimitHolds is issue 24's memory floods against a node with
// --memory-limit 200MiB: a flood of distinct keys of 1 KB (before issue
// 24 its heap grew past 1.7 GB), then 300 concurrent maximal HTTP
// checks. The node holds the keys within the counters' share, evicting
// counters and keeping their debts (it refused the keys beyond room until
// issue 33), sheds the checks with their clear error, and its peak RSS
// (VmHWM, read from /proc) stays within the limit and memoryMargin.
func TestMemoryLimitHolds(t *testing.T) {
	const limit = 200 << 20
	c := startCluster(t, 1, "--memory-limit", "200MiB")
	n := c.nodes[0]
	if _, err := procStatusKB(n.cmd.Process.Pid, "VmHWM"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	start := time.Now()
	refused := floodKeys(t, rawClient(t, n), "long:", 300_000, 1000, 4)
	t.Logf("key flood: 300,000 keys of 1 KB sent in %v; %d refused", time.Since(start).Round(time.Millisecond), refused)
	if refused > 0 {
		t.Errorf("%d keys of the flood refused with %q: new keys locked out", refused, fullError)
	}
	report(t, n, "after the key flood")

	start = time.Now()
	ok, shed := floodHTTP(t, n, 300)
	t.Logf("HTTP flood: 300 maximal checks in %v: %d answered, %d shed", time.Since(start).Round(time.Millisecond), ok, shed)
	if shed == 0 {
		t.Errorf("no maximal HTTP check shed with 503 and %q", memoryError)
	}
	if hwm := report(t, n, "after the HTTP flood"); hwm > limit+memoryMargin {
		t.Errorf("peak RSS %d MiB, more than --memory-limit 200 MiB and the margin of %d MiB", hwm>>20, memoryMargin>>20)
	}
}

// report logs n's peak and current RSS and returns the peak, in bytes.
func report(t *testing.T, n *node, when string) int64 {
	t.Helper()
	hwm, err := procStatusKB(n.cmd.Process.Pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	rss, _ := procStatusKB(n.cmd.Process.Pid, "VmRSS")
	t.Logf("%s: VmHWM %d MiB, VmRSS %d MiB", when, hwm>>10, rss>>10)
	return hwm << 10
}

// procStatusKB returns a field of /proc/<pid>/status in kB.
func procStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// floodHTTP sends conns concurrent POST /v1/check of a body near
// api.MaxBodyBytes (1,000 items with the longest name and key), and
// returns how many were answered 200 and how many shed with 503 and
// memoryError. Any other answer fails the test; a connection the node
// closed while the body was still being sent (it answers a shed request
// without reading its body) counts as neither.
func floodHTTP(t *testing.T, n *node, conns int) (ok, shed int64) {
	t.Helper()
	type item struct {
		Name       string `json:"name"`
		Key        string `json:"key"`
		Limit      int64  `json:"limit"`
		DurationMs int64  `json:"duration_ms"`
	}
	var req struct {
		Requests []item `json:"requests"`
	}
	for i := range 1000 {
		req.Requests = append(req.Requests, item{Name: strings.Repeat("n", 256), Key: fmt.Sprintf("%01020d", i), Limit: 5, DurationMs: hour})
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxConnsPerHost: conns, MaxIdleConnsPerHost: conns}}
	defer client.CloseIdleConnections()
	var okN, shedN atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for range conns {
		wg.Go(func() {
			resp, err := client.Post("http://"+n.http+"/v1/check", "application/json", bytes.NewReader(body))
			if err != nil {
				return // closed by the node while sending: see above
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			switch {
			case resp.StatusCode == http.StatusOK:
				okN.Add(1)
			case resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(b, []byte(memoryError)):
				shedN.Add(1)
			default:
				once.Do(func() { t.Errorf("a maximal check: %d %s", resp.StatusCode, b) })
			}
		})
	}
	wg.Wait()
	return okN.Load(), shedN.Load()
}

// TestGRPCMemoryLimitHolds is issue 33's gRPC memory flood: 300
// concurrent maximal gRPC checks (1,000 items with the longest name, key
// and parent key, 1.6 MB each) against a node with --memory-limit 200MiB.
// On main each was accounted at 64 KiB, all were admitted, and the node
// peaked at 592 MB (the figure); now a call is accounted at its
// largest message until it has arrived and then at its real size, so the
// node sheds most of them with the memory error (RESOURCE_EXHAUSTED) and
// its peak RSS stays within the limit and memoryMargin.
func TestGRPCMemoryLimitHolds(t *testing.T) {
	const limit = 200 << 20
	c := startCluster(t, 1, "--memory-limit", "200MiB")
	n := c.nodes[0]
	if _, err := procStatusKB(n.cmd.Process.Pid, "VmHWM"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	report(t, n, "at start")
	start := time.Now()
	ok, shed := floodGRPC(t, n, 300, 4)
	t.Logf("gRPC flood: 300 maximal checks in %v: %d answered, %d shed", time.Since(start).Round(time.Millisecond), ok, shed)
	if shed == 0 {
		t.Errorf("no maximal gRPC check shed with %q", memoryError)
	}
	if hwm := report(t, n, "after the gRPC flood"); hwm > limit+memoryMargin {
		t.Errorf("peak RSS %d MiB, more than --memory-limit 200 MiB and the margin of %d MiB", hwm>>20, memoryMargin>>20)
	}
}

// floodGRPC sends calls concurrent maximal checks over conns connections
// of n's gRPC port and returns how many were answered and how many shed
// with memoryError. Any other answer fails the test.
func floodGRPC(t *testing.T, n *node, calls, conns int) (ok, shed int64) {
	t.Helper()
	req := &pb.CheckRequest{}
	for i := range 1000 {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: strings.Repeat("n", 256), Key: fmt.Sprintf("%01024d", i),
			Limit: 5, DurationMs: hour, Parent: &pb.ParentLimit{Key: strings.Repeat("p", 256), Limit: 5, DurationMs: hour}})
	}
	clients := make([]pb.RateLimiterClient, conns)
	for i := range clients {
		clients[i] = rawClient(t, n)
	}
	var okN, shedN atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			_, err := clients[i%conns].Check(ctx, req)
			switch {
			case err == nil:
				okN.Add(1)
			case strings.Contains(err.Error(), memoryError):
				shedN.Add(1)
			default:
				once.Do(func() { t.Errorf("a maximal gRPC check: %v", err) })
			}
		})
	}
	wg.Wait()
	return okN.Load(), shedN.Load()
}
