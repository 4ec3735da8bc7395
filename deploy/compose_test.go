package deploy

import (
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestComposeFile checks the local cluster's compose file as Compose reads
// it: three nodes, ports published on 127.0.0.1 only, settings that are
// rlnode's, and a join name every node answers to. (make cluster runs it.)
func TestComposeFile(t *testing.T) {
	compose := []string{"docker-compose"}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		if _, err := command("docker", "compose", "version"); err != nil {
			t.Skip("skipped: neither docker-compose nor the docker compose plugin is installed")
		}
		compose = []string{"docker", "compose"}
	}
	out, err := command(compose[0], append(compose[1:], "-f", "docker-compose.yml", "config")...)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Services map[string]struct {
			Ports       []any             `json:"ports"`
			Environment map[string]string `json:"environment"`
			Networks    map[string]struct {
				Aliases []string `json:"aliases"`
			} `json:"networks"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal([]byte(out), &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Services) != 3 {
		t.Fatalf("%d services, want 3 nodes", len(file.Services))
	}
	known := rlnodeFlags(t)
	for name, s := range file.Services {
		for _, p := range s.Ports {
			// docker-compose prints "127.0.0.1:8180:8080/tcp", the
			// plugin {host_ip: 127.0.0.1, ...}.
			if m, ok := p.(map[string]any); ok {
				if m["host_ip"] != "127.0.0.1" {
					t.Errorf("%s publishes %v beyond 127.0.0.1", name, p)
				}
			} else if s, _ := p.(string); !strings.HasPrefix(s, "127.0.0.1:") {
				t.Errorf("%s publishes %v beyond 127.0.0.1", name, p)
			}
		}
		for env := range s.Environment {
			flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "RLNODE_")), "_", "-")
			if !known[flag] {
				t.Errorf("%s sets %s, which is no rlnode flag's variable", name, env)
			}
		}
		host, _, err := net.SplitHostPort(s.Environment["RLNODE_JOIN"])
		if err != nil {
			t.Fatalf("%s: RLNODE_JOIN: %v", name, err)
		}
		var aliased bool
		for _, n := range s.Networks {
			aliased = aliased || slices.Contains(n.Aliases, host)
		}
		if !aliased {
			t.Errorf("%s does not answer to the join name %s", name, host)
		}
		// Without TLS and a gossip key, a port given no address listens
		// on loopback only, where the other containers cannot reach it.
		for _, env := range []string{"RLNODE_HTTP_ADDR", "RLNODE_GRPC_ADDR", "RLNODE_PEER_ADDR", "RLNODE_GOSSIP_ADDR"} {
			if host, _, err := net.SplitHostPort(s.Environment[env]); err != nil || host != "" {
				t.Errorf("%s: %s %q, want an address on every interface (:port)", name, env, s.Environment[env])
			}
		}
		if s.Environment["RLNODE_NODE_NAME"] != name {
			t.Errorf("%s: RLNODE_NODE_NAME %q, want the service name", name, s.Environment["RLNODE_NODE_NAME"])
		}
		// One node starts the cluster alone; the others wait to join it.
		if b := s.Environment["RLNODE_BOOTSTRAP"]; file.Services[b].Environment == nil {
			t.Errorf("%s: RLNODE_BOOTSTRAP %q, want the name of one of the nodes", name, b)
		}
	}
	bootstraps := map[string]bool{}
	for _, s := range file.Services {
		bootstraps[s.Environment["RLNODE_BOOTSTRAP"]] = true
	}
	if len(bootstraps) != 1 {
		t.Errorf("RLNODE_BOOTSTRAP names %v, want the same node on every node", bootstraps)
	}
}
