package deploy

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// requireDocker skips the test when there is no docker CLI or no daemon to
// talk to; CI has both, so there the test runs.
func requireDocker(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("skipped: no docker CLI on PATH; this test runs the chart's rendered spec as containers")
	}
	if _, err := command("docker", "version", "--format", "{{.Server.Version}}"); err != nil {
		t.Skipf("skipped: the docker daemon does not answer (%v); this test runs the chart's rendered spec as containers", err)
	}
}

// testImage builds the image with `make image` (fast when nothing changed)
// so that the test runs the current code, unless RINGLIMIT_IMAGE names an
// image to use as it is.
func testImage(t *testing.T) string {
	t.Helper()
	if img := os.Getenv("RINGLIMIT_IMAGE"); img != "" {
		return img
	}
	const img = "ringlimit:dev"
	if _, err := command("make", "-C", "..", "image", "IMAGE="+img); err != nil {
		t.Fatal(err)
	}
	return img
}

// runID makes names unique per run, so parallel runs and leftovers of a
// killed run do not collide.
func runID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// dockerNetwork creates a private bridge network with its own /24 (a
// random one of 10.213.0.0/16, so containers can have fixed IPs, as pods
// know theirs) and removes it when the test ends.
func dockerNetwork(t *testing.T, name string) (subnet string) {
	t.Helper()
	var err error
	for range 8 {
		b := make([]byte, 1)
		rand.Read(b)
		subnet = fmt.Sprintf("10.213.%d.0/24", b[0])
		if _, err = command("docker", "network", "create", "--driver", "bridge", "--subnet", subnet, name); err == nil {
			t.Cleanup(func() { command("docker", "network", "rm", name) })
			return subnet
		}
	}
	t.Fatalf("create network: %v", err)
	return ""
}

// pod is one container standing in for a StatefulSet pod.
type pod struct {
	name, ip string
}

// dockerRunArgs turns the pod template's container spec into `docker run`
// arguments for pod p: the same image, args, environment (with the
// downward API's and Secrets' values filled in and $(VAR) references
// expanded, as the kubelet would), user, read-only root, capabilities,
// memory limit and grace period, volumes (host directories from
// volumeDirs), and DNS names as the cluster DNS gives them.
func dockerRunArgs(t *testing.T, r rendered, network string, p pod, aliases []string, volumes map[string]string) []string {
	t.Helper()
	spec := r.sts.Spec.Template.Spec
	c := r.container(t)
	args := []string{"run", "--detach", "--name", p.name, "--hostname", p.name,
		"--network", network, "--ip", p.ip}
	for _, a := range aliases {
		args = append(args, "--network-alias", a)
	}
	var set []string // old, new pairs for $(VAR) expansion
	for _, e := range c.Env {
		v := strings.NewReplacer(set...).Replace(e.Value) // as the kubelet: only variables defined earlier
		switch from := e.ValueFrom; {
		case from == nil:
		case from.FieldRef != nil:
			switch path := from.FieldRef.FieldPath; path {
			case "metadata.name":
				v = p.name
			case "status.podIP":
				v = p.ip
			default:
				t.Fatalf("env %s: fieldRef %s has no stand-in here", e.Name, path)
			}
		case from.SecretKeyRef != nil:
			s := r.secrets[from.SecretKeyRef.Name]
			if s == nil {
				t.Fatalf("env %s: Secret %s is not one the chart renders", e.Name, from.SecretKeyRef.Name)
			}
			v = string(s.Data[from.SecretKeyRef.Key])
		default:
			t.Fatalf("env %s: only fieldRef and secretKeyRef values can be filled in here", e.Name)
		}
		set = append(set, "$("+e.Name+")", v)
		args = append(args, "--env", e.Name+"="+v)
	}
	ps, cs := spec.SecurityContext, c.SecurityContext
	if ps != nil && ps.RunAsUser != nil {
		user := strconv.FormatInt(*ps.RunAsUser, 10)
		if ps.RunAsGroup != nil {
			user += ":" + strconv.FormatInt(*ps.RunAsGroup, 10)
		}
		args = append(args, "--user", user)
	}
	if cs != nil {
		if cs.ReadOnlyRootFilesystem != nil && *cs.ReadOnlyRootFilesystem {
			args = append(args, "--read-only")
		}
		if cs.Capabilities != nil {
			for _, d := range cs.Capabilities.Drop {
				args = append(args, "--cap-drop", string(d))
			}
		}
		if cs.AllowPrivilegeEscalation != nil && !*cs.AllowPrivilegeEscalation {
			args = append(args, "--security-opt", "no-new-privileges")
		}
	}
	for _, m := range c.VolumeMounts {
		dir, ok := volumes[m.Name]
		if !ok || m.SubPath != "" {
			t.Fatalf("volume mount %s: only the chart's own ConfigMap and Secrets, mounted whole, have a stand-in here", m.Name)
		}
		args = append(args, "--volume", dir+":"+m.MountPath+":ro")
	}
	if m := c.Resources.Limits.Memory(); !m.IsZero() {
		args = append(args, "--memory", strconv.FormatInt(m.Value(), 10))
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		args = append(args, "--stop-timeout", strconv.FormatInt(*g, 10))
	}
	args = append(args, c.Image)
	return append(args, c.Args...)
}

