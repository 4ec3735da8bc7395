package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// rlnodeBin is the path of the rlnode binary built by TestMain, or "" when
// the tests are skipped (-short).
var rlnodeBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "ringlimit-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	bin, err := buildRlnode(dir)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	rlnodeBin = bin
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// moduleDir returns the root directory of this module.
func moduleDir() (string, error) {
	// go test puts its own GOROOT/bin first in PATH, so "go" is the
	// toolchain running these tests.
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a module (GOMOD=%q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// buildRlnode builds ./cmd/rlnode of this module into dir, without -race.
func buildRlnode(dir string) (string, error) {
	root, err := moduleDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "rlnode")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rlnode")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/rlnode: %w\n%s", err, out)
	}
	return bin, nil
}
