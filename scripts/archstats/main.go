// Command archstats prints the measures the architecture is tracked by
// (docs/architecture.md): lines of non-test Go code per package, the
// longest functions, and the module packages the selection core imports.
//
// Usage, from the repository root:
//
//	go run ./scripts/archstats [-top N] [-core IMPORTPATH]
//
// Lines are physical lines of the package's non-test .go files, as wc -l
// counts them (generated files included). A function's
// length is from its func keyword to its closing brace. It reads the
// packages `go list ./...` names in the router module and in the plugin
// SDK's module (shared/); it runs nothing of them.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Module     *struct{ Path string }
}

type fn struct {
	name  string
	pos   string
	lines int
}

func main() {
	top := flag.Int("top", 15, "how many of the longest functions to print")
	core := flag.String("core", "github.com/switchyard-router/switchyard/router", "the package whose module imports are listed")
	flag.Parse()
	if err := run(os.Stdout, *top, *core); err != nil {
		fmt.Fprintln(os.Stderr, "archstats:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, top int, core string) error {
	var pkgs []pkg
	for _, dir := range []string{".", "shared"} {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
			continue
		}
		cmd := exec.Command("go", "list", "-json", "./...")
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("go list in %s: %w", dir, err)
		}
		dec := json.NewDecoder(bytes.NewReader(out))
		for dec.More() {
			var p pkg
			if err := dec.Decode(&p); err != nil {
				return fmt.Errorf("decoding go list: %w", err)
			}
			pkgs = append(pkgs, p)
		}
	}
	if len(pkgs) == 0 {
		return fmt.Errorf("go list named no packages")
	}
	modPath := ""
	if pkgs[0].Module != nil {
		modPath = pkgs[0].Module.Path
	}
	rel := func(ip string) string {
		if ip == modPath {
			return "."
		}
		return strings.TrimPrefix(ip, modPath+"/")
	}
	cwd, _ := os.Getwd()
	type row struct {
		name  string
		lines int
	}
	var rows []row
	var fns []fn
	total := 0
	fset := token.NewFileSet()
	for _, p := range pkgs {
		n := 0
		for _, f := range p.GoFiles {
			path := filepath.Join(p.Dir, f)
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			n += bytes.Count(src, []byte("\n"))
			af, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if ast.IsGenerated(af) {
				continue
			}
			relPath, _ := filepath.Rel(cwd, path)
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				name := fd.Name.Name
				if fd.Recv != nil && len(fd.Recv.List) == 1 {
					name = recvName(fd.Recv.List[0].Type) + "." + name
				}
				start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
				fns = append(fns, fn{name: name, pos: fmt.Sprintf("%s:%d", relPath, start.Line), lines: end.Line - start.Line + 1})
			}
		}
		total += n
		rows = append(rows, row{rel(p.ImportPath), n})
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].lines != rows[j].lines {
			return rows[i].lines > rows[j].lines
		}
		return rows[i].name < rows[j].name
	})
	fmt.Fprintf(w, "Lines of non-test Go code per package (%d packages, %d lines)\n", len(rows), total)
	for _, r := range rows {
		fmt.Fprintf(w, "%7d  %s\n", r.lines, r.name)
	}
	sort.Slice(fns, func(i, j int) bool {
		if fns[i].lines != fns[j].lines {
			return fns[i].lines > fns[j].lines
		}
		return fns[i].pos < fns[j].pos
	})
	fmt.Fprintf(w, "\nLongest functions (of %d, generated code left out)\n", len(fns))
	for _, f := range fns[:min(top, len(fns))] {
		fmt.Fprintf(w, "%5d  %s  %s\n", f.lines, f.name, f.pos)
	}
	for _, p := range pkgs {
		if p.ImportPath != core {
			continue
		}
		fmt.Fprintf(w, "\nModule packages %s imports\n", rel(core))
		for _, ip := range p.Imports {
			if strings.HasPrefix(ip, modPath+"/") {
				fmt.Fprintf(w, "  %s\n", rel(ip))
			}
		}
	}
	return nil
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}
