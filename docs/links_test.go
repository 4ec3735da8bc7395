// Package docs holds ringlimit's documentation pages. Its test checks that
// every relative link in the repository's markdown files resolves: the
// file or directory exists, and an anchor names a heading of its page.
// Pages moved out of the README and link to each other's sections, so a
// heading renamed in one page breaks links in others; this test says where.
package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// TestLinks checks every markdown file of the repository (this test runs
// in docs/, so the repository is its parent).
func TestLinks(t *testing.T) {
	repo := os.DirFS("..")
	files, err := markdownFiles(repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "SECURITY.md", "BENCHMARKS.md", "docs/cluster.md"} {
		if !slices.Contains(files, want) {
			t.Fatalf("%s not among the files checked (%v): the walk is wrong", want, files)
		}
	}
	problems, err := checkLinks(repo, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestCheckLinksFindsBrokenOnes proves the checker refuses what it should,
// so that TestLinks passing means something.
func TestCheckLinksFindsBrokenOnes(t *testing.T) {
	fsys := fstest.MapFS{
		"README.md": {Data: []byte("# Top\n\n" +
			"[ok](docs/a.md#borrowing-limit-ceiling-and-a-shared-parent) [ok](#top) [ok](pkg) [ok](https://x.test/#nope)\n" +
			"[bad file](docs/missing.md) [bad anchor](docs/a.md#no-such-heading) [bad self](#nowhere)\n" +
			"`[in code](nowhere.md)` and [outside](../outside.md)\n" +
			"```\n[in a fence](nowhere.md)\n```\n")},
		"docs/a.md": {Data: []byte("# A\n\n## Borrowing: limit, ceiling and a shared parent\n\n" +
			"[up](../README.md#top) [dir anchor](../pkg#x)\n")},
		"pkg/x.go": {Data: []byte("package pkg\n")},
	}
	got, err := checkLinks(fsys, []string{"README.md", "docs/a.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:4: docs/missing.md: no such file or directory",
		"README.md:4: docs/a.md#no-such-heading: docs/a.md has no heading with the anchor #no-such-heading",
		"README.md:4: #nowhere: README.md has no heading with the anchor #nowhere",
		"README.md:5: ../outside.md: outside the repository",
		"docs/a.md:5: ../pkg#x: pkg is not a markdown file, so #x cannot name a heading",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAnchor pins GitHub's anchors for headings of the kinds these pages
// use: punctuation dropped, code spans and links kept as their text,
// spaces made hyphens (so "3 -> 5" keeps three), underscores kept.
func TestAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"Borrowing: limit, ceiling and a shared parent":             "borrowing-limit-ceiling-and-a-shared-parent",
		"Envoy's rate limit service":                                "envoys-rate-limit-service",
		"Migrating from envoyproxy/ratelimit":                       "migrating-from-envoyproxyratelimit",
		"Snapshots: checks during a snapshot of 1,000,000 counters": "snapshots-checks-during-a-snapshot-of-1000000-counters",
		"`GLOBAL`: hot keys, answered from a lease":                 "global-hot-keys-answered-from-a-lease",
		"Scale 3 -> 5 -> 3 (`TestChaosScale`)":                      "scale-3---5---3-testchaosscale",
		"`min_interval_ms` and [the spec](x.md)":                    "min_interval_ms-and-the-spec",
		"Ring lookup ":                                              "ring-lookup",
	} {
		if got := anchor(heading); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

// markdownFiles returns the .md files under fsys's root, skipping hidden
// directories and build output.
func markdownFiles(fsys fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "build" || d.Name() == "testdata") {
			return fs.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	return files, err
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional title; target is group 1.
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	linkText   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// checkLinks returns one line per relative link in files that does not
// resolve, as "file:line: target: why", in file order.
func checkLinks(fsys fs.FS, files []string) ([]string, error) {
	anchors := map[string]map[string]bool{} // by file, read once
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		data, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		a := map[string]bool{}
		seen := map[string]int{}
		for _, l := range proseLines(string(data)) {
			m := heading.FindStringSubmatch(l.text)
			if m == nil {
				continue
			}
			slug := anchor(m[1])
			if n := seen[slug]; n > 0 {
				a[fmt.Sprintf("%s-%d", slug, n)] = true
			} else {
				a[slug] = true
			}
			seen[slug]++
		}
		anchors[file] = a
		return a, nil
	}

	var problems []string
	for _, file := range files {
		data, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		for _, l := range proseLines(string(data)) {
			for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l.text, ""), -1) {
				target := m[1]
				if u, err := url.Parse(target); err == nil && u.Scheme != "" {
					continue // http, https, mailto: not ours to check
				}
				if why := resolve(fsys, file, target, anchorsOf); why != "" {
					problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", file, l.n, target, why))
				}
			}
		}
	}
	return problems, nil
}

// resolve says why target, linked from file, does not resolve, or "".
func resolve(fsys fs.FS, file, target string, anchorsOf func(string) (map[string]bool, error)) string {
	p, frag, _ := strings.Cut(target, "#")
	dest := file
	if p != "" {
		unescaped, err := url.PathUnescape(p)
		if err != nil {
			return err.Error()
		}
		dest = path.Join(path.Dir(file), unescaped)
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "outside the repository"
		}
		if _, err := fs.Stat(fsys, dest); err != nil {
			return "no such file or directory"
		}
	}
	if frag == "" {
		return ""
	}
	if !strings.HasSuffix(dest, ".md") {
		return fmt.Sprintf("%s is not a markdown file, so #%s cannot name a heading", dest, frag)
	}
	a, err := anchorsOf(dest)
	if err != nil {
		return err.Error()
	}
	if !a[frag] {
		return fmt.Sprintf("%s has no heading with the anchor #%s", dest, frag)
	}
	return ""
}

// line is a line of a markdown file outside its fenced code blocks, with
// its number (from 1).
type line struct {
	n    int
	text string
}

// proseLines returns the lines of a markdown text that are not in a
// fenced code block (``` or ~~~), where a link or heading is only text.
func proseLines(text string) []line {
	var out []line
	fence := ""
	for i, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(l, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
		case strings.HasPrefix(trimmed, "```"):
			fence = "```"
		case strings.HasPrefix(trimmed, "~~~"):
			fence = "~~~"
		default:
			out = append(out, line{i + 1, l})
		}
	}
	return out
}

// anchor returns the anchor GitHub gives a heading: its text (links and
// code spans reduced to what they show), lower case, with every character
// but letters, digits, spaces, hyphens and underscores dropped, and each
// space made a hyphen.
func anchor(heading string) string {
	text := linkText.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