// policyValues gives the chart a policy file, so that the containers run
// with --policy-file on a mounted ConfigMap.
const policyValues = `policies:
  deploy.yaml: |
    domain: deploy
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10, algorithm: SLIDING_LOG}
`

// volumeDirs writes each pod volume backed by the chart's own ConfigMap or
// one of its Secrets into a host directory (see kubeletDir) and returns
// them by volume name.
func volumeDirs(t *testing.T, r rendered) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range r.sts.Spec.Template.Spec.Volumes {
		switch {
		case v.ConfigMap != nil && r.configMap != nil && v.ConfigMap.Name == r.configMap.Name:
			files := map[string][]byte{}
			for name, text := range r.configMap.Data {
				files[name] = []byte(text)
			}
			out[v.Name] = kubeletDir(t, files)
		case v.Secret != nil && r.secrets[v.Secret.SecretName] != nil:
			out[v.Name] = kubeletDir(t, r.secrets[v.Secret.SecretName].Data)
		}
	}
	return out
}

// kubeletDir writes files as the kubelet mounts a ConfigMap or Secret:
// the files in a timestamped directory, ..data a symlink to it, and each
// file a symlink through ..data. Readable by the container's user (the
// kubelet would give the pod's fsGroup access; a test cannot chown).
func kubeletDir(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(data, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// members is GET /v1/members.
type members struct {
	Members []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"members"`
}

func alive(base string) (map[string]bool, error) {
	code, body, err := get(base + "/v1/members")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("GET /v1/members: %d %s", code, body)
	}
	var m members
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, x := range m.Members {
		if x.State == "alive" {
			out[x.Name] = true
		}
	}
	return out, nil
}

// TestRenderedStatefulSetRuns runs what the chart renders: three
// containers of the image with the StatefulSet's container spec, on a
// private network where the headless Service's DNS name resolves to all
// three, as cluster DNS does, and the policy ConfigMap is mounted as the
// kubelet mounts it. They must find each other through --join, pass their
// probes, answer one key exactly across the three (with a limit given in
// the check, and with one from the policy file), and shut
// down cleanly within the grace period, handing off their counters.
func TestRenderedStatefulSetRuns(t *testing.T) {
	requireDocker(t)
	img := testImage(t)
	repo, tag, _ := strings.Cut(img, ":") // no registry port here: ringlimit:dev
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(policyValues), 0o600); err != nil {
		t.Fatal(err)
	}
	r := renderValues(t, values, "image.repository="+repo, "image.tag="+tag, "image.pullPolicy=Never")
	c := r.container(t)
	f := flags(t, c)
	joinHost, _, err := net.SplitHostPort(f["join"])
	if err != nil {
		t.Fatal(err)
	}
	if want := r.sts.Spec.ServiceName + "." + namespace + ".svc.cluster.local"; joinHost != want {
		t.Fatalf("--join host %s, want the headless Service %s", joinHost, want)
	}
	httpPort := containerPort(t, c, "http").ContainerPort
	grpcPort := containerPort(t, c, "grpc").ContainerPort

	id := runID()
	network := "ringlimit-test-" + id
	subnet := dockerNetwork(t, network)
	prefix := strings.TrimSuffix(subnet, "0/24")
	var pods []pod
	volumes := volumeDirs(t, r)
	for i := range int(*r.sts.Spec.Replicas) {
		p := pod{name: fmt.Sprintf("%s-%d-%s", r.sts.Name, i, id), ip: fmt.Sprintf("%s%d", prefix, 10+i)}
		pods = append(pods, p)
		args := dockerRunArgs(t, r, network, p, []string{joinHost, p.name + "." + joinHost}, volumes)
		t.Cleanup(func() {
			if t.Failed() {
				logs, _ := exec.Command("docker", "logs", "--tail", "40", p.name).CombinedOutput()
				t.Logf("docker logs %s:\n%s", p.name, logs)
			}
			command("docker", "rm", "--force", "--volumes", p.name)
		})
		if _, err := command("docker", args...); err != nil {
			t.Fatal(err)
		}
	}
	if len(pods) != 3 {
		t.Fatalf("the chart renders %d replicas, want 3", len(pods))
	}
	base := func(p pod) string { return fmt.Sprintf("http://%s:%d", p.ip, httpPort) }

	// The chart turns on mutual TLS between the nodes and encrypted
	// gossip: the three must find each other through both.
	if s, _ := secretEnv(c, "RLNODE_GOSSIP_KEY"); f["peer-tls-cert"] == "" || s == "" {
		t.Fatal("the rendered pod runs without peer TLS or a gossip key")
	}

	// Converge: every node ready, with no warning that it runs unsecured,
	// and seeing all three alive under their DNS names.
	deadline := time.Now().Add(60 * time.Second)
	for _, p := range pods {
		for {
			names, err := alive(base(p))
			code, body, rerr := get(base(p) + c.ReadinessProbe.HTTPGet.Path)
			if err == nil && rerr == nil && code == 200 && len(names) == 3 {
				if body != "ready\n" {
					t.Errorf("%s: readiness body %q, want no warning: peer TLS and gossip key are on", p.name, body)
				}
				for _, q := range pods {
					if !names[q.name+"."+joinHost] {
						t.Errorf("%s: members %v lack %s", p.name, names, q.name+"."+joinHost)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not converged within 60s: members %v (%v), readiness %d (%v)", p.name, names, err, code, rerr)
			}
			time.Sleep(200 * time.Millisecond) // polling containers, not timing logic
		}
		if code, _, err := get(base(p) + c.LivenessProbe.HTTPGet.Path); err != nil || code != 200 {
			t.Errorf("%s: liveness probe %s: %d %v", p.name, c.LivenessProbe.HTTPGet.Path, code, err)
		}
	}

	// Exact: 60 concurrent checks for one key, limit 10, spread over the
	// three nodes, admit exactly 10. SLIDING_LOG over an hour, so nothing
	// refills while the test runs.
	key := "user:" + id
	check := fmt.Sprintf(`{"requests":[{"name":"deploy-test","key":%q,"limit":10,"duration_ms":3600000,"algorithm":"SLIDING_LOG"}]}`, key)
	const n = 60
	var wg sync.WaitGroup
	statuses := make([]string, n)
	for i := range n {
		wg.Go(func() {
			code, body, err := post(base(pods[i%3])+"/v1/check", check)
			var resp struct {
				Responses []struct {
					Status string `json:"status"`
					Error  string `json:"error"`
				} `json:"responses"`
			}
			if err == nil && code == 200 && json.Unmarshal([]byte(body), &resp) == nil && len(resp.Responses) == 1 && resp.Responses[0].Error == "" {
				statuses[i] = resp.Responses[0].Status
			} else {
				statuses[i] = fmt.Sprintf("failed: %d %q %v", code, body, err)
			}
		})
	}
	wg.Wait()
	count := map[string]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count["UNDER_LIMIT"] != 10 || count["OVER_LIMIT"] != n-10 {
		t.Fatalf("%d checks over 3 nodes on a limit of 10: %v, want exactly 10 admitted", n, count)
	}

	// A check naming the policy from the mounted ConfigMap: its limit (10
	// an hour, SLIDING_LOG) holds exactly across the three nodes too.
	policyCheck := fmt.Sprintf(`{"requests":[{"key":%q,"policy":"deploy/user"}]}`, key)
	admitted := 0
	for i := range 15 {
		code, body, err := post(base(pods[i%3])+"/v1/check", policyCheck)
		if err != nil || code != 200 || strings.Contains(body, `"error"`) {
			t.Fatalf("policy check: %d %s %v", code, body, err)
		}
		if strings.Contains(body, "UNDER_LIMIT") {
			admitted++
		}
	}
	if admitted != 10 {
		t.Errorf("15 checks naming policy deploy/user (10 an hour) over 3 nodes admitted %d, want 10", admitted)
	}

	// The gRPC port answers too, from the same counter.
	// rlnode check exits 1 when refused, 0 when admitted.
	grpcCheck := func(p pod) string {
		t.Helper()
		out, err := command(bin.rlnode, "check", "--addr", fmt.Sprintf("%s:%d", p.ip, grpcPort), "--key", key,
			"--name", "deploy-test", "--limit", "10", "--duration", "1h", "--algorithm", "SLIDING_LOG", "--json")
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
			t.Fatal(err)
		}
		return out
	}
	if out := grpcCheck(pods[1]); !strings.Contains(out, "OVER_LIMIT") {
		t.Errorf("gRPC check after the limit was spent: %s, want OVER_LIMIT", out)
	}

	// SIGTERM, as the kubelet sends it: the node leaves, hands its counters
	// to the others and exits 0 within the grace period.
	stopped := pods[2]
	start := time.Now()
	grace := strconv.FormatInt(*r.sts.Spec.Template.Spec.TerminationGracePeriodSeconds, 10)
	if _, err := command("docker", "stop", "--time", grace, stopped.name); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	exit, err := command("docker", "inspect", "--format", "{{.State.ExitCode}}", stopped.name)
	if err != nil || strings.TrimSpace(exit) != "0" {
		t.Errorf("%s after SIGTERM: exit code %q (%v), want 0", stopped.name, strings.TrimSpace(exit), err)
	}
	t.Logf("%s stopped in %v (grace period %ss)", stopped.name, took.Round(time.Millisecond), grace)
	deadline = time.Now().Add(30 * time.Second)
	for {
		names, err := alive(base(pods[0]))
		if err == nil && len(names) == 2 && !names[stopped.name+"."+joinHost] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still sees %v (%v) 30s after %s left", pods[0].name, names, err, stopped.name)
		}
		time.Sleep(200 * time.Millisecond) // polling containers, not timing logic
	}
	// Whichever node owned the key, its counter survived: still spent.
	for _, p := range pods[:2] {
		if out := grpcCheck(p); !strings.Contains(out, "OVER_LIMIT") {
			t.Errorf("%s after %s left: %s, want OVER_LIMIT (the counter was handed off)", p.name, stopped.name, out)
		}
	}
}
