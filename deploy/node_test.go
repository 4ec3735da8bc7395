package deploy

import (
	"bufio"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// node is an rlnode process on loopback, started by startNode.
type node struct {
	http, grpc string // host:port
}

var servingLine = regexp.MustCompile(`msg="rlnode serving".* http=(\S+) grpc=(\S+)`)

// startNode runs rlnode alone on free loopback ports and stops it (SIGTERM,
// then SIGKILL) when the test ends.
func startNode(t *testing.T, args ...string) node {
	t.Helper()
	args = append([]string{"--http-addr=127.0.0.1:0", "--grpc-addr=127.0.0.1:0",
		"--peer-addr=127.0.0.1:0", "--gossip-addr=127.0.0.1:0", "--node-name=dashboard-test"}, args...)
	cmd := exec.Command(bin.rlnode, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	found := make(chan node, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := servingLine.FindStringSubmatch(sc.Text()); m != nil {
				found <- node{http: m[1], grpc: m[2]}
			}
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
	}()
	select {
	case n := <-found:
		waitReady(t, "http://"+n.http, 10*time.Second)
		return n
	case <-exited:
		t.Fatal("rlnode exited before serving")
	case <-time.After(10 * time.Second):
		t.Fatal("rlnode did not log its addresses within 10s")
	}
	return node{}
}

// waitReady polls base/readyz until it answers 200.
func waitReady(t *testing.T, base string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, _, err := get(base + "/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/readyz: not 200 within %v (last: %d, %v)", base, within, code, err)
		}
		time.Sleep(100 * time.Millisecond) // polling a process, not timing logic
	}
}

// get fetches url with a short timeout.
func get(url string) (int, string, error) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b), err
}

// post sends a JSON body with a short timeout.
func post(url, body string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b), err
}
