package deploy

import (
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// allOn turns on every optional part of the chart.
var allOn = []string{"serviceMonitor.enabled=true", "networkPolicy.enabled=true", `policies.api\.yaml=domain: api`, "snapshots.enabled=true", "strict.quorum=2", "strict.fence=20s"}

func TestChartLints(t *testing.T) {
	for _, sets := range [][]string{nil, allOn} {
		args := []string{"lint", "--strict", chartDir}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		if out, err := command(bin.helm, args...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

// rlnodeFlags returns the flags rlnode accepts, from rlnode help flags
// (rlnode -h shows only the flags set first).
func rlnodeFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin.rlnode, "help", "flags").CombinedOutput()
	if err != nil {
		t.Fatalf("rlnode help flags: %v\n%s", err, out)
	}
	fs := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		fs[m[1]] = true
	}
	if !fs["http-addr"] || !fs["join"] || !fs["max-log-entries"] {
		t.Fatalf("rlnode help flags lists no --http-addr, --join or --max-log-entries:\n%s", out)
	}
	return fs
}

// TestChartFlagsAreRlnodes checks that every argument and RLNODE_*
// variable the chart sets is one rlnode has.
func TestChartFlagsAreRlnodes(t *testing.T) {
	known := rlnodeFlags(t)
	r := render(t, allOn...)
	c := r.container(t)
	for name := range flags(t, c) {
		if !known[name] {
			t.Errorf("the chart passes --%s, which rlnode does not have", name)
		}
	}
	for _, e := range c.Env {
		flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(e.Name, "RLNODE_")), "_", "-")
		if !strings.HasPrefix(e.Name, "RLNODE_") {
			if !referenced(c.Env, e.Name) {
				t.Errorf("the chart sets %s, which is no rlnode flag's variable nor used by one", e.Name)
			}
			continue
		}
		if !known[flag] {
			t.Errorf("the chart sets %s, which is no rlnode flag's variable", e.Name)
		}
	}
}

// referenced reports whether an RLNODE_* variable's value uses the
// variable name, as $(name) (Kubernetes' dependent variables).
func referenced(env []corev1.EnvVar, name string) bool {
	for _, e := range env {
		if strings.HasPrefix(e.Name, "RLNODE_") && strings.Contains(e.Value, "$("+name+")") {
			return true
		}
	}
	return false
}

func TestChartPortsMatchFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets []string
		want map[string]int32 // flag -> port
	}{
		{"defaults", nil, map[string]int32{"http-addr": 8080, "grpc-addr": 8081, "peer-addr": 8082, "gossip-addr": 7946}},
		{"custom", []string{"ports.http=9080", "ports.grpc=9081", "ports.peer=9082", "ports.gossip=9946"},
			map[string]int32{"http-addr": 9080, "grpc-addr": 9081, "peer-addr": 9082, "gossip-addr": 9946}},
		{"resp", []string{"ports.resp=6379"},
			map[string]int32{"http-addr": 8080, "grpc-addr": 8081, "peer-addr": 8082, "gossip-addr": 7946, "resp-addr": 6379}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, append(tc.sets, allOn...)...)
			c := r.container(t)
			f := flags(t, c)
			for flag, want := range tc.want {
				if got := portOf(t, flag, f[flag]); got != want {
					t.Errorf("--%s=%s, want port %d", flag, f[flag], want)
				}
			}
			// Each flag's port is the container port of that name.
			portsOf := map[string][]string{"http-addr": {"http"}, "grpc-addr": {"grpc"},
				"peer-addr": {"peer"}, "gossip-addr": {"gossip-tcp", "gossip-udp"}}
			clientPorts := []string{"grpc", "http"}
			if _, on := tc.want["resp-addr"]; on {
				portsOf["resp-addr"] = []string{"resp"}
				clientPorts = append(clientPorts, "resp")
			} else if v, ok := f["resp-addr"]; ok {
				t.Errorf("--resp-addr=%s, want the RESP port off by default", v)
			}
			for flag, names := range portsOf {
				for _, name := range names {
					p := containerPort(t, c, name)
					if p.ContainerPort != portOf(t, flag, f[flag]) {
						t.Errorf("container port %s is %d, --%s=%s", name, p.ContainerPort, flag, f[flag])
					}
					wantProto := corev1.ProtocolTCP
					if name == "gossip-udp" {
						wantProto = corev1.ProtocolUDP
					}
					if p.Protocol != wantProto {
						t.Errorf("container port %s: protocol %s, want %s", name, p.Protocol, wantProto)
					}
				}
			}
			// Service ports point at container ports that exist, with the
			// same number and protocol.
			if len(r.services) != 2 {
				t.Fatalf("rendered %d Services, want 2 (client and headless)", len(r.services))
			}
			for _, svc := range r.services {
				for _, sp := range svc.Spec.Ports {
					cp := containerPort(t, c, sp.TargetPort.String())
					if sp.Port != cp.ContainerPort || sp.Protocol != cp.Protocol {
						t.Errorf("Service %s port %s: %d/%s, container port %d/%s", svc.Name, sp.Name, sp.Port, sp.Protocol, cp.ContainerPort, cp.Protocol)
					}
				}
			}
			client := r.services[release+"-ringlimit"]
			if client == nil {
				t.Fatalf("no client Service %s-ringlimit", release)
			}
			if got := portNames(client.Spec.Ports); !slices.Equal(got, clientPorts) {
				t.Errorf("client Service ports %v, want %v only (peer and gossip stay private)", got, clientPorts)
			}
		})
	}
}

