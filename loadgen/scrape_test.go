package loadgen

import (
	"errors"
	"strings"
	"testing"
)

func TestCPUSeconds(t *testing.T) {
	const help = "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n" +
		"# TYPE process_cpu_seconds_total counter\n"
	for _, tc := range []struct {
		name, text string
		want       float64 // when err is ""
		err        string  // a part of the error
	}{
		{"served", help + "process_cpu_seconds_total 1.23\n", 1.23, ""},
		{"among others", "go_goroutines 12\n" + help + "process_cpu_seconds_total 4.5\nprocess_max_fds 1024\n", 4.5, ""},
		{"no final newline", "process_cpu_seconds_total 7", 7, ""},
		{"timestamp", "process_cpu_seconds_total 2.5 1712345678901\n", 2.5, ""},
		{"exponent", "process_cpu_seconds_total 1.5e+03\n", 1500, ""},
		{"empty labels", "process_cpu_seconds_total{} 3\n", 3, ""},
		{"tab and CRLF", "process_cpu_seconds_total\t0.25\r\n", 0.25, ""},
		{"leading space", "  process_cpu_seconds_total 8\n", 8, ""},
		{"zero", "process_cpu_seconds_total 0\n", 0, ""},
		{"labelled series skipped", "process_cpu_seconds_total{mode=\"user\"} 9\nprocess_cpu_seconds_total 1\n", 1, ""},
		{"longer name skipped", "process_cpu_seconds_total_other 9\nprocess_cpu_seconds_total 2\n", 2, ""},
		{"first sample wins", "process_cpu_seconds_total 1\nprocess_cpu_seconds_total 2\n", 1, ""},

		{"empty", "", 0, "not served"},
		{"only comments", help, 0, "not served"},
		{"only labelled", "process_cpu_seconds_total{mode=\"user\"} 9\n", 0, "not served"},
		{"other metrics", "go_goroutines 12\nprocess_resident_memory_bytes 1e+07\n", 0, "not served"},
		{"no value", "process_cpu_seconds_total\n", 0, "malformed"},
		{"no value at end", "process_cpu_seconds_total", 0, "malformed"},
		{"too many fields", "process_cpu_seconds_total 1 2 3\n", 0, "malformed"},
		{"not a number", "process_cpu_seconds_total lots\n", 0, "value"},
		{"NaN", "process_cpu_seconds_total NaN\n", 0, "value"},
		{"infinite", "process_cpu_seconds_total +Inf\n", 0, "value"},
		{"negative", "process_cpu_seconds_total -1\n", 0, "value"},
		{"overflow", "process_cpu_seconds_total 1e999\n", 0, "value"},
		{"HTML", "<html><body>process_cpu_seconds_total</body></html>", 0, "not served"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cpuSeconds(tc.text)
			switch {
			case tc.err == "" && (err != nil || got != tc.want):
				t.Errorf("cpuSeconds = %v, %v; want %v", got, err, tc.want)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errCPUUnknown)):
				t.Errorf("cpuSeconds = %v, %v; want an error wrapping errCPUUnknown that says %q", got, err, tc.err)
			}
		})
	}
}

// TestCPUSecondsQuotesBoundedValue: an absurd value is not copied whole
// into the error that the report prints.
func TestCPUSecondsQuotesBoundedValue(t *testing.T) {
	_, err := cpuSeconds("process_cpu_seconds_total " + strings.Repeat("x", 10_000) + "\n")
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("error of %d bytes, want a short one: %.300v", len(err.Error()), err)
	}
}
