package archcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Package is what the checks need of one package: its import path, its
// directory, its non-test Go files and what it imports.
type Package struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
}

// Packages lists the packages matching patterns (go list -json), run in dir.
func Packages(dir string, patterns ...string) ([]Package, error) {
	cmd := exec.Command("go", append([]string{"list", "-json"}, patterns...)...)
	cmd.Dir = dir
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("archcheck: go list: %w: %s", err, stderr.String())
	}
	var pkgs []Package
	dec := json.NewDecoder(&out)
	for {
		var p Package
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return pkgs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("archcheck: read go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// Arrow is one import: From imports To.
type Arrow struct{ From, To string }

func (a Arrow) String() string { return a.From + " -> " + a.To }

// under reports whether path is root or below it.
func under(path, root string) bool { return path == root || strings.HasPrefix(path, root+"/") }

// BackImports lists the imports of the packages under root that run back
// up: a package importing one of its ancestors (sandbox/box importing
// sandbox).
func BackImports(pkgs []Package, root string) []Arrow {
	var back []Arrow
	for _, p := range pkgs {
		if !under(p.ImportPath, root) {
			continue
		}
		for _, imp := range p.Imports {
			if imp != p.ImportPath && under(p.ImportPath, imp) {
				back = append(back, Arrow{p.ImportPath, imp})
			}
		}
	}
	return back
}

// Forbidden lists the imports from packages under from into packages
// under to.
func Forbidden(pkgs []Package, from, to string) []Arrow {
	var bad []Arrow
	for _, p := range pkgs {
		if !under(p.ImportPath, from) {
			continue
		}
		for _, imp := range p.Imports {
			if under(imp, to) {
				bad = append(bad, Arrow{p.ImportPath, imp})
			}
		}
	}
	return bad
}

// Source is one Go file to read: its name and, for a fixture, its text
// (nil: read the file).
type Source struct {
	Name string
	Text []byte
}

// Sources are the non-test Go files of pkgs.
func Sources(pkgs []Package) map[string][]Source {
	bySrc := map[string][]Source{}
	for _, p := range pkgs {
		for _, f := range p.GoFiles {
			bySrc[p.ImportPath] = append(bySrc[p.ImportPath], Source{Name: filepath.Join(p.Dir, f)})
		}
	}
	return bySrc
}

// Count is a named figure: a type's methods or a function's lines.
type Count struct {
	Name string
	N    int
}

// Methods counts the methods declared on each type of each package
// (named "pkg.Type"), most first.
func Methods(srcs map[string][]Source) ([]Count, error) {
	n := map[string]int{}
	err := each(srcs, func(pkg string, _ *token.FileSet, d *ast.FuncDecl) {
		if d.Recv == nil || len(d.Recv.List) == 0 {
			return
		}
		n[pkg+"."+recvName(d.Recv.List[0].Type)]++
	})
	return sorted(n), err
}

// LongFuncs lists the functions (named "file:Func" or "file:Type.Method")
// whose declaration spans more than max lines, longest first.
func LongFuncs(srcs map[string][]Source, max int) ([]Count, error) {
	n := map[string]int{}
	err := each(srcs, func(_ string, fset *token.FileSet, d *ast.FuncDecl) {
		lines := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
		if lines <= max {
			return
		}
		name := d.Name.Name
		if d.Recv != nil && len(d.Recv.List) > 0 {
			name = recvName(d.Recv.List[0].Type) + "." + name
		}
		n[fset.Position(d.Pos()).Filename+":"+name] = lines
	})
	return sorted(n), err
}

// each parses every source and calls f with each function declaration.
func each(srcs map[string][]Source, f func(pkg string, fset *token.FileSet, d *ast.FuncDecl)) error {
	fset := token.NewFileSet()
	for pkg, files := range srcs {
		for _, s := range files {
			var text any
			if s.Text != nil {
				text = s.Text
			}
			file, err := parser.ParseFile(fset, s.Name, text, parser.SkipObjectResolution)
			if err != nil {
				return fmt.Errorf("archcheck: %w", err)
			}
			for _, decl := range file.Decls {
				if d, ok := decl.(*ast.FuncDecl); ok {
					f(pkg, fset, d)
				}
			}
		}
	}
	return nil
}

// recvName is a receiver's type name, without a pointer or type parameters.
func recvName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return fmt.Sprintf("%T", e)
		}
	}
}

func sorted(n map[string]int) []Count {
	out := make([]Count, 0, len(n))
	for name, c := range n {
		out = append(out, Count{name, c})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		return out[i].Name < out[j].Name
	})
	return out
}