func portNames(ps []corev1.ServicePort) []string {
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// TestChartJoinsThroughHeadlessService checks that --join names the
// headless Service, which lists every pod, ready or not, and that the
// StatefulSet's pods are the ones it selects.
func TestChartJoinsThroughHeadlessService(t *testing.T) {
	r := render(t)
	c := r.container(t)
	f := flags(t, c)
	host, port, err := net.SplitHostPort(f["join"])
	if err != nil {
		t.Fatalf("--join=%s: %v", f["join"], err)
	}
	svcName, ns, ok := strings.Cut(strings.TrimSuffix(host, ".svc.cluster.local"), ".")
	if !ok || ns != namespace || !strings.HasSuffix(host, ".svc.cluster.local") {
		t.Fatalf("--join host %s is not <service>.%s.svc.cluster.local", host, namespace)
	}
	if port != fmt.Sprint(containerPort(t, c, "gossip-tcp").ContainerPort) {
		t.Errorf("--join port %s is not the gossip port", port)
	}
	svc := r.services[svcName]
	if svc == nil {
		t.Fatalf("--join names Service %s, which the chart does not render", svcName)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s: clusterIP %q, want None (headless: DNS lists every pod)", svcName, svc.Spec.ClusterIP)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: publishNotReadyAddresses is false, so starting pods cannot find each other (a pod is ready only once joined)", svcName)
	}
	if r.sts.Spec.ServiceName != svcName {
		t.Errorf("StatefulSet serviceName %s, want the headless Service %s", r.sts.Spec.ServiceName, svcName)
	}
	if r.sts.Spec.PodManagementPolicy != "Parallel" {
		t.Errorf("podManagementPolicy %q, want Parallel", r.sts.Spec.PodManagementPolicy)
	}
	pod := r.sts.Spec.Template.Labels
	for _, s := range []map[string]string{svc.Spec.Selector, r.sts.Spec.Selector.MatchLabels} {
		for k, v := range s {
			if pod[k] != v {
				t.Errorf("selector %s=%s does not match the pod labels %v", k, v, pod)
			}
		}
	}
	// The pod's DNS name under the headless Service is its member name
	// (what its peer certificate must be valid for), and its IP its gossip
	// address.
	want := map[string]string{"POD_NAME": "metadata.name", "RLNODE_ADVERTISE_ADDR": "status.podIP", "RLNODE_NODE_NAME": ""}
	for _, e := range c.Env {
		path, ok := want[e.Name]
		switch {
		case !ok:
			continue
		case e.Name == "RLNODE_NODE_NAME":
			if w := "$(POD_NAME)." + host; e.Value != w {
				t.Errorf("RLNODE_NODE_NAME = %q, want %q", e.Value, w)
			}
		case e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path:
			t.Errorf("%s is not taken from %s", e.Name, path)
		}
		delete(want, e.Name)
	}
	for name := range want {
		t.Errorf("no %s in the container's environment", name)
	}
	for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"} {
		if r.sts.Labels[k] == "" || pod[k] == "" {
			t.Errorf("label %s missing on the StatefulSet or its pods", k)
		}
	}
}

