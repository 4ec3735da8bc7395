package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/status"
)

// Keys a test makes hot: hotKey is checked 120 times under a limit of 40
// (80 refused), warmKey 60 times, and 20 cold keys once each, all through
// one node, which forwards each check to its key's owner.
const (
	hotKey, warmKey   = "tenant:hot", "tenant:warm"
	hotChecks, hotCap = 120, 40
	warmChecks        = 60
	coldKeys          = 20
)

// makeHot sends the checks of the keys above through n.
func makeHot(t *testing.T, n *node) {
	t.Helper()
	send := func(key string, limit int64) {
		if _, err := check(n, &pb.CheckItem{Name: "api", Key: key, Limit: limit, DurationMs: hour}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range hotChecks {
		send(hotKey, hotCap)
		if i < warmChecks {
			send(warmKey, 1000)
		}
		if i < coldKeys {
			send(fmt.Sprint("tenant:cold", i), 1000)
		}
	}
}

// TestTopAcrossCluster: GET /v1/top on any node counts each check once,
// at the owner that decided it, and shows the keys a test made hot;
// `rlnode top --once` prints them. The window is long enough for no
// count to be forgotten, so the counts are exact (each node has seen
// fewer distinct keys than its sketch holds).
func TestTopAcrossCluster(t *testing.T) {
	c := startCluster(t, 3, "--top-window", "10m")
	makeHot(t, c.nodes[0])
	var v status.View
	poll(t, convergeTimeout, "GET /v1/top counts every check", func() (bool, string) {
		code, body, err := httpGet(c.nodes[2].http + "/v1/top?keys=5")
		if err != nil || code != 200 {
			return false, fmt.Sprintf("%d %v", code, err)
		}
		v = status.View{}
		if err := json.Unmarshal(body, &v); err != nil {
			return false, err.Error()
		}
		return v.Checks == hotChecks+warmChecks+coldKeys, fmt.Sprintf("%d checks counted", v.Checks)
	})
	if len(v.Nodes) != 3 {
		t.Fatalf("%d nodes in the view, want 3: %+v", len(v.Nodes), v.Nodes)
	}
	for _, n := range v.Nodes {
		if n.Error != "" {
			t.Errorf("%s: %s", n.Name, n.Error)
		}
	}
	if v.Refusals != hotChecks-hotCap || len(v.Limits) != 1 || v.Limits[0].Name != "api" {
		t.Fatalf("%d refusals, limits %+v; want %d, api alone", v.Refusals, v.Limits, hotChecks-hotCap)
	}
	api := v.Limits[0]
	if len(api.Hot) != 5 || api.Hot[0].Key != hotKey || api.Hot[0].Checks != hotChecks || api.Hot[0].Refusals != hotChecks-hotCap ||
		api.Hot[1].Key != warmKey || api.Hot[1].Checks != warmChecks || api.Hot[0].ChecksPerSecond <= 0 {
		t.Errorf("hot %+v, want %s (%d checks, %d refused), %s (%d), three cold keys", api.Hot, hotKey, hotChecks, hotChecks-hotCap, warmKey, warmChecks)
	}
	if len(api.Refused) != 1 || api.Refused[0].Key != hotKey || api.Refused[0].Refusals != hotChecks-hotCap {
		t.Errorf("refused %+v, want %s alone, %d refused", api.Refused, hotKey, hotChecks-hotCap)
	}

	out, err := exec.Command(rlnodeBin, "top", "--once", "--keys", "3", "--addr", c.nodes[1].http).CombinedOutput()
	if err != nil {
		t.Fatalf("rlnode top --once: %v\n%s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	var keys []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "api" {
			keys = append(keys, f[1])
		}
	}
	if len(keys) != 3 || keys[0] != hotKey || keys[1] != warmKey {
		t.Errorf("rlnode top --once listed keys %q, want %s, %s, then a cold one:\n%s", keys, hotKey, warmKey, out)
	}
	for _, n := range c.nodes {
		if !strings.Contains(string(out), n.name+" ") {
			t.Errorf("rlnode top --once does not list member %s:\n%s", n.name, out)
		}
	}
	if strings.Contains(string(out), "\x1b") {
		t.Errorf("rlnode top --once wrote terminal codes")
	}
	out, err = exec.Command(rlnodeBin, "top", "--once", "--sort", "refusals", "--addr", c.nodes[0].http).CombinedOutput()
	if err != nil || !strings.Contains(string(out), hotKey) || strings.Contains(string(out), warmKey) {
		t.Errorf("rlnode top --once --sort refusals: %v; want %s alone:\n%s", err, hotKey, out)
	}
}

// TestStatusPageInBrowser loads the status page of a 3-node cluster in a
// real headless Chromium, with JavaScript off, and checks what it shows:
// the members, the hot keys and the ring changes. It writes a screenshot;
// RINGLIMIT_STATUS_SCREENSHOT names a file to copy it to (how
// docs/status.png is made).
func TestStatusPageInBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
	}
	c := startCluster(t, 3, "--top-window", "10m")
	makeHot(t, c.nodes[0])
	evil := "<img src=x onerror=alert(1)>"
	if _, err := check(c.nodes[0], &pb.CheckItem{Name: "api", Key: evil, Limit: 5, DurationMs: hour}); err != nil {
		t.Fatal(err)
	}
	url := "http://" + c.nodes[1].http + "/status?refresh=0"
	// The view is complete once the node can ask every member.
	poll(t, convergeTimeout, "the page counts every check", func() (bool, string) {
		code, body, err := httpGet(c.nodes[1].http + "/v1/top")
		var v status.View
		if err != nil || code != 200 || json.Unmarshal(body, &v) != nil {
			return false, fmt.Sprint(code, err)
		}
		return v.Checks == hotChecks+warmChecks+coldKeys+1, fmt.Sprintf("%d checks", v.Checks)
	})

	dir := t.TempDir()
	browse := func(args ...string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-javascript",
			"--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1100,1500"}
		cmd := exec.CommandContext(ctx, chromium, append(append(base, args...), url)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.Bytes()
	}
	dom := string(browse("--dump-dom"))
	if !strings.Contains(dom, "ringlimit status") {
		t.Fatalf("chromium --dump-dom did not show the page:\n%.2000s", dom)
	}
	for _, want := range []string{
		`id="members"`, `id="hot"`, `id="refused"`, `id="changes"`,
		hotKey, warmKey, "3 of 3 members alive",
		"&lt;img src=x onerror=alert(1)&gt;", // a key is text, never markup
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page in Chromium lacks %q", want)
		}
	}
	for _, n := range c.nodes {
		if !strings.Contains(dom, "<td>"+n.name) {
			t.Errorf("the page does not list member %s", n.name)
		}
	}
	// Node 1 saw node 2 join: a ring change naming it.
	if !strings.Contains(dom, "<td>"+c.nodes[2].name+"</td>") {
		t.Errorf("the ring changes do not show %s joining", c.nodes[2].name)
	}
	if strings.Contains(dom, "<img") {
		t.Errorf("a key became markup in the page")
	}

	shot := filepath.Join(dir, "status.png")
	browse("--screenshot=" + shot)
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 1000 || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot: %v, %d bytes; want a PNG", err, len(png))
	}
	if to := os.Getenv("RINGLIMIT_STATUS_SCREENSHOT"); to != "" {
		if err := os.WriteFile(to, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
