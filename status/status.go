// Package status shows an operator who is being limited: GET /v1/top, the
// keys each limit name checked and refused most across the cluster, as
// JSON, and GET /status, a page of the members, their share of the ring,
// their checks/s and refusals/s, their replication lag, the hottest and
// most refused keys and the recent ring changes. The page is rendered on
// the server, with no script and no asset from anywhere (it refreshes by
// a meta tag), so that it works with JavaScript off and under a policy
// that forbids loading anything.
//
// A node asks each alive member for its counts (package top) over the
// peer protocol, which is mutually authenticated, bounded and validated
// on both sides (peer.Pool.Top), and merges them (top.Merge). Keys are
// the clients' and may be hidden (Config.HideKeys): each is then shown
// as a keyed hash, on the page and in /v1/top alike.
package status

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/top"
)

// Local is what Status needs of this node: its own counts and replication
// lag (service.Service).
type Local interface {
	Top(keys int) top.Report
	ReplicationLag() time.Duration
}

// Asker asks the member whose peer port is at addr for its counts and
// replication lag (peer.Pool.Top, with this node's name).
type Asker func(ctx context.Context, addr string, keys int) (top.Report, time.Duration, error)

// Config configures a Status. Local and Members are required.
type Config struct {
	Local Local
	// Members lists the cluster as this node sees it (GET /v1/members's).
	Members func() []api.Member
	// Ask reaches the other members; nil shows this node alone.
	Ask Asker
	// Changes is the log of ring changes the page shows; nil shows none.
	Changes *Changes
	// HideKeys shows every key as a keyed hash (top.Report.Hide).
	HideKeys bool
	// Page serves GET /status (and GET /); false serves only /v1/top.
	Page bool
	// Timeout bounds the asking of the members; zero means DefaultTimeout.
	// A member that does not answer in time is shown with its error.
	Timeout time.Duration
	// Now is the clock the page shows; nil means time.Now.
	Now func() time.Time
	// UnknownDomains lists the domains Envoy asked this node for that no
	// policy file has (policy.UnknownDomains.Domains); nil lists none.
	UnknownDomains func() []string
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 2 * time.Second

// Bounds of GET /v1/top?keys=N and of what a page shows.
const (
	DefaultKeys = 10
	// maxAsked bounds the members one view asks: far more than a cluster
	// has, so that a member list gone wrong cannot make a view open
	// connections without end.
	maxAsked = 1000
)

// Status serves GET /v1/top and the status page. It is safe for
// concurrent use.
type Status struct {
	conf   Config
	secret []byte // the key of hidden keys' hashes, random per process

	// mu serializes gathering and guards the last view, which requests
	// within cacheFor of it share: a flood of GET /v1/top then costs the
	// members one Peer/Top each per cacheFor, not one per request.
	mu       sync.Mutex
	last     View
	lastKeys int
	lastAt   time.Time
}

// cacheFor is how long a gathered view answers the requests that follow.
const cacheFor = time.Second

// New returns a Status configured by conf.
func New(conf Config) *Status {
	if conf.Timeout <= 0 {
		conf.Timeout = DefaultTimeout
	}
	if conf.Now == nil {
		conf.Now = time.Now
	}
	return &Status{conf: conf, secret: []byte(rand.Text())}
}

// Register adds the routes of s to mux: GET /v1/top and, with
// Config.Page, GET /status and GET / (the page).
func (s *Status) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/top", s.handleTop)
	if s.conf.Page {
		mux.HandleFunc("GET /status", s.handlePage)
		mux.HandleFunc("GET /{$}", s.handlePage)
	}
}

// Node is one member as a view shows it: its place in the ring and what
// it reported, or why it did not.
type Node struct {
	api.Member
	ChecksPerSecond       float64 `json:"checks_per_second"`
	RefusalsPerSecond     float64 `json:"refusals_per_second"`
	ReplicationLagSeconds float64 `json:"replication_lag_seconds"`
	Error                 string  `json:"error,omitempty"`
}

// View is the cluster's counts as this node gathered them: the body of
// GET /v1/top, and what the page shows.
type View struct {
	top.Report
	Nodes      []Node `json:"nodes"`
	KeysHidden bool   `json:"keys_hidden,omitempty"`
	// UnknownDomains are the domains Envoy asked this node for that no
	// policy file has: requests it answers unlimited.
	UnknownDomains []string `json:"unknown_domains,omitempty"`
}

// Gather asks every alive member (this node directly) for its counts, at
// most keys keys per list, and merges what they answer. A member that
// cannot be asked is in View.Nodes with its error, and counted nowhere.
func (s *Status) Gather(ctx context.Context, keys int) View {
	ctx, cancel := context.WithTimeout(ctx, s.conf.Timeout)
	defer cancel()
	members := s.conf.Members()
	nodes := make([]Node, len(members))
	reports := make([]top.Report, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		nodes[i].Member = m
		switch {
		case m.Self:
			reports[i] = s.conf.Local.Top(keys)
			nodes[i].ReplicationLagSeconds = s.conf.Local.ReplicationLag().Seconds()
		case m.State != string(cluster.Alive):
		case s.conf.Ask == nil || i >= maxAsked:
			nodes[i].Error = "not asked"
		default:
			wg.Go(func() {
				r, lag, err := s.conf.Ask(ctx, m.PeerAddr, keys)
				if err != nil {
					nodes[i].Error = err.Error()
					return
				}
				reports[i] = r
				nodes[i].ReplicationLagSeconds = lag.Seconds()
			})
		}
	}
	wg.Wait()
	for i := range nodes {
		nodes[i].ChecksPerSecond = reports[i].ChecksPerSecond
		nodes[i].RefusalsPerSecond = reports[i].RefusalsPerSecond
	}
	v := View{Report: top.Merge(reports, keys), Nodes: nodes, KeysHidden: s.conf.HideKeys}
	if s.conf.UnknownDomains != nil {
		v.UnknownDomains = s.conf.UnknownDomains()
	}
	if s.conf.HideKeys {
		v.Hide(s.secret)
	}
	return v
}

// view returns the view of keys keys gathered within cacheFor, or gathers
// it anew.
func (s *Status) view(ctx context.Context, keys int) View {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.conf.Now()
	if s.lastKeys == keys && !s.lastAt.IsZero() && now.Sub(s.lastAt) >= 0 && now.Sub(s.lastAt) < cacheFor {
		return s.last
	}
	// Shared by the requests that follow, it does not end with the
	// request that gathered it; Config.Timeout bounds it.
	s.last, s.lastKeys, s.lastAt = s.Gather(context.WithoutCancel(ctx), keys), keys, now
	return s.last
}

func (s *Status) handleTop(w http.ResponseWriter, r *http.Request) {
	keys, err := keysParam(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, s.view(r.Context(), keys))
}

// keysParam reads ?keys=N, 1 to top.MaxKeys; DefaultKeys without it.
func keysParam(r *http.Request) (int, error) {
	q := r.URL.Query().Get("keys")
	if q == "" {
		return DefaultKeys, nil
	}
	n, err := strconv.Atoi(q)
	if err != nil || n < 1 || n > top.MaxKeys {
		return 0, fmt.Errorf("keys: %.20q, want a whole number from 1 to %d", q, top.MaxKeys)
	}
	return n, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) // the client may have gone; nothing to do about it
}
