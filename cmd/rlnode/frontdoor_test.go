package main

import (
	"context"
	"flag"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
)

// runCLI runs rlnode with args and returns its exit status, stdout, and
// stderr as a terminal shows it (the error line included).
func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errs strings.Builder
	err := run(context.Background(), args, env(nil), &out, &errs)
	code = exitCode(err, &errs)
	return code, out.String(), errs.String()
}

// TestFrontDoorFitsOnAScreen: rlnode --help shows the flags a user sets
// first, grouped, within 50 lines of 80 columns, and points to rlnode
// help flags for all of them.
func TestFrontDoorFitsOnAScreen(t *testing.T) {
	code, out, _ := runCLI("--help")
	if code != 0 {
		t.Fatalf("rlnode --help: exit %d", code)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) > 50 {
		t.Errorf("rlnode --help is %d lines, want at most 50:\n%s", len(lines), out)
	}
	for _, l := range lines {
		if len(l) > 80 {
			t.Errorf("line of %d columns, want at most 80: %q", len(l), l)
		}
	}
	if !strings.Contains(out, "rlnode help flags lists all") {
		t.Errorf("rlnode --help does not point to rlnode help flags:\n%s", out)
	}
	front := 0
	for name, p := range flagPlaces() {
		if p.front == "" {
			continue
		}
		front++
		if !strings.Contains(out, "--"+name+" ") {
			t.Errorf("rlnode --help does not show the front-door flag --%s", name)
		}
	}
	if front < 12 || front > 18 {
		t.Errorf("%d front-door flags, want about 15", front)
	}
	for _, g := range []string{"Serving", "Cluster", "Security", "Storage", "Limits"} {
		if !strings.Contains(out, "\n  "+g+"\n") {
			t.Errorf("rlnode --help has no group %s:\n%s", g, out)
		}
	}
	if strings.Contains(out, "--max-log-entries") {
		t.Errorf("rlnode --help shows a flag that is not a front-door one:\n%s", out)
	}
}

// TestHelpFlagsListsEveryFlag: rlnode help flags, and docs/flags.md,
// list every serving flag with its text, one not placed in a group
// under Other.
func TestHelpFlagsListsEveryFlag(t *testing.T) {
	fs := helpFlags()
	fs.Int("a-new-flag", 7, "a flag someone added without a group")
	var text, md strings.Builder
	writeFlags(&text, fs)
	writeFlagsMarkdown(&md, fs)
	fs.VisitAll(func(f *flag.Flag) {
		_, usage := flag.UnquoteUsage(f)
		if !strings.Contains(text.String(), "\n  --"+f.Name+" ") && !strings.Contains(text.String(), "\n  --"+f.Name+"\n") {
			t.Errorf("rlnode help flags does not list --%s", f.Name)
		}
		if !strings.Contains(md.String(), "| `--"+f.Name+"` |") || !strings.Contains(md.String(), strings.ReplaceAll(usage, "|", `\|`)) {
			t.Errorf("the markdown does not list --%s with its text", f.Name)
		}
	})
	if i, j := strings.Index(text.String(), "\nOther\n"), strings.Index(text.String(), "--a-new-flag"); i < 0 || j < i {
		t.Errorf("a flag with no group is not listed under Other:\n%s", text.String())
	}
}

// TestFlagPlacesNameFlags: every flag flagPlaces places is a serving
// flag, so that a renamed flag leaves no stale entry.
func TestFlagPlacesNameFlags(t *testing.T) {
	fs := helpFlags()
	for name := range flagPlaces() {
		if fs.Lookup(name) == nil {
			t.Errorf("flagPlaces places --%s, which is no serving flag", name)
		}
	}
}

// TestFlagsDocIsCurrent: docs/flags.md is what rlnode help flags
// --markdown prints.
func TestFlagsDocIsCurrent(t *testing.T) {
	doc, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	writeFlagsMarkdown(&want, helpFlags())
	if string(doc) != want.String() {
		t.Errorf("docs/flags.md differs from the flags: run go generate ./cmd/rlnode")
	}
}

