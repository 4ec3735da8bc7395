package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnvoyDocPolicyCheck: docs/policies.md's rlnode policy check example
// prints what rlnode policy check prints for the page's own policy file
// (it listed 5 of its 6 policies, at the wrong lines).
func TestEnvoyDocPolicyCheck(t *testing.T) {
	page, err := os.ReadFile("../../docs/policies.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(from, open string) string {
		text := string(page)
		i := strings.Index(text, from)
		if i < 0 {
			t.Fatalf("docs/policies.md has no %q", from)
		}
		j := strings.Index(text[i:], open)
		if j < 0 {
			t.Fatalf("docs/policies.md has no %q after %q", open, from)
		}
		start := i + j + len(open)
		end := strings.Index(text[start:], "```")
		return text[start : start+end]
	}
	yaml := block("## The format", "```yaml\n")
	want := block("$ rlnode policy check policies/\n", "\n")
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "policies"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policies", "edge.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	var out strings.Builder
	if err := run(context.Background(), []string{"policy", "check", "policies/"}, env(nil), &out, &out); err != nil {
		t.Fatalf("rlnode policy check of the page's policy file: %v\n%s", err, out.String())
	}
	if out.String() != want {
		t.Errorf("docs/policies.md shows\n%s\nrlnode policy check prints\n%s", want, out.String())
	}
}
