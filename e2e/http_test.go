package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// member is one entry of GET /v1/members.
type member struct {
	Name       string  `json:"name"`
	GossipAddr string  `json:"gossip_addr"`
	GRPCAddr   string  `json:"grpc_addr"`
	PeerAddr   string  `json:"peer_addr"`
	State      string  `json:"state"`
	Share      float64 `json:"share"`
	Self       bool    `json:"self"`
}

// members returns n's view of the cluster.
func members(n *node) ([]member, error) {
	code, body, err := httpGet(n.http + "/v1/members")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/members: %d %s", code, body)
	}
	var resp struct {
		Members []member `json:"members"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("GET /v1/members: %w: %s", err, body)
	}
	return resp.Members, nil
}

// aliveNames returns the sorted names of the alive members, and of those
// declared dead that the node still routes to: a member stays in the ring
// for cluster.FailGrace after gossip declares it dead (its share then
// is not 0), so a membership has converged once the ring has dropped it.
func aliveNames(ms []member) []string {
	var names []string
	for _, m := range ms {
		if m.State == "alive" || m.Share > 0 {
			names = append(names, m.Name)
		}
	}
	slices.Sort(names)
	return names
}

var httpClient = &http.Client{Timeout: rpcTimeout}

func httpGet(hostport string) (int, []byte, error) {
	resp, err := httpClient.Get("http://" + hostport)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// metric returns the sum of the samples of the Prometheus metric name on
// n whose labels contain every one of labels (e.g. `direction="sent"`).
func metric(n *node, name string, labels ...string) (float64, error) {
	code, body, err := httpGet(n.http + "/metrics")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("%s: GET /metrics: %d", n.name, code)
	}
	sum := 0.0
	for line := range strings.Lines(string(body)) {
		fields := strings.Fields(line)
		if len(fields) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		series := fields[0]
		if series != name && !strings.HasPrefix(series, name+"{") {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(series, l)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: metric %q: %w", n.name, line, err)
		}
		sum += v
	}
	return sum, nil
}

func httpPost(hostport string, body any) (int, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	resp, err := httpClient.Post("http://"+hostport, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}