// TestChartBootstrapsFromPodZero checks that every pod gets one
// --bootstrap, the member name of pod 0 (its DNS name under the headless
// Service, which --join names): that pod starts a new cluster alone, the
// others are ready only once they have joined. And that a rolling update
// replaces one pod at a time, waiting for it to be ready (/readyz):
// a new pod that would split the cluster is not, and the rollout stops
// there.
func TestChartBootstrapsFromPodZero(t *testing.T) {
	r := render(t)
	c := r.container(t)
	f := flags(t, c)
	host, _, err := net.SplitHostPort(f["join"])
	if err != nil {
		t.Fatalf("--join=%s: %v", f["join"], err)
	}
	if want := r.sts.Name + "-0." + host; f["bootstrap"] != want {
		t.Errorf("--bootstrap=%q, want pod 0's member name %q", f["bootstrap"], want)
	}
	u := r.sts.Spec.UpdateStrategy
	if u.Type != "RollingUpdate" || u.RollingUpdate != nil && (u.RollingUpdate.MaxUnavailable != nil && u.RollingUpdate.MaxUnavailable.IntValue() != 1 ||
		u.RollingUpdate.Partition != nil && *u.RollingUpdate.Partition != 0) {
		t.Errorf("update strategy %+v, want a rolling update of one pod at a time", u)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v, want GET /readyz", p)
	}
}

// TestChartProbesHitServedPaths checks that the probes use the HTTP port
// and paths a running rlnode answers with 200.
func TestChartProbesHitServedPaths(t *testing.T) {
	r := render(t)
	c := r.container(t)
	n := startNode(t)
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an HTTP GET", name)
			continue
		}
		if p.HTTPGet.Port != intstr.FromString("http") {
			t.Errorf("%s probe on port %s, want the http port", name, p.HTTPGet.Port.String())
		}
		if code, body, err := get("http://" + n.http + p.HTTPGet.Path); err != nil || code != 200 {
			t.Errorf("%s probe: GET %s on a running node: %d %q %v", name, p.HTTPGet.Path, code, body, err)
		}
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("readiness %s, liveness %s: want /readyz (joined) and /healthz (alive)",
			c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
	}
}

// TestChartShutdownFitsGracePeriod checks that the kubelet waits longer
// than rlnode's own shutdown (leave, hand off, drain) before SIGKILL.
func TestChartShutdownFitsGracePeriod(t *testing.T) {
	for _, sets := range [][]string{nil, {"shutdownTimeoutSeconds=100", "terminationGracePeriodSeconds=120"}} {
		r := render(t, sets...)
		timeout, err := time.ParseDuration(flags(t, r.container(t))["shutdown-timeout"])
		if err != nil {
			t.Fatalf("--shutdown-timeout: %v", err)
		}
		grace := r.sts.Spec.Template.Spec.TerminationGracePeriodSeconds
		if grace == nil || time.Duration(*grace)*time.Second <= timeout {
			t.Errorf("%v: terminationGracePeriodSeconds %v, want more than --shutdown-timeout %v", sets, grace, timeout)
		}
	}
}

