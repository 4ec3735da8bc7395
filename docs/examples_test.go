package docs

import (
	"os"
	"strings"
	"testing"
)

// TestPOSTExamplesSendJSON: every curl that POSTs in the repository's
// pages, the Makefile's cluster message and the chart's notes says
// Content-Type: application/json, which a node requires (curl -d alone
// sends a form, refused 415).
func TestPOSTExamplesSendJSON(t *testing.T) {
	files, err := markdownFiles(os.DirFS(".."))
	if err != nil {
		t.Fatal(err)
	}
	posts := 0
	for _, f := range append(files, "Makefile", "deploy/helm/ringlimit/templates/NOTES.txt") {
		text, err := os.ReadFile("../" + f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(text), "\n") {
			if !strings.Contains(line, "curl ") || !strings.Contains(line, "POST") {
				continue
			}
			posts++
			if !strings.Contains(line, "-H 'Content-Type: application/json'") {
				t.Errorf("%s:%d: a POST without -H 'Content-Type: application/json': %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
	if posts < 5 {
		t.Errorf("found %d curl POSTs, want the README's and the docs' examples: the scan is wrong", posts)
	}
}
