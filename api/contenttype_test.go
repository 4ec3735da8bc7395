package api

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func postAs(t *testing.T, url, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStateChangingPOSTsTakeOnlyJSON: POST /v1/check and POST /v1/settle
// refuse every body a browser sends to another origin without a
// preflight (text/plain, a form, multipart, none at all), 415 naming
// Content-Type, and charge nothing; application/json, in any case and
// with a charset, is taken.
func TestStateChangingPOSTsTakeOnlyJSON(t *testing.T) {
	srv := newTestServer(t)
	check := `{"requests":[{"name":"api","key":"csrf","limit":1,"duration_ms":60000,"reset":true}]}`
	for _, path := range []string{"/v1/check", "/v1/settle"} {
		for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
			"multipart/form-data; boundary=x", "application/jsonp", "application/json-seq", "garbage;;"} {
			code, body := postAs(t, srv.URL+path, ct, check)
			if code != http.StatusUnsupportedMediaType || !strings.HasPrefix(body, `{"error":"Content-Type: want application/json, got `) {
				t.Errorf("POST %s as %q: %d %s; want 415 naming Content-Type", path, ct, code, body)
			}
		}
	}
	// A JSON body from another origin needs a preflight, which fails.
	req, err := http.NewRequest(http.MethodOptions, srv.URL+"/v1/check", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", "https://elsewhere.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "content-type")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("a CORS preflight: %d, Access-Control-Allow-Origin %q; want 405 and none", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	for i, ct := range []string{"application/json", "Application/JSON; charset=utf-8"} {
		code, body := postAs(t, srv.URL+"/v1/check", ct, `{"requests":[{"name":"api","key":"csrf","limit":1,"duration_ms":60000}]}`)
		want := []string{`"status":"UNDER_LIMIT"`, `"status":"OVER_LIMIT"`}[i] // the refused ones charged nothing
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("POST /v1/check as %q: %d %s; want 200 and %s", ct, code, body, want)
		}
	}
}

// TestUnwrappedCheckHint: a single check sent without the list around it
// is told how to wrap it.
func TestUnwrappedCheckHint(t *testing.T) {
	srv := newTestServer(t)
	for _, body := range []string{`{"name":"api","key":"k","limit":1,"duration_ms":1000}`, `{"key":"k","policy":"edge/plan=free"}`, `{"Key":"k"}`} {
		code, got := post(t, srv, body)
		if code != http.StatusBadRequest || !strings.Contains(got, `unknown field: a check is an item of the list \"requests\"; wrap it: {\"requests\":[...]}`) {
			t.Errorf("%s: %d %s; want 400 and the hint", body, code, got)
		}
	}
	if _, got := post(t, srv, `{"request":[]}`); strings.Contains(got, "wrap it") {
		t.Errorf("a misspelled requests: %s; want no hint to wrap it", got)
	}
}

// TestPeekSaysAdmitsOne: the answer to a peek (hits 0) says whether a
// check of 1 would be admitted, as rlnode check's PEEK does; other
// answers keep their shape.
func TestPeekSaysAdmitsOne(t *testing.T) {
	srv := newTestServer(t)
	item := func(hits string) string {
		return `{"requests":[{"name":"api","key":"peek","limit":1,"duration_ms":60000` + hits + `}]}`
	}
	for _, tc := range []struct{ body, want string }{
		{item(`,"hits":0`), `"retry_after_ms":0,"delay_ms":0,"admits_one":true}`},
		{item(``), `"remaining":0`},
		{item(`,"hits":0`), `"admits_one":false}`},
		{`{"requests":[{"name":"api","key":"peek","limit":0,"duration_ms":60000,"hits":0}]}`, `"error":"limit: must be between`},
	} {
		code, body := post(t, srv, tc.body)
		if code != http.StatusOK || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s; want %s", tc.body, code, body, tc.want)
		}
		if peekAnswered := strings.Contains(tc.body, `"hits":0`) && !strings.Contains(body, `"error"`); strings.Contains(body, "admits_one") != peekAnswered {
			t.Errorf("%s: %s; want admits_one in the answer to a peek without error, and only there", tc.body, body)
		}
	}
}
