package loadgen

import (
	"errors"
	"math"
	"testing"
)

// FuzzCPUSeconds: whatever a node, or something else at its address,
// serves as /metrics, reading its CPU time returns seconds >= 0 or an
// error wrapping errCPUUnknown, and never panics.
func FuzzCPUSeconds(f *testing.F) {
	for _, s := range []string{
		"process_cpu_seconds_total 1.23\n", "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total{} 2 17\n",
		"process_cpu_seconds_total", "process_cpu_seconds_total{a=\"}\"} 1\n", "process_cpu_seconds_total NaN",
		"process_cpu_seconds_total\t-0\r\n", "\x00\xff", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := cpuSeconds(s)
		switch {
		case err != nil && !errors.Is(err, errCPUUnknown):
			t.Errorf("error %v does not wrap errCPUUnknown", err)
		case err == nil && !(v >= 0 && !math.IsInf(v, 0)):
			t.Errorf("value %v accepted", v)
		}
	})
}
