package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/checkjson"
	"github.com/ringlimit/ringlimit/internal/clients"
)

// MaxBodyBytes bounds a POST /v1/check body. A thousand items at their
// longest, written plainly (name 256 bytes, key 1,024, policy 256, a
// parent's key 256, every other field with its longest value, and field
// names and punctuation: under 2,250 bytes each) take about 2.25 MB, so
// 2.5 MiB leaves some room for whitespace. Keys written with many \u
// escapes may not fit; over gRPC, the same items take less
// (MaxRecvMsgBytes). The body is decoded as it arrives, so a larger bound
// costs no memory.
const MaxBodyBytes = 5 << 19

// Handler returns the HTTP interface: POST /v1/check, POST /v1/settle,
// GET /v1/members,
// GET /metrics, GET /healthz and GET /readyz. Errors of the /v1/ paths,
// a wrong method included, are JSON: {"error":"..."}. The POSTs, which
// change state, take only JSON bodies (see jsonOnly).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	var check http.Handler = http.HandlerFunc(s.handleCheck)
	if s.conf.Admit != nil {
		check = s.conf.Admit(check)
	}
	mux.Handle("POST /v1/check", jsonOnly(check))
	mux.HandleFunc("/v1/check", methodNotAllowed("POST"))
	var settle http.Handler = http.HandlerFunc(s.handleSettle)
	if s.conf.Admit != nil {
		settle = s.conf.Admit(settle)
	}
	mux.Handle("POST /v1/settle", jsonOnly(settle))
	mux.HandleFunc("/v1/settle", methodNotAllowed("POST"))
	mux.HandleFunc("GET /v1/members", s.handleMembers)
	mux.HandleFunc("/v1/members", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	if s.conf.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.conf.Gatherer, promhttp.HandlerOpts{}))
	}
	return mux
}

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	defer s.observe("http", time.Now())
	// The body is decoded as it arrives, so a slow or stalled body holds
	// only what it has sent, for at most the server's ReadTimeout.
	d, err := checkjson.Decode(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("body: larger than %d bytes", MaxBodyBytes))
			return
		}
		writeError(w, http.StatusBadRequest, err)
		return
	}
	// The client, for the bounds one client may not exceed (see package
	// clients): its verified certificate's name, else its address range.
	ctx := clients.NewContext(r.Context(), clients.Of(r.RemoteAddr, r.TLS))
	resp, err := s.conf.Checker.Check(ctx, d.Request)
	if err != nil {
		writeError(w, checks.HTTPStatus(err), err)
		return
	}
	if by := decidedBy(resp); by != "" {
		w.Header().Set(DecidedByHeader, by)
	}
	buf := s.bufs.Get().(*[]byte)
	*buf = checkjson.AppendResponse((*buf)[:0], d, resp)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(*buf)))
	w.WriteHeader(http.StatusOK)
	w.Write(*buf)
	if cap(*buf) <= maxPooledBytes {
		s.bufs.Put(buf)
	}
}

// maxPooledBytes bounds the buffers Server.bufs keeps: one of 100 results
// takes about 13 KB, one of a thousand results with long errors can take
// 1 MB, which is better left to the garbage collector.
const maxPooledBytes = 64 << 10

func (s *Server) handleMembers(w http.ResponseWriter, _ *http.Request) {
	members := []Member{}
	if s.conf.Members != nil {
		members = s.conf.Members()
	}
	writeJSON(w, http.StatusOK, struct {
		Members []Member `json:"members"`
	}{members})
}

// handleReady answers GET /readyz: 200 "ready", or 503 with the line
// saying why not; a warning line follows "ready" when there is one.
func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	ready, why := true, ""
	if s.conf.Ready != nil {
		ready, why = s.conf.Ready()
	}
	if !ready {
		if why == "" {
			why = "not ready"
		}
		http.Error(w, why, http.StatusServiceUnavailable) // which ends it with a newline
		return
	}
	io.WriteString(w, "ready\n")
	if why != "" {
		io.WriteString(w, why+"\n")
	}
	if s.conf.ReadyNote != "" {
		io.WriteString(w, s.conf.ReadyNote+"\n")
	}
}

// jsonOnly passes on a request whose Content-Type is application/json
// (any case, parameters such as charset allowed), and refuses any other,
// none included, with 415 and an error naming the header. A browser
// sends a POST of text/plain, application/x-www-form-urlencoded or
// multipart/form-data, or of no type at all, to another origin without
// asking it first (a CORS "simple request"), so that without this any
// web page a user of the API opens could spend and reset their counters;
// a JSON body needs a preflight (OPTIONS), which this server refuses.
func jsonOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct := r.Header.Get("Content-Type")
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			got := "none"
			if ct != "" {
				got = strconv.Quote(ct)
			}
			writeError(w, http.StatusUnsupportedMediaType, fmt.Errorf("Content-Type: want application/json, got %s "+
				"(curl -d sends application/x-www-form-urlencoded: add -H 'Content-Type: application/json')", got))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// methodNotAllowed answers a request to an API path with a method it does
// not take: 405 with the Allow header, as the mux would, but with the
// JSON body every other error of the API has.
func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use %s", r.Method, allow))
	}
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, struct {
		Error string `json:"error"`
	}{err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
