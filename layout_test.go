package slidingratelimit

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFilesUseEachOtherOneWay: when a file of a package of this module uses
// a name that another file of its package defines (a package-level name, a
// method or a field), the other file does not use it back, directly or
// around a loop. The files can then be read in one order, each using only
// those before it; a use against that order fails here, with the uses that
// close the loop. Every package is checked: the root, limiter/ and each one
// under internal/.
func TestFilesUseEachOtherOneWay(t *testing.T) {
	dirs := packageDirs(t)
	for _, want := range []string{".", "limiter", "internal/redisconn"} {
		if !slices.Contains(dirs, want) {
			t.Fatalf("packages found: %v, want %s among them", dirs, want)
		}
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			uses := crossFileUses(t, dir)
			for _, loop := range loops(uses) {
				var lines []string
				for _, from := range loop {
					for _, to := range loop {
						if names := uses[from][to]; len(names) > 0 {
							lines = append(lines, fmt.Sprintf("%s uses %s's %s", from, to, strings.Join(names, ", ")))
						}
					}
				}
				t.Errorf("files that use each other: %s\n\t%s", strings.Join(loop, ", "), strings.Join(lines, "\n\t"))
			}
		})
	}
}

// packageDirs returns the directories of the module's packages, relative to
// the root: each directory with Go files but for testdata, hidden ones and
// those of another module (bench/).
func packageDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != "." && err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if dir := filepath.Dir(path); strings.HasSuffix(path, ".go") && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// crossFileUses type-checks the non-test files of the package in dir and
// returns, for each file, the names of the other files it uses, by file,
// each name once and sorted. Imports are not loaded: names of other packages
// stay unresolved, which does not matter here.
func crossFileUses(t *testing.T, dir string) map[string]map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: noImports{}, Error: func(error) {}}
	info := &types.Info{Uses: make(map[*ast.Ident]types.Object)}
	pkg, _ := conf.Check("p", fset, files, info)
	uses := make(map[string]map[string][]string)
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() || !definedAtPackageLevel(pkg, obj) {
			continue
		}
		from, to := filepath.Base(fset.Position(id.Pos()).Filename), filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		if uses[from] == nil {
			uses[from] = make(map[string][]string)
		}
		if !slices.Contains(uses[from][to], obj.Name()) {
			uses[from][to] = append(uses[from][to], obj.Name())
		}
	}
	for _, byFile := range uses {
		for _, names := range byFile {
			slices.Sort(names)
		}
	}
	return uses
}

// definedAtPackageLevel reports whether obj is a package-level name, a
// method or a field: what one file can use of another.
func definedAtPackageLevel(pkg *types.Package, obj types.Object) bool {
	switch obj := obj.(type) {
	case *types.Func:
		return true
	case *types.Var:
		return obj.IsField() || obj.Parent() == pkg.Scope()
	}
	return obj.Parent() == pkg.Scope()
}

type noImports struct{}

func (noImports) Import(string) (*types.Package, error) { return nil, errors.New("not loaded") }

// loops returns the sets of two or more files that use each other, around a
// loop (the strongly connected components of the uses, by Tarjan's
// algorithm), each sorted.
func loops(uses map[string]map[string][]string) [][]string {
	var files []string
	for from, byFile := range uses {
		files = append(files, from)
		for to := range byFile {
			files = append(files, to)
		}
	}
	slices.Sort(files)
	files = slices.Compact(files)

	index, low := make(map[string]int), make(map[string]int)
	onStack := make(map[string]bool)
	var stack []string
	var found [][]string
	var visit func(string)
	visit = func(f string) {
		index[f], low[f] = len(index), len(index)
		stack = append(stack, f)
		onStack[f] = true
		for to := range uses[f] {
			if _, seen := index[to]; !seen {
				visit(to)
				low[f] = min(low[f], low[to])
			} else if onStack[to] {
				low[f] = min(low[f], index[to])
			}
		}
		if low[f] != index[f] {
			return
		}
		var loop []string
		for {
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[top] = false
			loop = append(loop, top)
			if top == f {
				break
			}
		}
		if len(loop) > 1 {
			slices.Sort(loop)
			found = append(found, loop)
		}
	}
	for _, f := range files {
		if _, seen := index[f]; !seen {
			visit(f)
		}
	}
	return found
}
