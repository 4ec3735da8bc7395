package status

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/top"
)

var t0 = time.Date(2026, 11, 26, 5, 0, 0, 0, time.UTC)

type local struct{ tr *top.Tracker }

func (l local) Top(keys int) top.Report       { return l.tr.Report(t0.Add(10*time.Second), keys) }
func (l local) ReplicationLag() time.Duration { return 120 * time.Millisecond }

// fixture is a cluster of three as node a sees it: b answers with its
// counts, c does not answer.
func fixture(t *testing.T, conf Config) (*httptest.Server, *atomic.Int32) {
	tr := top.New(top.Config{}, t0)
	for i := range 30 {
		tr.Record("api", "user:<script>alert(1)</script>", i%3 != 0)
		tr.Record("api", "user:2", true)
	}
	b := top.Report{Seconds: 10, Checks: 50, Refusals: 40, Limits: []top.Limit{{Name: "login", Checks: 50,
		Hot: []top.Key{{Key: "ip:9", Checks: 50, Refusals: 40}}, Refused: []top.Key{{Key: "ip:9", Checks: 50, Refusals: 40}}}}}
	b.SetRates()
	conf.Local = local{tr}
	conf.Members = func() []api.Member {
		return []api.Member{
			{Name: "a", State: "alive", Share: 0.4, Self: true, PeerAddr: "a:1"},
			{Name: "b", State: "alive", Share: 0.3, PeerAddr: "b:1"},
			{Name: "c", State: "alive", Share: 0.3, PeerAddr: "c:1"},
		}
	}
	var asked atomic.Int32
	conf.Ask = func(_ context.Context, addr string, keys int) (top.Report, time.Duration, error) {
		asked.Add(1)
		if addr == "b:1" {
			return b, 2 * time.Second, nil
		}
		return top.Report{}, 0, errors.New("top to c:1: unreachable")
	}
	conf.Changes = &Changes{}
	conf.Changes.Record(t0, []string{"a"})
	conf.Changes.Record(t0.Add(time.Second), []string{"a", "b", "c"})
	if conf.Now == nil {
		conf.Now = func() time.Time { return t0.Add(10 * time.Second) }
	}
	mux := http.NewServeMux()
	New(conf).Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &asked
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

func TestTopMergesMembers(t *testing.T) {
	srv, _ := fixture(t, Config{Page: true})
	code, _, body := get(t, srv.URL+"/v1/top?keys=5")
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var v View
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	if v.Checks != 110 || v.Refusals != 50 || len(v.Limits) != 2 || v.Limits[0].Name != "api" || v.Limits[1].Name != "login" {
		t.Fatalf("merged %+v, want 110 checks, 50 refusals, api then login", v.Report)
	}
	if k := v.Limits[1].Refused[0]; k.Key != "ip:9" || k.RefusalsPerSecond != 4 {
		t.Errorf("login's most refused %+v, want ip:9 at 4/s", k)
	}
	if len(v.Nodes) != 3 || v.Nodes[1].ReplicationLagSeconds != 2 || v.Nodes[1].ChecksPerSecond != 5 ||
		!strings.Contains(v.Nodes[2].Error, "unreachable") || v.Nodes[0].ReplicationLagSeconds != 0.12 {
		t.Errorf("nodes %+v, want a (0.12s lag), b (5/s, 2s lag), c unreachable", v.Nodes)
	}
}

func TestTopKeysParam(t *testing.T) {
	srv, _ := fixture(t, Config{})
	for _, q := range []string{"0", "65", "x", "-1"} {
		code, _, body := get(t, srv.URL+"/v1/top?keys="+q)
		if code != http.StatusBadRequest || !strings.Contains(body, `"error":"keys:`) {
			t.Errorf("keys=%s: %d %s, want 400 naming keys", q, code, body)
		}
	}
}

// The page shows the members, the hot keys and the ring changes, with
// every key escaped: keys are the clients'.
func TestPage(t *testing.T) {
	srv, _ := fixture(t, Config{Page: true})
	code, h, body := get(t, srv.URL+"/status")
	if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Fatalf("status %d, %s", code, h.Get("Content-Type"))
	}
	if !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("CSP %q, want default-src 'none'", h.Get("Content-Security-Policy"))
	}
	for _, want := range []string{
		`<b id="self">a</b>`, "3 of 3 members alive", "40.0%", "not answered: top to c:1: unreachable", "2s",
		"user:&lt;script&gt;alert(1)&lt;/script&gt;", "ip:9", "<td>b, c</td>", `<meta http-equiv="refresh" content="5">`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, "<script>") || strings.Contains(body, "src=") {
		t.Errorf("page holds a script or loads something:\n%s", body)
	}
	if _, _, root := get(t, srv.URL+"/?refresh=0"); !strings.Contains(root, "ringlimit status") || strings.Contains(root, "http-equiv") {
		t.Errorf("GET /?refresh=0: want the page, without its refresh")
	}
	if code, _, _ := get(t, srv.URL+"/status?refresh=9999"); code != http.StatusBadRequest {
		t.Errorf("refresh=9999: %d, want 400", code)
	}
}

