package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// maxPageLines is the most lines a page may have (STYLE.md rule 18): a
// page a reader finishes. A longer page is split by topic.
const maxPageLines = 400

// longPages are the pages allowed over maxPageLines while their rewrite
// for readers is to come: none now, and the list only shrinks.
var longPages []string

// TestDocPagesAreShort checks the pages of docs/ and the repository's root.
func TestDocPagesAreShort(t *testing.T) {
	files, err := markdownFiles(os.DirFS(".."))
	if err != nil {
		t.Fatal(err)
	}
	problems, err := checkLengths(os.DirFS(".."), files, longPages)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestDocLengthsCheckFindsLongPages proves the check refuses what it should.
func TestDocLengthsCheckFindsLongPages(t *testing.T) {
	lines := func(n int) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte(strings.Repeat("text\n", n))}
	}
	fsys := fstest.MapFS{
		"README.md":       lines(maxPageLines),
		"LONG.md":         lines(maxPageLines + 1),
		"CHANGELOG.md":    lines(maxPageLines + 1),
		"docs/a.md":       lines(maxPageLines + 1),
		"docs/bench/b.md": lines(maxPageLines + 1),
		"docs/listed.md":  lines(maxPageLines + 1),
		"docs/shorter.md": lines(3),
		"snapshot/FMT.md": lines(maxPageLines + 1), // not a page of docs/ or the root
	}
	files := []string{"README.md", "LONG.md", "CHANGELOG.md", "docs/a.md", "docs/bench/b.md", "docs/listed.md", "docs/shorter.md", "snapshot/FMT.md"}
	got, err := checkLengths(fsys, files, []string{"docs/listed.md", "docs/shorter.md", "docs/gone.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"LONG.md: 401 lines, more than 400: split it by topic",
		"docs/a.md: 401 lines, more than 400: split it by topic",
		"docs/bench/b.md: 401 lines, more than 400: split it by topic",
		"docs/gone.md: on longPages but not a page",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// checkLengths returns one line per page among files (those of docs/ and
// of the root, but CHANGELOG.md, a log that grows by design) over
// maxPageLines and not in allowed, and one per name in allowed that is
// no page at all (a misspelt entry would allow nothing).
func checkLengths(fsys fs.FS, files, allowed []string) ([]string, error) {
	var problems []string
	seen := map[string]bool{}
	for _, f := range files {
		if f == "CHANGELOG.md" || (path.Dir(f) != "." && !strings.HasPrefix(f, "docs/")) {
			continue
		}
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		seen[f] = true
		n := strings.Count(strings.TrimSuffix(string(data), "\n"), "\n") + 1
		if n > maxPageLines && !slices.Contains(allowed, f) {
			problems = append(problems, fmt.Sprintf("%s: %d lines, more than %d: split it by topic", f, n, maxPageLines))
		}
	}
	for _, f := range allowed {
		if !seen[f] {
			problems = append(problems, fmt.Sprintf("%s: on longPages but not a page", f))
		}
	}
	return problems, nil
}
