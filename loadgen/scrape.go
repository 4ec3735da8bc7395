package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/cluster"
)

// cpuMetric is the process collector's counter of the CPU time, user plus
// system, that a node's process has used. Nodes serve it on GET /metrics
// where the platform lets the collector read it (Linux, Windows); where it
// cannot, bench reports CPU per check as unknown rather than failing.
const cpuMetric = "process_cpu_seconds_total"

// maxScrapeBytes bounds what bench reads of one GET /metrics or
// /v1/members: a node serves tens of KB, so more means the address is not
// a node's.
const maxScrapeBytes = 8 << 20

// errCPUUnknown means that a node answered GET /metrics, but without a
// usable cpuMetric: the run's figures stand, its CPU per check is unknown.
var errCPUUnknown = errors.New(cpuMetric + " unknown")

// cpuSeconds returns the value of the unlabelled cpuMetric sample in a
// Prometheus text exposition. It reads only sample lines of that name,
// skips comments, other metrics and labelled series of the same name, and
// refuses a value that is not a finite count of seconds >= 0. Its errors
// wrap errCPUUnknown.
func cpuSeconds(text string) (float64, error) {
	v, err := sample(text, cpuMetric)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errCPUUnknown, err)
	}
	return v, nil
}

// sample returns the value of the unlabelled sample of metric name in a
// Prometheus text exposition: a finite number >= 0, as counters and the
// gauges read here are.
func sample(text, name string) (float64, error) {
	for line := range strings.Lines(text) {
		rest, ok := strings.CutPrefix(strings.TrimLeft(line, " \t"), name)
		if !ok {
			continue
		}
		// `name{} value` is the unlabelled series too; any other label
		// set is another series, and a longer name another metric.
		rest = strings.TrimPrefix(rest, "{}")
		if rest != "" && !strings.ContainsAny(rest[:1], " \t\r\n") {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) < 1 || len(fields) > 2 { // value, then an optional timestamp
			return 0, errors.New("malformed sample line")
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || math.IsInf(v, 0) || math.IsNaN(v) || v < 0 {
			return 0, fmt.Errorf("value %.20q, want a number >= 0", fields[0])
		}
		return v, nil
	}
	return 0, errors.New("not served")
}

// Node reads what a node's HTTP face serves to its operators: its
// CPU time and replicas from GET /metrics, and its view of the cluster
// from GET /v1/members. bench measures nodes with it, and `rlnode
// members` lists them. It is safe for concurrent use.
type Node struct {
	addr string // the node's HTTP address, as given
	base string // http://addr or https://addr
	hc   *http.Client
}

// NewNode returns the reader of the node whose HTTP face is at addr,
// reached over TLS as t says, or in plaintext if t is nil.
func NewNode(addr string, t *client.TLS) (Node, error) {
	base, tr, err := httpBase(t, addr, http.DefaultTransport.(*http.Transport))
	if err != nil {
		return Node{}, err
	}
	return Node{addr: addr, base: base, hc: &http.Client{Transport: tr}}, nil
}

// Close closes the connections n keeps idle.
func (n Node) Close() { n.hc.CloseIdleConnections() }

// cpu returns the CPU seconds the node's process has used so far. An
// error that wraps errCPUUnknown means the node answered without a usable
// figure; any other, that it did not answer as a node does.
func (n Node) cpu(ctx context.Context) (float64, error) {
	text, err := n.get(ctx, "/metrics", "text/plain;version=0.0.4")
	if err != nil {
		return 0, err
	}
	return cpuSeconds(text)
}

// Healthy returns nil if the node answers GET /healthz, as a node's HTTP
// port does.
func (n Node) Healthy(ctx context.Context) error {
	_, err := n.get(ctx, "/healthz", "text/plain")
	return err
}

// Replicas returns how many replicas of other nodes' counters the node
// holds (ringlimit_replicas).
func (n Node) Replicas(ctx context.Context) (float64, error) {
	text, err := n.get(ctx, "/metrics", "text/plain;version=0.0.4")
	if err != nil {
		return 0, err
	}
	return sample(text, "ringlimit_replicas")
}

// get fetches path from the node, at most maxScrapeBytes of it.
func (n Node) get(ctx context.Context, path, accept string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.base+path, nil)
	if err != nil {
		return "", fmt.Errorf("GET %s%s: %w", n.addr, path, err)
	}
	req.Header.Set("Accept", accept)
	resp, err := n.hc.Do(req)
	if err != nil {
		return "", err // a *url.Error, which names the method and URL
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxScrapeBytes+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("GET %s%s: %w", n.addr, path, err)
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("GET %s%s: %s", n.addr, path, resp.Status)
	case len(data) > maxScrapeBytes:
		return "", fmt.Errorf("GET %s%s: over %d bytes", n.addr, path, maxScrapeBytes)
	}
	return string(data), nil
}

// Members returns the node's view of the cluster from its GET /v1/members.
func (n Node) Members(ctx context.Context) ([]api.Member, error) {
	text, err := n.get(ctx, "/v1/members", "application/json")
	if err != nil {
		return nil, err
	}
	var body struct {
		Members []api.Member `json:"members"`
	}
	if err := json.Unmarshal([]byte(text), &body); err != nil {
		return nil, fmt.Errorf("GET %s/v1/members: %w", n.addr, err)
	}
	return body.Members, nil
}

// aliveMembers counts the members a node lists as alive.
func aliveMembers(ms []api.Member) int {
	n := 0
	for _, m := range ms {
		if m.State == string(cluster.Alive) {
			n++
		}
	}
	return n
}

// DialOptions returns the gRPC options that reach a node's gRPC port at
// addr over TLS as t says, or none (client.New's plaintext) if t is nil.
// Errors name the --tls-* flags, which set t.
func DialOptions(t *client.TLS, addr string) ([]grpc.DialOption, error) {
	if t == nil {
		return nil, nil // client.New's plaintext default
	}
	opt, err := t.DialOption(addr)
	if err != nil {
		return nil, fmt.Errorf("--tls-*: %w", err)
	}
	return []grpc.DialOption{opt}, nil
}

// httpBase returns the URL prefix of addr's HTTP interface and the
// transport that reaches it as t says, cloned from base.
func httpBase(t *client.TLS, addr string, base *http.Transport) (string, *http.Transport, error) {
	tr := base.Clone()
	if t == nil {
		return "http://" + addr, tr, nil
	}
	c, err := t.Config(addr)
	if err != nil {
		return "", nil, fmt.Errorf("--tls-*: %w", err)
	}
	tr.TLSClientConfig = c
	return "https://" + addr, tr, nil
}