// TestUnknownDomainsListed: the domains Envoy asked for that no policy
// file has are on the page (escaped) and in GET /v1/top.
func TestUnknownDomainsListed(t *testing.T) {
	srv, _ := fixture(t, Config{Page: true, UnknownDomains: func() []string { return []string{"<edgee>", "typo"} }})
	_, _, body := get(t, srv.URL+"/status")
	if !strings.Contains(body, `id="unknown-domains"`) || !strings.Contains(body, "&lt;edgee&gt;, typo") {
		t.Errorf("page lacks the unknown domains:\n%s", body)
	}
	if _, _, js := get(t, srv.URL+"/v1/top"); !strings.Contains(js, `"unknown_domains":["\u003cedgee\u003e","typo"]`) {
		t.Errorf("GET /v1/top lacks the unknown domains: %s", js)
	}
}

func TestPageOptOut(t *testing.T) {
	srv, _ := fixture(t, Config{Page: false})
	if code, _, _ := get(t, srv.URL+"/status"); code != http.StatusNotFound {
		t.Errorf("GET /status with the page off: %d, want 404", code)
	}
	if code, _, _ := get(t, srv.URL+"/v1/top"); code != http.StatusOK {
		t.Errorf("GET /v1/top with the page off: %d, want 200", code)
	}
}

func TestHideKeys(t *testing.T) {
	srv, _ := fixture(t, Config{Page: true, HideKeys: true})
	for _, path := range []string{"/v1/top", "/status"} {
		_, _, body := get(t, srv.URL+path)
		if strings.Contains(body, "user:") || strings.Contains(body, "ip:9") {
			t.Errorf("%s shows a key with keys hidden", path)
		}
		if !strings.Contains(body, "#") {
			t.Errorf("%s shows no hashed key", path)
		}
	}
}

func TestChanges(t *testing.T) {
	var c Changes
	c.Record(t0, []string{"a", "b"})
	c.Record(t0.Add(time.Second), []string{"b", "a"}) // no change
	c.Record(t0.Add(2*time.Second), []string{"a", "c"})
	log := c.Log()
	if len(log) != 2 || log[0].Joined[0] != "c" || log[0].Left[0] != "b" || log[0].Members != 2 || len(log[1].Joined) != 2 {
		t.Fatalf("log %+v, want the change b -> c first, then a, b joining", log)
	}
	for i := range 3 * MaxChanges {
		names := make([]string, 100)
		for j := range names {
			names[j] = string(rune('A'+i%26)) + string(rune('a'+j%26)) + string(rune('0'+j/26))
		}
		c.Record(t0.Add(time.Duration(i)*time.Minute), names)
	}
	log = c.Log()
	if len(log) != MaxChanges {
		t.Errorf("%d changes kept, want %d", len(log), MaxChanges)
	}
	for _, ch := range log {
		if len(ch.Joined) > maxNamed || len(ch.Left) > maxNamed || ch.More == 0 {
			t.Errorf("change %+v: want at most %d names each, the rest counted in More", ch, maxNamed)
		}
	}
}

// TestTopSharesAView: requests within cacheFor of a view share it, so that
// a flood of them costs the members one question each per cacheFor.
func TestTopSharesAView(t *testing.T) {
	var now atomic.Int64
	now.Store(t0.UnixNano())
	srv, asked := fixture(t, Config{Page: true, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	for range 5 {
		get(t, srv.URL+"/v1/top")
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("5 requests asked the 2 other members %d times, want 2", n)
	}
	get(t, srv.URL+"/v1/top?keys=3") // another view
	now.Add(int64(cacheFor))
	get(t, srv.URL+"/v1/top?keys=3")
	if n := asked.Load(); n != 6 {
		t.Errorf("asked %d times, want 6: another number of keys, then a view older than %v, are gathered anew", n, cacheFor)
	}
}