// TestNewcomerMistakes: what a newcomer typed gets one line saying what
// was wanted, with exit status 2, and no dump of the flags; asking for
// help exits 0.
func TestNewcomerMistakes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout and stderr together
	}{
		{[]string{"chek"}, 2, `unknown command "chek" (did you mean check?); the commands are check, members, top`},
		{[]string{"help", "chek"}, 2, `unknown command "chek" (did you mean check?)`},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"; the commands are check,`},
		{[]string{"help", "--help"}, 0, "Usage: rlnode help [COMMAND | flags"},
		{[]string{"help", "-h"}, 0, "Usage: rlnode help [COMMAND | flags"},
		{[]string{"version", "--help"}, 0, "Usage: rlnode version"},
		{[]string{"policy", "--help"}, 0, "Usage: rlnode policy check PATH"},
		{[]string{"check", "--duration", "60"}, 2, `check: --duration: want a duration with its unit, such as 500ms, 30s, 5m or 1h30m, got "60"`},
		{[]string{"check", "--limit", "ten"}, 2, `check: --limit: want a whole number, got "ten"`},
		{[]string{"check", "--json=maybe"}, 2, `check: --json: want true or false, got "maybe"`},
		{[]string{"check", "--addr"}, 2, `check: --addr: needs a value (rlnode help check lists them)`},
		{[]string{"--max-keys", "many"}, 2, `--max-keys: want a whole number, got "many"`},
		{[]string{"--frob"}, 2, "unknown flag --frob; rlnode help flags lists them"},
		{[]string{"--max-kys", "3"}, 2, "unknown flag --max-kys (did you mean --max-keys?)"},
		{[]string{"top", "--onse"}, 2, "top: unknown flag --onse (did you mean --once?); rlnode help top lists them"},
		{[]string{"--http-addr", ":0", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"members", "--addr", "127.0.0.1:1", "extra"}, 2, `members: unexpected argument "extra"`},
		{[]string{"top", "--addr", "127.0.0.1:1", "extra"}, 2, `top: unexpected argument "extra"`},
		{[]string{"check", "--key", "k", "--limit", "1", "extra"}, 2, `check: unexpected argument "extra"`},
		{[]string{"bench", "extra"}, 2, `bench: unexpected argument "extra"`},
		{[]string{"bench-rlqs", "extra"}, 2, `bench-rlqs: unexpected argument "extra"`},
		{[]string{"help", "check", "extra"}, 2, `help: unexpected argument "extra"`},
		{[]string{"help", "flags", "extra"}, 2, `help flags: unexpected argument "extra"`},
		{[]string{"version", "extra"}, 2, `version: unexpected argument "extra"`},
		{[]string{"policy", "check", "a.yaml", "extra"}, 2, `policy check: unexpected argument "extra"`},
	} {
		code, out, stderr := runCLI(tc.args...)
		all := out + stderr
		if code != tc.code || !strings.Contains(all, tc.want) {
			t.Errorf("rlnode %s: exit %d, printed %q; want %d and %q", strings.Join(tc.args, " "), code, all, tc.code, tc.want)
		}
		if tc.code == 2 && strings.Count(all, "\n") != 1 {
			t.Errorf("rlnode %s: printed %d lines, want the error's one:\n%s", strings.Join(tc.args, " "), strings.Count(all, "\n"), all)
		}
	}
}

// TestBadVariable: a bad RLNODE_* value says what the flag wants.
func TestBadVariable(t *testing.T) {
	_, err := parseConfig(nil, secured(map[string]string{"RLNODE_BATCH_WAIT": "5"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), `RLNODE_BATCH_WAIT: want a duration with its unit, such as 500ms, 30s, 5m or 1h30m, got "5"`) {
		t.Errorf("RLNODE_BATCH_WAIT=5: %v", err)
	}
}

// TestEveryCommandsHelp: each command's -h exits 0 and sets its flags
// apart from its text, under "Flags:" after a blank line (bench-rlqs
// ran its text into the first flag).
func TestEveryCommandsHelp(t *testing.T) {
	for _, c := range commands() {
		if c.name == "help" || c.name == "version" || c.name == "policy" {
			continue // no flags of their own
		}
		code, out, stderr := runCLI(c.name, "--help")
		all := out + stderr
		if code != 0 || !strings.Contains(all, "Usage: rlnode "+c.name) {
			t.Errorf("rlnode %s --help: exit %d, printed %q", c.name, code, all)
			continue
		}
		lines := strings.Split(all, "\n")
		first := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "  -") })
		if first < 2 || lines[first-1] != "Flags:" || lines[first-2] != "" {
			t.Errorf("rlnode %s --help: its flags are not set apart under Flags:\n%s", c.name, all)
		}
	}
}
