package main

import (
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	c, err := parseConfig([]string{"-rlnode", "bin/rlnode", "-concurrency", "8, 1,2,8", "-duration", "1s", "-modes", "redis, client"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Concurrency, []int{1, 2, 8}) || c.Duration != time.Second || c.Keys != 10_000 ||
		len(c.Modes) != 2 || c.Modes[0].Name != "client" || c.Modes[1].Name != "redis" || c.BenchWarmup != 100*time.Millisecond {
		t.Errorf("parseConfig = %+v", c)
	}
	if c, err = parseConfig([]string{"-from", "results.json"}, io.Discard); err != nil {
		t.Errorf("-from without -rlnode: %v, want no error", err)
	}
	if len(c.Modes) != len(modes)-1 || slices.ContainsFunc(c.Modes, func(m mode) bool { return m.Before }) {
		t.Errorf("default -modes = %v, want every mode but client-before", c.Modes)
	}
	if c, err = parseConfig([]string{"-rlnode", "new", "-before", "old", "-modes", "client-before,client"}, io.Discard); err != nil ||
		len(c.Modes) != 2 || c.Modes[1].Name != "client-before" || c.Before != "old" {
		t.Errorf("-before old -modes client-before,client: %+v, %v; want both, in legend order", c, err)
	}
}

func TestParseConfigBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "-rlnode: no binary"},
		{[]string{"-rlnode", "x", "-concurrency", "1,,2"}, "-concurrency: \"\""},
		{[]string{"-rlnode", "x", "-concurrency", "0"}, "-concurrency: \"0\", want a number from 1 to 4096"},
		{[]string{"-rlnode", "x", "-concurrency", "5000"}, "-concurrency: \"5000\""},
		{[]string{"-rlnode", "x", "-duration", "0s"}, "-duration: 0s"},
		{[]string{"-rlnode", "x", "-rounds", "0"}, "-rounds: 0, want 1 to 100"},
		{[]string{"-rlnode", "x", "-warmup", "-1s"}, "-warmup: -1s"},
		{[]string{"-rlnode", "x", "-bench-warmup", "-1s"}, "-bench-warmup: -1s"},
		{[]string{"-rlnode", "x", "-count", "0"}, "-count: 0, want 1 to 10000000"},
		{[]string{"-rlnode", "x", "-count", "10000001"}, "-count: 10000001"},
		{[]string{"-rlnode", "x", "-keys", "-1"}, "-keys: -1"},
		{[]string{"-rlnode", "x", "-timeout", "0s"}, "-timeout: 0s"},
		{[]string{"-rlnode", "x", "-out", ""}, "-out: empty"},
		{[]string{"-rlnode", "x", "extra"}, `unexpected argument "extra"`},
		{[]string{"-rlnode", "x", "-modes", "client,redsi"}, `-modes: "redsi", want some of client,client-before,grpc`},
		{[]string{"-rlnode", "x", "-modes", "client-before"}, `-modes: "client-before" needs -before`},
	} {
		_, err := parseConfig(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseConfig(%q): %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}