func TestChartSecurityContext(t *testing.T) {
	r := render(t)
	pod := r.sts.Spec.Template.Spec
	c := r.container(t)
	ps, cs := pod.SecurityContext, c.SecurityContext
	if ps == nil || cs == nil {
		t.Fatal("no pod or container securityContext")
	}
	check := func(what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("securityContext: want %s", what)
		}
	}
	check("runAsNonRoot", ps.RunAsNonRoot != nil && *ps.RunAsNonRoot)
	check("runAsUser 65532 (the image's user)", ps.RunAsUser != nil && *ps.RunAsUser == 65532)
	check("seccomp RuntimeDefault", ps.SeccompProfile != nil && ps.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault)
	check("readOnlyRootFilesystem", cs.ReadOnlyRootFilesystem != nil && *cs.ReadOnlyRootFilesystem)
	check("allowPrivilegeEscalation false", cs.AllowPrivilegeEscalation != nil && !*cs.AllowPrivilegeEscalation)
	check("capabilities drop ALL", cs.Capabilities != nil && slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) && len(cs.Capabilities.Add) == 0)
	check("no service account token", pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken)
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %v: want cpu and memory requests and a memory limit", c.Resources)
	}
}

func TestChartPodDisruptionBudget(t *testing.T) {
	r := render(t)
	if r.pdb == nil {
		t.Fatal("no PodDisruptionBudget by default")
	}
	if r.pdb.Spec.MaxUnavailable == nil || r.pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("maxUnavailable %v, want 1: nodes leave one at a time, handing their counters off", r.pdb.Spec.MaxUnavailable)
	}
	if fmt.Sprint(r.pdb.Spec.Selector.MatchLabels) != fmt.Sprint(r.sts.Spec.Selector.MatchLabels) {
		t.Errorf("PDB selects %v, StatefulSet %v", r.pdb.Spec.Selector.MatchLabels, r.sts.Spec.Selector.MatchLabels)
	}
	if r := render(t, "podDisruptionBudget.enabled=false"); r.pdb != nil {
		t.Error("PodDisruptionBudget rendered although disabled")
	}
}

// TestChartPolicies checks that the policy files are a ConfigMap mounted
// as a directory, which --policy-file names, so that the kubelet's
// updates reach the running node.
func TestChartPolicies(t *testing.T) {
	if r := render(t); r.configMap != nil || flags(t, r.container(t))["policy-file"] != "" {
		t.Error("without policies: want no ConfigMap and no --policy-file")
	}
	for _, tc := range []struct {
		name, set, configMap string
	}{
		{"inline", `policies.api\.yaml=domain: api`, release + "-ringlimit-policies"},
		{"existing", "existingPolicyConfigMap=my-policies", "my-policies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set)
			if tc.name == "inline" {
				if r.configMap == nil || r.configMap.Name != tc.configMap || r.configMap.Data["api.yaml"] != "domain: api" {
					t.Fatalf("ConfigMap %+v, want %s with api.yaml", r.configMap, tc.configMap)
				}
			} else if r.configMap != nil {
				t.Errorf("rendered ConfigMap %s although an existing one is named", r.configMap.Name)
			}
			c := r.container(t)
			dir := flags(t, c)["policy-file"]
			var vol string
			for _, m := range c.VolumeMounts {
				if m.MountPath == dir {
					vol = m.Name
					if m.SubPath != "" {
						t.Errorf("policies mounted with subPath %q: the kubelet never updates subPath mounts", m.SubPath)
					}
					if !m.ReadOnly {
						t.Error("policies mounted writable")
					}
				}
			}
			if vol == "" {
				t.Fatalf("--policy-file=%s is no volume mount", dir)
			}
			for _, v := range r.sts.Spec.Template.Spec.Volumes {
				if v.Name == vol {
					if v.ConfigMap == nil || v.ConfigMap.Name != tc.configMap {
						t.Errorf("volume %s: %+v, want ConfigMap %s", vol, v.VolumeSource, tc.configMap)
					}
					return
				}
			}
			t.Errorf("no volume %s", vol)
		})
	}
}

