package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/service"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func newTestServer(t *testing.T) *httptest.Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	svc := service.New(service.Config{Now: func() time.Time { return t0 }, Registerer: reg})
	srv := httptest.NewServer(New(Config{Checker: svc, Registerer: reg, Gatherer: reg}).Handler())
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, srv *httptest.Server, body string) (int, string) {
	t.Helper()
	return postAs(t, srv.URL+"/v1/check", "application/json", body)
}

func TestCheckJSON(t *testing.T) {
	srv := newTestServer(t)
	code, body := post(t, srv, `{"requests":[{"name":"api","key":"user:42","limit":2,"duration_ms":1000}]}`)
	want := `{"responses":[{"status":"UNDER_LIMIT","limit":2,"remaining":1,"reset_time_ms":` +
		jsonInt(t0.Add(500*time.Millisecond).UnixMilli()) + `,"retry_after_ms":0,"delay_ms":0}]}` + "\n"
	if code != http.StatusOK || body != want {
		t.Errorf("got %d %s\nwant 200 %s", code, body, want)
	}
	post(t, srv, `{"requests":[{"name":"api","key":"user:42","limit":2,"duration_ms":1000}]}`)
	code, body = post(t, srv, `{"requests":[{"name":"api","key":"user:42","limit":2,"duration_ms":1000,"algorithm":"TOKEN_BUCKET","behavior":"BATCHED"}]}`)
	if code != http.StatusOK || !strings.Contains(body, `"status":"OVER_LIMIT"`) || !strings.Contains(body, `"retry_after_ms":500`) {
		t.Errorf("over limit: got %d %s, want 200 with OVER_LIMIT and retry_after_ms 500", code, body)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestCheckJSONSpacing: min_interval_ms over HTTP: a second check at once
// is refused for the interval; a spacing alone answers limit 1; a bad
// interval is the item's own error naming the field.
func TestCheckJSONSpacing(t *testing.T) {
	srv := newTestServer(t)
	spaced := `{"requests":[{"name":"api","key":"u","limit":10,"duration_ms":60000,"min_interval_ms":1500},` +
		`{"name":"login","key":"u","min_interval_ms":2000},` +
		`{"name":"api","key":"v","limit":10,"duration_ms":60000,"min_interval_ms":-5},` +
		`{"name":"api","key":"v","limit":10,"duration_ms":60000,"algorithm":"SPACING"}]}`
	post(t, srv, spaced)
	code, body := post(t, srv, spaced)
	want := `{"responses":[` +
		`{"status":"OVER_LIMIT","limit":10,"remaining":9,"reset_time_ms":` + jsonInt(t0.Add(6*time.Second).UnixMilli()) + `,"retry_after_ms":1500,"delay_ms":0},` +
		`{"status":"OVER_LIMIT","limit":1,"remaining":0,"reset_time_ms":` + jsonInt(t0.Add(2*time.Second).UnixMilli()) + `,"retry_after_ms":2000,"delay_ms":0},` +
		`{"status":"OVER_LIMIT","limit":0,"remaining":0,"reset_time_ms":0,"retry_after_ms":-1,"delay_ms":0,` +
		`"error":"min_interval_ms: must be between 0 (none) and 31536000000, got -5","error_code":"INVALID_ARGUMENT"},` +
		`{"status":"OVER_LIMIT","limit":0,"remaining":0,"reset_time_ms":0,"retry_after_ms":-1,"delay_ms":0,` +
		`"error":"algorithm: unknown algorithm \"SPACING\" (want one of TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW, SLIDING_LOG)",` +
		`"error_code":"INVALID_ARGUMENT"}]}` + "\n"
	if code != http.StatusOK || body != want {
		t.Errorf("got %d %s\nwant 200 %s", code, body, want)
	}
}

// TestCheckJSONBorrowing: a check with a ceiling and a parent over HTTP:
// its guarantee, then a hit borrowed ("borrowed": true), then refused at
// its ceiling; a parent without a key is the item's own error naming
// the field.
func TestCheckJSONBorrowing(t *testing.T) {
	srv := newTestServer(t)
	item := `{"name":"api","key":"u","limit":1,"duration_ms":60000,"algorithm":"FIXED_WINDOW","ceiling":2,"parent":{"key":"all","limit":100}}`
	window := jsonInt(t0.Add(time.Minute).UnixMilli())
	for i, want := range []string{
		`{"status":"UNDER_LIMIT","limit":1,"remaining":0,"reset_time_ms":` + window + `,"retry_after_ms":0,"delay_ms":0}`,
		`{"status":"UNDER_LIMIT","limit":1,"remaining":0,"reset_time_ms":` + window + `,"retry_after_ms":0,"delay_ms":0,"borrowed":true}`,
		`{"status":"OVER_LIMIT","limit":1,"remaining":0,"reset_time_ms":` + window + `,"retry_after_ms":60000,"delay_ms":0}`,
	} {
		want = `{"responses":[` + want + `]}` + "\n"
		if code, body := post(t, srv, `{"requests":[`+item+`]}`); code != http.StatusOK || body != want {
			t.Errorf("check %d: got %d %s\nwant 200 %s", i, code, body, want)
		}
	}
	_, body := post(t, srv, `{"requests":[{"name":"api","key":"u","limit":1,"duration_ms":60000,"ceiling":2,"parent":{"limit":100}}]}`)
	if !strings.Contains(body, `"error":"parent.key: must not be empty","error_code":"INVALID_ARGUMENT"`) {
		t.Errorf("a parent without a key: %s, want the item's error naming parent.key", body)
	}
}

func TestCheckJSONErrorsNameTheField(t *testing.T) {
	srv := newTestServer(t)
	many := `{"requests":[` + strings.Repeat(`{},`, checks.MaxItems) + `{}]}`
	cases := []struct {
		body, want string
		code       int
	}{
		{`{"requests":[{"name":"a","key":"k","limit":"ten","duration_ms":1000}]}`, `requests[0].limit: want int64, got string`, 400},
		{`{"requests":[{"name":"a","key":"k","limit":1.5,"duration_ms":1000}]}`, `requests[0].limit: want int64`, 400},
		{`{"requests":[{"name":"a","key":"k","limit":1,"duration":1000}]}`, `requests[0].duration: unknown field`, 400},
		{`{"requests":{}}`, `requests: want an array, got object`, 400},
		{`{"requests":[`, `malformed JSON`, 400},
		{``, `body: empty`, 400},
		{`{"requests":[]} x`, `unexpected data after the JSON value`, 400},
		{`{"all":"yes"}`, `all: want bool, got string`, 400},
		{many, `requests: more than 1000 items`, 400},
		{`{"requests":[],"requests":[]}`, `requests: repeated field`, 400},
		{`{"requests":[{"name":"a","key":"k","Key":"k2"}]}`, `requests[0].Key: unknown field (names are case-sensitive: "key")`, 400},
		{`{"requests":[{"name":"a","name":"b"}]}`, `requests[0].name: repeated field`, 400},
		{"{\"requests\":[{\"name\":\"a\",\"key\":\"\xff\"}]}", `requests[0].key: invalid UTF-8`, 400},
		{`{"requests":[{"name":"a","key":"\ud800"}]}`, `requests[0].key: invalid UTF-16`, 400},
		{`{"requests":[null]}`, `requests[0]: want an object, got null`, 400},
		{`{"requests":[{"name":"a","parent":{"key":"k","limits":1}}]}`, `requests[0].parent.limits: unknown field`, 400},
		{`{"requests":[{"name":"a","parent":{"limit":"ten"}}]}`, `requests[0].parent.limit: want int64, got string`, 400},
		{`{"requests":[{"name":"a","parent":{"key":"a","key":"b"}}]}`, `requests[0].parent.key: repeated field`, 400},
		{`{"requests":[{"name":"a","parent":"all"}]}`, `requests[0].parent: want an object, got string`, 400},
		{`{"requests":[{"name":"a","ceiling":"2"}]}`, `requests[0].ceiling: want int64, got string`, 400},
		{`{"requests":[{"name":"a","key":"k","limit":1,"duration_ms":1000,"hits":` + strings.Repeat("9", MaxBodyBytes) + `}]}`, `body: larger than`, 413},
	}
	for _, c := range cases {
		code, body := post(t, srv, c.body)
		var e struct{ Error string }
		json.Unmarshal([]byte(body), &e)
		if code != c.code || !strings.Contains(e.Error, c.want) {
			short := c.body
			if len(short) > 80 {
				short = short[:80] + "..."
			}
			t.Errorf("%s: got %d %q, want %d with an error containing %q", short, code, e.Error, c.code, c.want)
		}
	}
}

func TestInvalidItemGetsItsOwnError(t *testing.T) {
	srv := newTestServer(t)
	code, body := post(t, srv, `{"requests":[
		{"name":"a","key":"k","limit":1,"duration_ms":1000,"algorithm":"NOPE"},
		{"name":"a","key":"","limit":1,"duration_ms":1000},
		{"name":"a","key":"k","limit":1,"duration_ms":1000}]}`)
	var resp struct {
		Responses []struct {
			Status, Error string
			ErrorCode     string `json:"error_code"`
		} `json:"responses"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil || code != 200 {
		t.Fatalf("got %d %s", code, body)
	}
	if len(resp.Responses) != 3 {
		t.Fatalf("got %d responses, want 3", len(resp.Responses))
	}
	for i, prefix := range []string{"algorithm: ", "key: ", ""} {
		r := resp.Responses[i]
		if !strings.HasPrefix(r.Error, prefix) || (prefix == "") != (r.Error == "") {
			t.Errorf("item %d: error %q, want prefix %q", i, r.Error, prefix)
		}
		if prefix != "" && r.ErrorCode != "INVALID_ARGUMENT" {
			t.Errorf("item %d: error_code %q, want INVALID_ARGUMENT", i, r.ErrorCode)
		}
	}
	if resp.Responses[2].Status != "UNDER_LIMIT" {
		t.Errorf("valid item: %+v", resp.Responses[2])
	}
}

func TestOperationalEndpoints(t *testing.T) {
	srv := newTestServer(t)
	post(t, srv, `{"requests":[{"name":"api","key":"user:42","limit":2,"duration_ms":1000}]}`)
	for path, want := range map[string]string{
		"/healthz":    "ok",
		"/readyz":     "ready",
		"/v1/members": `{"members":[]}`,
		"/metrics":    `ringlimit_checks_total{algorithm="TOKEN_BUCKET",behavior="BATCHED",route="local",status="UNDER_LIMIT"} 1`,
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d %.200s, want 200 containing %s", path, resp.StatusCode, b, want)
		}
	}
}

// TestNotReady: GET /readyz is 503 with the line saying why while the
// node is not ready, and 200 with its warning while it is.
func TestNotReady(t *testing.T) {
	for _, tc := range []struct {
		ready      bool
		why        string
		code       int
		body, note string
	}{
		{false, "not ready: not joined: no node answered through --join a:7946", http.StatusServiceUnavailable, "not ready: not joined: no node answered through --join a:7946\n", ""},
		{false, "", http.StatusServiceUnavailable, "not ready\n", ""},
		{true, "warning: member b not admitted", http.StatusOK, "ready\nwarning: member b not admitted\ninsecure\n", "insecure"},
		{true, "", http.StatusOK, "ready\n", ""},
	} {
		srv := httptest.NewServer(New(Config{Checker: service.New(service.Config{}), ReadyNote: tc.note,
			Ready: func() (bool, string) { return tc.ready, tc.why }}).Handler())
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != tc.code || string(b) != tc.body {
			t.Errorf("GET /readyz with Ready = %v, %q: %d %q, want %d %q", tc.ready, tc.why, resp.StatusCode, b, tc.code, tc.body)
		}
	}
}

// TestMembersJSON pins the field names GET /v1/members serves, which
// rlnode members, the e2e tests and operators' scripts read.
func TestMembersJSON(t *testing.T) {
	svc := service.New(service.Config{})
	members := func() []Member {
		return []Member{{Name: "a", GossipAddr: "10.0.0.1:7946", GRPCAddr: "10.0.0.1:8081", PeerAddr: "10.0.0.1:8082", HTTPAddr: "10.0.0.1:8080", State: "alive", Share: 0.5, Self: true}}
	}
	srv := httptest.NewServer(New(Config{Checker: svc, Members: members}).Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/members")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `{"members":[{"name":"a","gossip_addr":"10.0.0.1:7946","grpc_addr":"10.0.0.1:8081","peer_addr":"10.0.0.1:8082","http_addr":"10.0.0.1:8080","state":"alive","share":0.5,"self":true}]}`
	if got := strings.TrimSpace(string(b)); got != want {
		t.Errorf("GET /v1/members = %s\nwant %s", got, want)
	}
}

func TestReadyNote(t *testing.T) {
	srv := httptest.NewServer(New(Config{Checker: service.New(service.Config{}), ReadyNote: "warning: plaintext"}).Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ready\nwarning: plaintext\n" {
		t.Errorf("GET /readyz with a note: %d %q, want 200 with the note after ready", resp.StatusCode, b)
	}
}

// TestAdmitWrapsOnlyChecks checks that Config.Admit guards POST /v1/check
// and leaves the probes, /metrics and /v1/members to answer under load.
func TestAdmitWrapsOnlyChecks(t *testing.T) {
	refuse := func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	}
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(New(Config{Checker: service.New(service.Config{}), Admit: refuse, Registerer: reg, Gatherer: reg}).Handler())
	defer srv.Close()
	if code, _ := post(t, srv, `{"requests":[]}`); code != http.StatusServiceUnavailable {
		t.Errorf("POST /v1/check: %d, want Admit's 503", code)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/v1/members"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, resp.StatusCode)
		}
	}
}

// TestWrongMethodIsJSON: a wrong method on an API path is answered 405
// with the Allow header and a JSON error body, as every other error of
// the API is.
func TestWrongMethodIsJSON(t *testing.T) {
	srv := newTestServer(t)
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodGet, "/v1/check", "POST"},
		{http.MethodPut, "/v1/check", "POST"},
		{http.MethodPost, "/v1/members", "GET, HEAD"},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tc.allow ||
			resp.Header.Get("Content-Type") != "application/json" || err != nil || !strings.Contains(body.Error, tc.method) {
			t.Errorf("%s %s: %d, Allow %q, Content-Type %q, body %+v (%v); want 405, Allow %q and a JSON error naming the method",
				tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("Content-Type"), body, err, tc.allow)
		}
	}
	if code, body := post(t, srv, `{"requests":[{"name":"api","key":"k","limit":1,"duration_ms":1000}]}`); code != http.StatusOK {
		t.Errorf("POST /v1/check beside the 405 handler: %d %s", code, body)
	}
}

// TestJSONCase pins the rule of docs/checks.md: field names are matched
// exactly (a name in another case is refused, naming its spelling), enum
// values in any case.
func TestJSONCase(t *testing.T) {
	srv := newTestServer(t)
	code, body := post(t, srv, `{"requests":[{"name":"a","key":"k","limit":1,"duration_ms":1000,"algorithm":"gcra","behavior":"Local"},`+
		`{"name":"b","key":"k","limit":1,"duration_ms":1000,"algorithm":"Sliding_Window","behavior":"unbatched"}]}`)
	if code != http.StatusOK || strings.Count(body, `"status":"UNDER_LIMIT"`) != 2 || strings.Contains(body, `"error"`) {
		t.Errorf("enum values in lower and mixed case: %d %s; want both answered", code, body)
	}
	code, body = post(t, srv, `{"requests":[{"name":"a","key":"k","Limit":1,"duration_ms":1000}]}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `requests[0].Limit: unknown field (names are case-sensitive: \"limit\")`) {
		t.Errorf("a field name in another case: %d %s; want 400 naming the field and its spelling", code, body)
	}
}
