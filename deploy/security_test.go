package deploy

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"path"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// podDomain is the rendered pods' DNS domain under the headless Service.
const podDomain = "rl-ringlimit-headless." + namespace + ".svc.cluster.local"

// secretEnv returns the Secret and key an environment variable comes from.
func secretEnv(c corev1.Container, name string) (secret, key string) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
	}
	return "", ""
}

// peerTLSVolume returns the Secret mounted where --peer-tls-cert points.
func peerTLSVolume(t *testing.T, r rendered) string {
	t.Helper()
	c := r.container(t)
	f := flags(t, c)
	dir := path.Dir(f["peer-tls-cert"])
	if path.Dir(f["peer-tls-key"]) != dir || path.Dir(f["peer-tls-ca"]) != dir {
		t.Fatalf("--peer-tls-* not in one directory: %v", f)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("peer TLS mounted with subPath: the kubelet would never update it")
		}
		for _, v := range r.sts.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName
			}
		}
	}
	t.Fatalf("nothing mounts a Secret at %s", dir)
	return ""
}

// TestChartPeerTLSAndGossipByDefault: with no values, the chart generates a
// cluster CA, a peer certificate valid (as a host name) for every pod's
// member name however far the StatefulSet scales and for nothing outside
// it, and a 32-byte gossip key, and runs rlnode with them.
func TestChartPeerTLSAndGossipByDefault(t *testing.T) {
	r := render(t)
	c := r.container(t)
	tlsSecret := r.secrets[peerTLSVolume(t, r)]
	if tlsSecret == nil {
		t.Fatalf("the peer TLS volume's Secret is not rendered (have %v)", keys(r.secrets))
	}
	f := flags(t, c)
	for flag, file := range map[string]string{"peer-tls-cert": "tls.crt", "peer-tls-key": "tls.key", "peer-tls-ca": "ca.crt"} {
		if path.Base(f[flag]) != file || len(tlsSecret.Data[file]) == 0 {
			t.Errorf("--%s=%s: want the Secret's non-empty %s", flag, f[flag], file)
		}
	}
	leaf := parseCert(t, tlsSecret.Data["tls.crt"])
	roots := x509.NewCertPool()
	roots.AddCert(parseCert(t, tlsSecret.Data["ca.crt"]))
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("the peer certificate does not chain to the CA for usage %v: %v", usage, err)
		}
	}
	for _, name := range []string{"rl-ringlimit-0." + podDomain, "rl-ringlimit-2." + podDomain, "rl-ringlimit-41." + podDomain} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("the peer certificate is not valid for member %s: %v", name, err)
		}
	}
	for _, name := range []string{"rl-ringlimit-0", "evil.example", "a.b." + podDomain} {
		if leaf.VerifyHostname(name) == nil {
			t.Errorf("the peer certificate is valid for %s, outside the StatefulSet", name)
		}
	}

	secret, key := secretEnv(c, "RLNODE_GOSSIP_KEY")
	g := r.secrets[secret]
	if g == nil || key == "" {
		t.Fatalf("RLNODE_GOSSIP_KEY from Secret %q key %q: not rendered", secret, key)
	}
	raw, err := base64.StdEncoding.DecodeString(string(g.Data[key]))
	if err != nil || len(raw) != 32 {
		t.Errorf("gossip key %q: %d bytes (%v), want base64 of 32", g.Data[key], len(raw), err)
	}
}

// TestChartExistingSecrets: Secrets the user manages replace the generated
// ones, and turning either off removes it.
func TestChartExistingSecrets(t *testing.T) {
	r := render(t, "tls.existingSecret=my-peer-certs", "gossip.existingSecret=my-gossip")
	if len(r.secrets) != 0 {
		t.Errorf("Secrets rendered although existing ones are named: %v", keys(r.secrets))
	}
	if got := peerTLSVolume(t, r); got != "my-peer-certs" {
		t.Errorf("peer TLS from Secret %q, want my-peer-certs", got)
	}
	if s, k := secretEnv(r.container(t), "RLNODE_GOSSIP_KEY"); s != "my-gossip" || k != "gossip-key" {
		t.Errorf("RLNODE_GOSSIP_KEY from %s/%s, want my-gossip/gossip-key", s, k)
	}

	r = render(t, "tls.enabled=false", "gossip.enabled=false")
	f := flags(t, r.container(t))
	if len(r.secrets) != 0 || f["peer-tls-cert"] != "" || len(r.sts.Spec.Template.Spec.Volumes) != 0 {
		t.Errorf("TLS off: Secrets %v, --peer-tls-cert %q, volumes %v; want none", keys(r.secrets), f["peer-tls-cert"], r.sts.Spec.Template.Spec.Volumes)
	}
	if s, _ := secretEnv(r.container(t), "RLNODE_GOSSIP_KEY"); s != "" {
		t.Errorf("gossip off: RLNODE_GOSSIP_KEY still from %s", s)
	}
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %.60q", b)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
