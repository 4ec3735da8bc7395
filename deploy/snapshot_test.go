package deploy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestChartSnapshots checks the snapshots value: off by default (no claim,
// no --snapshot-dir); on, each pod gets a PersistentVolumeClaim from the
// StatefulSet's volumeClaimTemplates, kept when the release is deleted or
// scaled down, mounted writable at the path --snapshot-dir names, with
// the interval, size and storage class given.
func TestChartSnapshots(t *testing.T) {
	r := render(t)
	f := flags(t, r.container(t))
	if len(r.sts.Spec.VolumeClaimTemplates) != 0 || f["snapshot-dir"] != "" || f["snapshot-interval"] != "" {
		t.Errorf("snapshots off by default: want no claim and no --snapshot-dir, got %d claims, flags %v", len(r.sts.Spec.VolumeClaimTemplates), f)
	}
	for _, tc := range []struct {
		name         string
		sets         []string
		storageClass *string
		size         string
		interval     string
	}{
		{"defaults", []string{"snapshots.enabled=true"}, nil, "1Gi", "10s"},
		{"custom", []string{"snapshots.enabled=true", "snapshots.storageClass=fast-ssd", "snapshots.size=5Gi", "snapshots.interval=30s"},
			ptr("fast-ssd"), "5Gi", "30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.sets...)
			c := r.container(t)
			f := flags(t, c)
			if f["snapshot-interval"] != tc.interval {
				t.Errorf("--snapshot-interval=%s, want %s", f["snapshot-interval"], tc.interval)
			}
			claims := r.sts.Spec.VolumeClaimTemplates
			if len(claims) != 1 {
				t.Fatalf("%d volumeClaimTemplates, want 1", len(claims))
			}
			pvc := claims[0]
			if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse(tc.size)) != 0 {
				t.Errorf("claim requests %v, want %s", got.String(), tc.size)
			}
			if (pvc.Spec.StorageClassName == nil) != (tc.storageClass == nil) ||
				(tc.storageClass != nil && *pvc.Spec.StorageClassName != *tc.storageClass) {
				t.Errorf("storageClassName %v, want %v (nil: the cluster's default)", pvc.Spec.StorageClassName, tc.storageClass)
			}
			if len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce {
				t.Errorf("access modes %v, want ReadWriteOnce: one pod, one claim", pvc.Spec.AccessModes)
			}
			var mount *corev1.VolumeMount
			for i, m := range c.VolumeMounts {
				if m.Name == pvc.Name {
					mount = &c.VolumeMounts[i]
				}
			}
			if mount == nil || mount.MountPath != f["snapshot-dir"] || mount.ReadOnly || mount.SubPath != "" {
				t.Errorf("claim %s mounted as %+v, want it writable at --snapshot-dir=%s", pvc.Name, mount, f["snapshot-dir"])
			}
			for _, v := range r.sts.Spec.Template.Spec.Volumes {
				if v.Name == pvc.Name {
					t.Errorf("pod volume %s shadows the claim template of that name", v.Name)
				}
			}
			if !strings.HasPrefix(f["snapshot-dir"], "/") {
				t.Errorf("--snapshot-dir=%s is not an absolute path", f["snapshot-dir"])
			}
			p := r.sts.Spec.PersistentVolumeClaimRetentionPolicy
			if p == nil || p.WhenDeleted != "Retain" || p.WhenScaled != "Retain" {
				t.Errorf("claim retention %+v, want Retain on delete and scale: a reinstall finds the counters", p)
			}
			if got := r.sts.Spec.Template.Spec.SecurityContext.FSGroup; got == nil {
				t.Error("no fsGroup: the non-root user could not write to the volume")
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
