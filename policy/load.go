package policy

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Load reads the policies at path: a YAML file, or a directory whose
// *.yaml and *.yml files (not those whose name starts with '.', such as a
// Kubernetes ConfigMap's ..data) are read in name order; a directory
// without any is an error. Each file holds one domain per `---`
// document; a domain may be defined once. The first error, an *Error
// naming file, line and field, rejects the whole set.
func Load(path string) (*Set, error) {
	files, err := policyFiles(path)
	if err != nil {
		return nil, err
	}
	set := newSet()
	for _, f := range files {
		data, err := readBounded(f)
		if err != nil {
			return nil, err
		}
		p := parser{file: f, set: set}
		if err := p.parse(data); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// policyFiles lists the files Load reads for path.
func policyFiles(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("policy directory: %w", err)
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		ext := filepath.Ext(name)
		if strings.HasPrefix(name, ".") || ext != ".yaml" && ext != ".yml" {
			continue
		}
		full := filepath.Join(path, name)
		// Stat follows symlinks, as a ConfigMap's files are.
		if fi, err := os.Stat(full); err != nil || fi.IsDir() {
			continue
		}
		files = append(files, full)
	}
	if len(files) == 0 {
		// An empty set would pass for policies that limit nothing: a
		// mistyped or empty path must fail where it is given.
		return nil, fmt.Errorf("policy directory %s: no policy files (*.yaml, *.yml)", path)
	}
	sort.Strings(files)
	return files, nil
}

// readBounded reads a file, or its first MaxFileSize+1 bytes, which
// parse then rejects as too large.
func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", name, err)
	}
	return data, nil
}

func newSet() *Set { return &Set{domains: map[string]*node{}} }
