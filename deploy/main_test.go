package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// bin holds the programs the tests run, built once per `go test` run by
// TestMain rather than once per test: Helm takes minutes to compile on a
// small machine. It is written before any test starts and only read after.
var bin struct {
	helm   string // the Helm CLI pinned in go.mod (go tool helm)
	rlnode string // rlnode built from the parent module
}

func TestMain(m *testing.M) {
	code, err := buildAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy tests:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func buildAndRun(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "ringlimit-deploy-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	// go tool -n builds the tool into the build cache (once) and prints
	// its path.
	out, err := command("go", "tool", "-n", "helm")
	if err != nil {
		return 0, fmt.Errorf("build helm: %w", err)
	}
	bin.helm = strings.TrimSpace(out)
	bin.rlnode = filepath.Join(dir, "rlnode")
	if _, err := command("go", "build", "-C", "..", "-o", bin.rlnode, "./cmd/rlnode"); err != nil {
		return 0, fmt.Errorf("build rlnode: %w", err)
	}
	return m.Run(), nil
}

// command runs a program and returns its stdout; the error carries its
// stderr, which is where helm, docker and go explain themselves.
func command(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
