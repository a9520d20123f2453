package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFloorCopiesBuildInputs: the floor script's copy of the module holds
// its sources and none of .git (a worktree's file), bench/, test data or a
// built caddy.
func TestFloorCopiesBuildInputs(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "copy")
	files := []string{"go.mod", "handler.go", "limiter/limit.lua", "internal/x/x.go", "docs/caddy.md",
		".git", "caddy", "bench/go.mod", "testdata/sdk/node_modules/a.js", "limiter/testdata/case.txt"}
	writeTree(t, src, files)
	if err := copyTree(src, dst, buildInputs); err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		_, err := os.Stat(filepath.Join(dst, f))
		if copied := i < 5; copied != (err == nil) {
			t.Errorf("%s: copied %v, want %v (%v)", f, err == nil, copied, err)
		}
	}
	for _, dir := range []string{"bench", "testdata", "limiter/testdata"} {
		if _, err := os.Stat(filepath.Join(dst, dir)); !os.IsNotExist(err) {
			t.Errorf("%s was made in the copy (err %v)", dir, err)
		}
	}
}
