package main

//go:generate sh -c "go run . help flags --markdown > ../../docs/flags.md"

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// command is a subcommand as usage lists it.
type command struct{ name, summary string }

// commands are rlnode's subcommands, in the order usage lists them.
func commands() []command {
	return []command{
		{"check", "ask a node whether a request may go ahead, or reserve and settle"},
		{"members", "list a node's view of the cluster"},
		{"top", "who is being limited: the hottest and most refused keys, live"},
		{"bench", "measure a node or cluster with a bounded load"},
		{"bench-rlqs", "simulated Envoys on one quota bucket of a cluster"},
		{"policy", "rlnode policy check PATH: validate policy files offline"},
		{"help", "say how to use rlnode, a command, or every flag: rlnode help flags"},
		{"version", "print the build: module version, VCS revision, Go version"},
	}
}

// commandNames lists the commands' names.
func commandNames() []string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return names
}

// unknownCommand is the error of a command name that is none of
// rlnode's: it lists them, and suggests the nearest.
func unknownCommand(name string) error {
	return fmt.Errorf("unknown command %q%s; the commands are %s (rlnode help says more)",
		name, didYouMean(name, commandNames(), ""), strings.Join(commandNames(), ", "))
}

// helpFlags builds the serving flags for the help: with no host name, so
// that --node-name shows no machine's default and docs/flags.md is the
// same everywhere.
func helpFlags() *flag.FlagSet { return new(Config).flags("") }

// writeUsage writes rlnode's usage, its front door, to w: the commands,
// then the flags a user sets first, by group; rlnode help flags lists
// all of them. It is what rlnode --help prints.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, `rlnode is a ringlimit node, and the clients that talk to one.

Usage:
  rlnode [flags]              serve; no flags: a one-node cluster, default ports
  rlnode <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fs, places := helpFlags(), flagPlaces()
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	fmt.Fprintf(w, "\nThe flags set first (rlnode help flags lists all %d); each is also an RLNODE_*\n", n)
	fmt.Fprint(w, "variable (--http-addr is RLNODE_HTTP_ADDR):\n")
	for _, g := range groups(fs) {
		var front []*flag.Flag
		for _, f := range g.flags {
			if places[f.Name].front != "" {
				front = append(front, f)
			}
		}
		if len(front) == 0 {
			continue
		}
		title, _, _ := strings.Cut(g.group.title(), ":")
		fmt.Fprintf(w, "  %s\n", title)
		for _, f := range front {
			line := fmt.Sprintf("    --%-15s %s", f.Name, places[f.Name].front)
			if def := shownDefault(f); def != "" {
				line += fmt.Sprintf(" (%s)", def)
			}
			fmt.Fprintln(w, line)
		}
	}
	fmt.Fprint(w, `
Given no address and no security (TLS, a gossip key), a port listens on
127.0.0.1 only.

Exit status: 0 on success, 1 when rlnode check was refused (OVER_LIMIT) or
rlnode policy check found the files invalid, 2 on any other error.
`)
}

// flagGroupOf is one group of serving flags, in the order they are shown.
type flagGroupOf struct {
	group flagGroup
	flags []*flag.Flag
}

// groups returns fs's flags by group (flagPlaces), the groups in order
// and Other last, the flags of a group by name.
func groups(fs *flag.FlagSet) []flagGroupOf {
	places := flagPlaces()
	by := map[flagGroup][]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) { by[places[f.Name].group] = append(by[places[f.Name].group], f) })
	var out []flagGroupOf
	for _, g := range []flagGroup{groupServing, groupCluster, groupSecurity, groupStorage, groupLimits, groupOther} {
		if len(by[g]) > 0 {
			out = append(out, flagGroupOf{g, by[g]})
		}
	}
	return out
}

// shownDefault is f's default as the help shows it: none for an empty
// string, zero or false, which the text explains where it means more.
func shownDefault(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "0s", "false":
		return ""
	}
	return f.DefValue
}