// TestChartNetworkPolicy checks that peer and gossip ports admit only the
// release's own pods, and that client ports are open.
func TestChartNetworkPolicy(t *testing.T) {
	if render(t).netpol != nil {
		t.Error("NetworkPolicy rendered although disabled")
	}
	r := render(t, "networkPolicy.enabled=true", "ports.resp=6379")
	np := r.netpol
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	c := r.container(t)
	selector := r.sts.Spec.Selector.MatchLabels
	if fmt.Sprint(np.Spec.PodSelector.MatchLabels) != fmt.Sprint(selector) {
		t.Errorf("NetworkPolicy applies to %v, want the StatefulSet's pods %v", np.Spec.PodSelector.MatchLabels, selector)
	}
	// who may reach each container port: "own" or "any"
	reach := map[string]string{}
	for _, rule := range np.Spec.Ingress {
		who := "any"
		if len(rule.From) > 0 {
			who = "other"
			if len(rule.From) == 1 && rule.From[0].NamespaceSelector == nil && rule.From[0].IPBlock == nil &&
				rule.From[0].PodSelector != nil && fmt.Sprint(rule.From[0].PodSelector.MatchLabels) == fmt.Sprint(selector) {
				who = "own"
			}
		}
		for _, p := range rule.Ports {
			for _, cp := range c.Ports {
				if p.Port != nil && p.Port.IntValue() == int(cp.ContainerPort) && p.Protocol != nil && *p.Protocol == cp.Protocol {
					if reach[cp.Name] != "" {
						t.Errorf("port %s in two rules", cp.Name)
					}
					reach[cp.Name] = who
				}
			}
		}
	}
	want := map[string]string{"http": "any", "grpc": "any", "resp": "any", "peer": "own", "gossip-tcp": "own", "gossip-udp": "own"}
	if fmt.Sprint(reach) != fmt.Sprint(want) {
		t.Errorf("NetworkPolicy lets reach ports %v, want %v", reach, want)
	}
}

func TestChartServiceMonitor(t *testing.T) {
	if render(t).monitor != nil {
		t.Error("ServiceMonitor rendered although disabled")
	}
	r := render(t, "serviceMonitor.enabled=true")
	m := r.monitor
	if m == nil || m.APIVersion != "monitoring.coreos.com/v1" || len(m.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor %+v", m)
	}
	e := m.Spec.Endpoints[0]
	client := r.services[release+"-ringlimit"]
	if e.Path != "/metrics" || !slices.Contains(portNames(client.Spec.Ports), e.Port) {
		t.Errorf("ServiceMonitor scrapes port %q path %q, want the client Service's http port, /metrics", e.Port, e.Path)
	}
	for k, v := range m.Spec.Selector.MatchLabels {
		if client.Labels[k] != v {
			t.Errorf("ServiceMonitor selector %s=%s does not match the client Service", k, v)
		}
	}
}

