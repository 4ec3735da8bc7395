package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/status"
	"github.com/ringlimit/ringlimit/top"
)

// TestParseConfigStatus: the status page is on unless --status-page=false
// (or its variable) turns it off; keys are shown unless hidden; the
// window of the counts is a positive duration.
func TestParseConfigStatus(t *testing.T) {
	c, err := parseConfig(nil, secured(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.StatusPage || c.HideKeys || c.Top.Window != top.DefaultWindow {
		t.Errorf("defaults: page %v, hide keys %v, window %v; want true, false, %v", c.StatusPage, c.HideKeys, c.Top.Window, top.DefaultWindow)
	}
	c, err = parseConfig([]string{"--status-page=false", "--top-window", "1m"}, env(map[string]string{"RLNODE_STATUS_HIDE_KEYS": "true"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.StatusPage || !c.HideKeys || c.Top.Window != time.Minute {
		t.Errorf("set: page %v, hide keys %v, window %v; want false, true, 1m", c.StatusPage, c.HideKeys, c.Top.Window)
	}
	if _, err := parseConfig([]string{"--top-window", "0s"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--top-window") {
		t.Errorf("--top-window 0s: %v, want an error naming it", err)
	}
}

// TestWriteTop: rlnode top's table, ordered by the rate asked for, cut to
// the rows asked for, members that did not answer marked, and a key that
// holds terminal codes quoted rather than written raw.
func TestWriteTop(t *testing.T) {
	v := status.View{
		Report: top.Report{Seconds: 10, ChecksPerSecond: 30, RefusalsPerSecond: 8, Limits: []top.Limit{
			{Name: "api", Hot: []top.Key{{Key: "a", ChecksPerSecond: 20, RefusalsPerSecond: 1}, {Key: "b\x1b[2J", ChecksPerSecond: 5}},
				Refused: []top.Key{{Key: "a", ChecksPerSecond: 20, RefusalsPerSecond: 1}}},
			{Name: "login", Hot: []top.Key{{Key: "ip:9", ChecksPerSecond: 8, RefusalsPerSecond: 7}},
				Refused: []top.Key{{Key: "ip:9", ChecksPerSecond: 8, RefusalsPerSecond: 7}}},
		}},
		Nodes: []status.Node{
			{Member: api.Member{Name: "n1", State: "alive", Share: 0.5}, ChecksPerSecond: 30, RefusalsPerSecond: 8, ReplicationLagSeconds: 0.05},
			{Member: api.Member{Name: "n2", State: "alive", Share: 0.5}, Error: "top to n2: unreachable"},
		},
	}
	var out strings.Builder
	if err := writeTop(&out, v, "checks", 2); err != nil {
		t.Fatal(err)
	}
	want := `cluster  30.0 checks/s  8.0 refusals/s  over 10.0s
MEMBER  STATE  SHARE  CHECKS/S  REFUSALS/S  REPL LAG
n1      alive  50.0%  30.0      8.0         50ms
n2      alive  50.0%  -         -           -  (top to n2: unreachable)

LIMIT  KEY   CHECKS/S  REFUSALS/S
api    a     20.0      1.0
login  ip:9  8.0       7.0
`
	if out.String() != want {
		t.Errorf("by checks:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := writeTop(&out, v, "refusals", 5); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "login  ip:9  8.0       7.0\napi    a     20.0      1.0\n") {
		t.Errorf("by refusals, want ip:9 first:\n%s", got)
	}
	out.Reset()
	writeTop(&out, v, "checks", 5)
	if strings.Contains(out.String(), "\x1b") || !strings.Contains(out.String(), `"b\x1b[2J"`) {
		t.Errorf("a key with terminal codes is written raw:\n%q", out.String())
	}
}

func TestTopFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--keys", "0"}, "--keys"},
		{[]string{"--keys", "65"}, "--keys"},
		{[]string{"--sort", "name"}, "--sort"},
		{[]string{"--interval", "0s"}, "--interval"},
		{[]string{"stray"}, "stray"},
	} {
		err := run(context.Background(), append([]string{"top", "--once"}, c.args...), env(nil), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rlnode top %v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