// writeFlags writes every flag of fs, the serving flags, to w by group,
// each with its default and its whole text: rlnode help flags.
func writeFlags(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `Every flag of a serving rlnode, by group. Each is also an environment
variable, RLNODE_ and its name in capitals (--http-addr is RLNODE_HTTP_ADDR);
a flag given beats its variable. docs/flags.md lists the same.
`)
	for _, g := range groups(fs) {
		fmt.Fprintf(w, "\n%s\n", g.group.title())
		for _, f := range g.flags {
			kind, usage := flag.UnquoteUsage(f)
			line := "  --" + f.Name
			if kind != "" {
				line += " " + kind
			}
			if def := shownDefault(f); def != "" {
				line += fmt.Sprintf("  (default %s)", def)
			}
			fmt.Fprintln(w, line)
			for _, l := range wrap(usage, 72) {
				fmt.Fprintf(w, "        %s\n", l)
			}
		}
	}
}

// writeFlagsMarkdown writes what writeFlags does as Markdown:
// docs/flags.md, which go generate makes with it.
func writeFlagsMarkdown(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `# Flags

<!-- Generated from cmd/rlnode/config.go by go generate ./cmd/rlnode (rlnode help flags --markdown): do not edit. -->

Every flag of a serving `+"`rlnode`"+`, by group, as `+"`rlnode help flags`"+` lists
them; `+"`rlnode --help`"+` shows the few set first. Each is also an environment
variable, `+"`RLNODE_`"+` and its name in capitals (`+"`--http-addr`"+` is
`+"`RLNODE_HTTP_ADDR`"+`); a flag given beats its variable.
`)
	for _, g := range groups(fs) {
		fmt.Fprintf(w, "\n## %s\n\n| flag | default | meaning |\n|---|---|---|\n", g.group.title())
		for _, f := range g.flags {
			_, usage := flag.UnquoteUsage(f)
			def := shownDefault(f)
			if def != "" {
				def = "`" + def + "`"
			}
			fmt.Fprintf(w, "| `--%s` | %s | %s |\n", f.Name, def, strings.ReplaceAll(usage, "|", `\|`))
		}
	}
}

// wrap breaks text into lines of at most width bytes, at spaces (a word
// longer than width has a line of its own).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return append(lines, line)
}

// withUsage makes text, then the flags, fs's usage: what -h prints.
func withUsage(fs *flag.FlagSet, text string) {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), strings.TrimRight(text, "\n")+"\n\nFlags:\n")
		fs.PrintDefaults()
	}
}

// helpUsage is `rlnode help --help`.
const helpUsage = `Usage: rlnode help [COMMAND | flags [--markdown]]

Says how to use rlnode (its commands and the flags set first), one command
(rlnode help check), or every serving flag by group (rlnode help flags;
with --markdown, as docs/flags.md).
`

// runHelp is `rlnode help [command | flags]`: the usage, a command's, or
// every serving flag, on stdout.
func runHelp(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	switch {
	case len(args) == 0:
		writeUsage(stdout)
		return nil
	case isHelpFlag(args[0]):
		_, err := io.WriteString(stdout, helpUsage)
		return err
	case args[0] == "flags":
		switch {
		case len(args) == 1:
			writeFlags(stdout, helpFlags())
		case len(args) == 2 && args[1] == "--markdown":
			writeFlagsMarkdown(stdout, helpFlags())
		default:
			return fmt.Errorf("help flags: unexpected argument %q (rlnode help flags [--markdown])", args[len(args)-1])
		}
		return nil
	case len(args) > 1:
		return fmt.Errorf("help: unexpected argument %q (rlnode help [COMMAND | flags])", args[1])
	}
	name := args[0]
	if !slices.Contains(commandNames(), name) {
		return fmt.Errorf("help: %w", unknownCommand(name))
	}
	if name == "help" || name == "version" {
		return runHelp(ctx, nil, getenv, stdout)
	}
	return run(ctx, []string{name, "-h"}, getenv, stdout, stdout)
}

// isHelpFlag reports whether arg asks for help, as flag's -h does.
func isHelpFlag(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "--h"
}