// TestChartRejectsBadValues checks that values.schema.json and the
// chart's own checks refuse bad values with an error naming them.
func TestChartRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		set, want string
	}{
		{"replicaCount=0", "replicaCount"},
		{"ports.http=70000", "ports.http"},
		{"ports.peer=8080", "must differ"},
		{"ports.resp=8081", "ports.resp: must differ"},
		{"ports.resp=-1", "ports.resp"},
		{"config.batchWait=soon", "batchWait"},
		{"config.logLevel=loud", "logLevel"},
		{"config.maxKeys=-1", "maxKeys"},
		{"image.pullPolicy=Sometimes", "pullPolicy"},
		{"replicas=3", "replicas"}, // a typo is not silently ignored
		{"shutdownTimeoutSeconds=60", "terminationGracePeriodSeconds (45) must exceed shutdownTimeoutSeconds (60)"},
		{"extraArgs[0]=join=x", "extraArgs"},
		{"podDisruptionBudget.maxUnavailable=0", "maxUnavailable"},
		{"snapshots.interval=0s", "snapshots.interval"},
		{"snapshots.interval=often", "interval"},
		{"snapshots.size=lots", "size"},
		{"snapshots.enabled=maybe", "enabled"},
		{"snapshots.path=/data", "path"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			out, err := helmTemplate(tc.set)
			if err == nil {
				t.Fatalf("helm template accepted %s:\n%s", tc.set, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
	// Both ways of giving policies at once.
	if _, err := helmTemplate(`policies.a\.yaml=x`, "existingPolicyConfigMap=y"); err == nil || !strings.Contains(err.Error(), "existingPolicyConfigMap") {
		t.Errorf("policies and existingPolicyConfigMap together: %v", err)
	}
}

// TestChartExtras checks that the optional pod settings land where they
// belong (a wrong indent in a template moves them silently, or fails the
// strict decoding).
func TestChartExtras(t *testing.T) {
	r := render(t, allOn[2],
		"extraArgs[0]=--log-level=debug",
		"extraEnv[0].name=GOMEMLIMIT", "extraEnv[0].value=400MiB",
		"extraVolumes[0].name=tls", "extraVolumes[0].secret.secretName=rl-tls",
		"extraVolumeMounts[0].name=tls", "extraVolumeMounts[0].mountPath=/etc/ringlimit/tls",
		"podAnnotations.a=b", "podLabels.team=edge", "nodeSelector.pool=edge",
		"tolerations[0].key=edge", "tolerations[0].operator=Exists",
		"topologySpreadConstraints[0].maxSkew=1", "topologySpreadConstraints[0].topologyKey=zone",
		"topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
		"serviceAccountName=rl", "priorityClassName=high", "imagePullSecrets[0].name=pull")
	pod := r.sts.Spec.Template
	c := r.container(t)
	if c.Args[len(c.Args)-1] != "--log-level=debug" {
		t.Errorf("extraArgs not last: %q", c.Args)
	}
	if e := c.Env[len(c.Env)-1]; e.Name != "GOMEMLIMIT" || e.Value != "400MiB" {
		t.Errorf("extraEnv: %+v", c.Env)
	}
	if len(c.VolumeMounts) != 3 || c.VolumeMounts[2].MountPath != "/etc/ringlimit/tls" {
		t.Errorf("volume mounts %+v, want policies, peer-tls and tls", c.VolumeMounts)
	}
	if len(pod.Spec.Volumes) != 3 || pod.Spec.Volumes[2].Secret == nil || pod.Spec.Volumes[2].Secret.SecretName != "rl-tls" {
		t.Errorf("volumes %+v, want policies, peer-tls and the tls Secret", pod.Spec.Volumes)
	}
	for what, ok := range map[string]bool{
		"podAnnotations":            pod.Annotations["a"] == "b",
		"podLabels":                 pod.Labels["team"] == "edge",
		"nodeSelector":              pod.Spec.NodeSelector["pool"] == "edge",
		"tolerations":               len(pod.Spec.Tolerations) == 1 && pod.Spec.Tolerations[0].Key == "edge",
		"topologySpreadConstraints": len(pod.Spec.TopologySpreadConstraints) == 1 && pod.Spec.TopologySpreadConstraints[0].TopologyKey == "zone",
		"serviceAccountName":        pod.Spec.ServiceAccountName == "rl",
		"priorityClassName":         pod.Spec.PriorityClassName == "high",
		"imagePullSecrets":          len(pod.Spec.ImagePullSecrets) == 1 && pod.Spec.ImagePullSecrets[0].Name == "pull",
		"default anti-affinity":     pod.Spec.Affinity != nil && pod.Spec.Affinity.PodAntiAffinity != nil,
	} {
		if !ok {
			t.Errorf("%s not rendered into the pod", what)
		}
	}
	if r := render(t, "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists"); r.sts.Spec.Template.Spec.Affinity.NodeAffinity == nil ||
		r.sts.Spec.Template.Spec.Affinity.PodAntiAffinity != nil {
		t.Errorf("affinity given: want it instead of the default, got %+v", r.sts.Spec.Template.Spec.Affinity)
	}
}
