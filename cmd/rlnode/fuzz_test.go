package main

import (
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"testing"
)

// FuzzParseGossipKeys: whatever --gossip-key holds, parsing returns keys of
// a valid AES size or an error that does not quote the input, and never
// panics.
func FuzzParseGossipKeys(f *testing.F) {
	for _, s := range []string{
		base64.StdEncoding.EncodeToString(make([]byte, 32)),
		base64.StdEncoding.EncodeToString(make([]byte, 16)) + "," + base64.StdEncoding.EncodeToString(make([]byte, 24)),
		"", ",", " , ", "%%%", "AAAA", "c2VjcmV0", strings.Repeat("A", 44) + ",x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys, err := parseGossipKeys(s)
		if err != nil {
			if len(s) >= 8 && strings.Contains(err.Error(), s) {
				t.Errorf("error %q quotes the input", err)
			}
			return
		}
		if len(keys) == 0 {
			t.Fatal("no keys and no error")
		}
		for _, k := range keys {
			if n := len(k); n != 16 && n != 24 && n != 32 {
				t.Errorf("key of %d bytes accepted", n)
			}
		}
	})
}

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