// parseFlags parses args with fs, allowing at most positional arguments
// after the flags. It prints nothing but the usage, and that only for
// -h (returning flag.ErrHelp): any other error is one line that says what
// was wanted and where the flags are listed, rather than the flag
// package's message followed by every flag.
func parseFlags(fs *flag.FlagSet, args []string, positional int) error {
	usage, out := fs.Usage, fs.Output()
	var bad error // the first value a flag refused, with what it wants
	fs.VisitAll(func(f *flag.Flag) { f.Value = checkedValue{f.Value, f.Name, &bad} })
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.VisitAll(func(f *flag.Flag) { f.Value = f.Value.(checkedValue).Value })
	fs.SetOutput(out)
	fs.Usage = usage
	where := "rlnode help flags lists them"
	if cmd, ok := strings.CutPrefix(fs.Name(), "rlnode "); ok {
		where = "rlnode help " + strings.Fields(cmd)[0] + " lists them"
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case bad != nil:
		return commandErr(fs, bad)
	case err != nil:
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			var names []string
			fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
			return commandErr(fs, fmt.Errorf("unknown flag --%s%s; %s", name, didYouMean(name, names, "--"), where))
		}
		if name, ok := strings.CutPrefix(err.Error(), "flag needs an argument: -"); ok {
			return commandErr(fs, fmt.Errorf("--%s: needs a value (%s)", name, where))
		}
		return commandErr(fs, fmt.Errorf("%w (%s)", err, where))
	case fs.NArg() > positional:
		return commandErr(fs, fmt.Errorf("unexpected argument %q", fs.Arg(positional)))
	}
	return nil
}

// commandErr prefixes err with fs's command, as in "check: ..." (none for
// the serving flags, whose set is named rlnode).
func commandErr(fs *flag.FlagSet, err error) error {
	if cmd, ok := strings.CutPrefix(fs.Name(), "rlnode "); ok {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return err
}

// checkedValue is a flag's value while parseFlags parses: it keeps the
// first value refused, said as badValue says it.
type checkedValue struct {
	flag.Value
	name string
	bad  *error
}

func (v checkedValue) Set(s string) error {
	err := v.Value.Set(s)
	if err != nil && *v.bad == nil {
		*v.bad = badValue("--"+v.name, v.Value, s, err)
	}
	return err
}

// IsBoolFlag keeps a boolean flag one that takes no value.
func (v checkedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// badValue says that a flag's v, given as what (--duration, or its
// variable), refused value with err: what the flag wants, in one line.
func badValue(what string, v flag.Value, value string, err error) error {
	var want string
	if g, ok := v.(flag.Getter); ok {
		switch g.Get().(type) {
		case bool:
			want = "true or false"
		case int, int64, uint, uint64:
			want = "a whole number"
		case float64:
			want = "a number"
		case time.Duration:
			want = "a duration with its unit, such as 500ms, 30s, 5m or 1h30m"
		}
	}
	if want == "" {
		return fmt.Errorf("%s: %q: %w", what, value, err)
	}
	if strings.Contains(err.Error(), "out of range") {
		return fmt.Errorf("%s: want %s, got %q (out of range)", what, want, value)
	}
	return fmt.Errorf("%s: want %s, got %q", what, want, value)
}

// didYouMean returns " (did you mean <prefix>X?)" for the name in names
// nearest to s (at most a third of its letters changed, or a prefix), or
// "" if none is near.
func didYouMean(s string, names []string, prefix string) string {
	best, bestDist := "", len(s)/3+1
	for _, n := range names {
		d := editDistance(s, n)
		if strings.HasPrefix(n, s) && len(s) >= 3 {
			d = min(d, 1)
		}
		if d < bestDist || d == bestDist && best != "" && n < best {
			best, bestDist = n, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s%s?)", prefix, best)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// writeVersion is `rlnode version`: the build information the Go toolchain
// recorded in the binary.
func writeVersion(w io.Writer) error {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		_, err := fmt.Fprintln(w, "rlnode: no build information (not built with module support)")
		return err
	}
	_, err := io.WriteString(w, formatVersion(bi))
	return err
}

// formatVersion says which rlnode bi is: its module version ("(devel)"
// when built from a checkout), the VCS revision, its time and whether the
// tree had local changes, and the Go version.
func formatVersion(bi *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	version := bi.Main.Version
	if version == "" {
		version = "(unknown)"
	}
	s := fmt.Sprintf("rlnode %s\n  module    %s\n", version, bi.Main.Path)
	for _, kv := range []struct{ label, key string }{
		{"revision", "vcs.revision"}, {"time", "vcs.time"}, {"modified", "vcs.modified"},
	} {
		if v, ok := settings[kv.key]; ok {
			s += fmt.Sprintf("  %-9s %s\n", kv.label, v)
		}
	}
	return s + fmt.Sprintf("  go        %s\n", bi.GoVersion)
}
