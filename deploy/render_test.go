package deploy

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "helm/ringlimit"
	release   = "rl"
	namespace = "limits"
)

// rendered is the output of helm template, decoded into Kubernetes types.
type rendered struct {
	sts       *appsv1.StatefulSet
	services  map[string]*corev1.Service
	configMap *corev1.ConfigMap
	secrets   map[string]*corev1.Secret
	pdb       *policyv1.PodDisruptionBudget
	netpol    *networkingv1.NetworkPolicy
	monitor   *serviceMonitor
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// the chart renders. Decoding is strict, so a field the chart adds without
// adding it here fails the test, rather than going unchecked.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// helmTemplate renders the chart with the given --set values.
func helmTemplate(sets ...string) (string, error) {
	return helmTemplateValues("", sets...)
}

// helmTemplateValues renders the chart with a values file (when not "")
// and --set values.
func helmTemplateValues(valuesFile string, sets ...string) (string, error) {
	args := []string{"template", release, chartDir, "--namespace", namespace}
	if valuesFile != "" {
		args = append(args, "--values", valuesFile)
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return command(bin.helm, args...)
}

// render renders the chart and decodes every object strictly: an unknown
// field, a wrong type or a kind this test does not know fails the test.
func render(t *testing.T, sets ...string) rendered {
	t.Helper()
	return renderValues(t, "", sets...)
}

// renderValues is render with a values file.
func renderValues(t *testing.T, valuesFile string, sets ...string) rendered {
	t.Helper()
	out, err := helmTemplateValues(valuesFile, sets...)
	if err != nil {
		t.Fatal(err)
	}
	r, err := decode(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.sts == nil {
		t.Fatal("no StatefulSet rendered")
	}
	return r
}

func decode(out string) (rendered, error) {
	r := rendered{services: map[string]*corev1.Service{}, secrets: map[string]*corev1.Secret{}}
	for doc := range strings.SplitSeq(out, "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return r, err
		}
		if meta.Kind == "" {
			continue // only comments
		}
		var obj any
		switch meta.Kind {
		case "StatefulSet":
			r.sts = new(appsv1.StatefulSet)
			obj = r.sts
		case "Service":
			obj = new(corev1.Service)
		case "Secret":
			obj = new(corev1.Secret)
		case "ConfigMap":
			r.configMap = new(corev1.ConfigMap)
			obj = r.configMap
		case "PodDisruptionBudget":
			r.pdb = new(policyv1.PodDisruptionBudget)
			obj = r.pdb
		case "NetworkPolicy":
			r.netpol = new(networkingv1.NetworkPolicy)
			obj = r.netpol
		case "ServiceMonitor":
			r.monitor = new(serviceMonitor)
			obj = r.monitor
		default:
			return r, fmt.Errorf("unexpected kind %s", meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return r, fmt.Errorf("%s: %w", meta.Kind, err)
		}
		switch o := obj.(type) {
		case *corev1.Service:
			r.services[o.Name] = o
		case *corev1.Secret:
			r.secrets[o.Name] = o
		}
	}
	return r, nil
}

// container is the StatefulSet's one container.
func (r rendered) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := r.sts.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("StatefulSet has %d containers, want 1", len(cs))
	}
	return cs[0]
}

// flags returns the container's --name=value arguments.
func flags(t *testing.T, c corev1.Container) map[string]string {
	t.Helper()
	if len(c.Command) != 0 {
		t.Errorf("container command %q overrides the image's entrypoint", c.Command)
	}
	m := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			t.Fatalf("argument %q is not --flag=value", a)
		}
		if _, dup := m[name]; dup {
			t.Errorf("flag --%s given twice", name)
		}
		m[name] = value
	}
	return m
}

// portOf returns the port of a host:port flag value.
func portOf(t *testing.T, flag, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--%s=%s: %v", flag, addr, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatalf("--%s=%s: %v", flag, addr, err)
	}
	return int32(n)
}

// containerPort returns the port named name, and its protocol.
func containerPort(t *testing.T, c corev1.Container, name string) corev1.ContainerPort {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("container has no port named %q", name)
	return corev1.ContainerPort{}
}
