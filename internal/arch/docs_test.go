package arch

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docPages are the pages whose file paths and Go identifiers must exist:
// docs/*.md and the repository's top-level pages.
func docPages(t *testing.T, root string) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, top := range []string{"README.md", "BENCHMARKS.md"} {
		pages = append(pages, filepath.Join(root, top))
	}
	return pages
}

var (
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// goRef: pkg.Name, Type.Member or pkg.Type.Member, optionally a
	// pointer and a call's parentheses.
	goRef = regexp.MustCompile(`^\*?([A-Za-z_][A-Za-z0-9_]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?(?:\(.*\))?$`)
	// placeholder: an ALL_CAPS name, which in the docs is a placeholder
	// (router.NAME) or a protocol enum value (Kind.KIND_FILTER), not Go.
	placeholder = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	// pkgIdent: a repository path followed by a Go identifier
	// (internal/untrusted.Limiter).
	pkgIdent = regexp.MustCompile(`^(.*/[a-z0-9_]+)\.([A-Z][A-Za-z0-9_]*)$`)
	// pathEnd strips what may follow a path in prose or a command:
	// a line number, an anchor, trailing punctuation.
	pathEnd = regexp.MustCompile(`(:[0-9]+(-[0-9]+)?|#[A-Za-z0-9_-]*|[,.;:)\]]+)$`)
)

// repoPath reports whether a token names a file or folder of the
// repository: its first element is a top-level entry that git tracks.
func repoPath(tok string, tops map[string]bool) bool {
	if strings.Contains(tok, "://") || strings.HasPrefix(tok, "/") || strings.ContainsAny(tok, "<>{}$|") {
		return false
	}
	first, _, found := strings.Cut(tok, "/")
	return found && tops[first]
}

// pathExists reports whether a token names an existing file or folder,
// with globs (*) matching at least one.
func pathExists(root, tok string) bool {
	tok = strings.TrimSuffix(tok, "/...")
	p := filepath.Join(root, filepath.FromSlash(tok))
	if strings.Contains(tok, "*") {
		m, _ := filepath.Glob(p)
		return len(m) > 0
	}
	_, err := os.Stat(p)
	return err == nil
}

// TestDocsNameWhatExists fails when a page names a repository path that
// does not exist, a Go identifier (pkg.Name, Type.Member) that no package
// of the repository declares, or a test or benchmark (TestX, BenchmarkX/sub)
// that no test file declares. Paths count in code spans, fenced
// blocks and relative links; identifiers in code spans, when their first
// part is a package name or a type of the repository. Build outputs
// (bin/) and files a command writes are named in prose as outputs, so
// bin/ is not checked.
func TestDocsNameWhatExists(t *testing.T) {
	root := repoRoot(t)
	tops := map[string]bool{}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") && e.Name() != "bin" {
			tops[e.Name()] = true
		}
	}
	idx := indexGo(t, root)
	for _, page := range docPages(t, root) {
		relPage, _ := filepath.Rel(root, page)
		f, err := os.Open(page)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		line, fenced := 0, false
		for sc.Scan() {
			line++
			text := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(text), "```") {
				fenced = !fenced
				continue
			}
			var spans []string
			if fenced {
				spans = []string{text}
			} else {
				for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
					spans = append(spans, m[1])
				}
				for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
					target := m[1]
					if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
						continue
					}
					target, _, _ = strings.Cut(target, "#")
					if _, err := os.Stat(filepath.Join(filepath.Dir(page), filepath.FromSlash(target))); err != nil {
						t.Errorf("%s:%d: link to %s, which does not exist", relPage, line, target)
					}
				}
			}
			for _, span := range spans {
				if !fenced {
					if msg := idx.check(span); msg != "" {
						t.Errorf("%s:%d: `%s`: %s", relPage, line, span, msg)
					}
				}
				for _, tok := range strings.FieldsFunc(span, func(r rune) bool {
					return r == ' ' || r == '\t' || r == '=' || r == '"' || r == '\'' || r == '`' || r == '(' || r == '[' || r == ','
				}) {
					tok = pathEnd.ReplaceAllString(tok, "")
					if m := pkgIdent.FindStringSubmatch(tok); m != nil && repoPath(tok, tops) {
						if !pathExists(root, m[1]) {
							t.Errorf("%s:%d: %s does not exist", relPage, line, m[1])
						} else if !idx.pkgs[filepath.Base(m[1])][m[2]] {
							t.Errorf("%s:%d: %s declares no %s", relPage, line, m[1], m[2])
						}
						continue
					}
					if repoPath(tok, tops) && !pathExists(root, tok) {
						t.Errorf("%s:%d: %s does not exist", relPage, line, tok)
					}
				}
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", relPage, err)
		}
	}
}

// goIndex holds the declarations of the repository's Go code: top-level
// names by package name, and members (fields, methods) by type name.
type goIndex struct {
	pkgs    map[string]map[string]bool
	members map[string]map[string]bool
	// tests holds the names of every Test, Benchmark and Fuzz function.
	tests map[string]bool
}

// testRef: a test, benchmark or fuzz target's name, with an optional
// subtest or sub-benchmark path.
var testRef = regexp.MustCompile(`^((?:Test|Benchmark|Fuzz)[A-Z0-9][A-Za-z0-9_]*)(?:/\S*)?$`)

func (x goIndex) check(span string) string {
	if m := testRef.FindStringSubmatch(strings.TrimSpace(span)); m != nil {
		if !x.tests[m[1]] {
			return "no such test or benchmark"
		}
		return ""
	}
	m := goRef.FindStringSubmatch(strings.TrimSpace(span))
	if m == nil {
		return ""
	}
	a, b, c := m[1], m[2], m[3]
	if placeholder.MatchString(b) || placeholder.MatchString(c) && c != "" {
		return ""
	}
	if names, ok := x.pkgs[a]; ok {
		if !names[b] {
			return fmt.Sprintf("package %s declares no %s", a, b)
		}
		if c != "" {
			if mem, ok := x.members[b]; ok && !mem[c] {
				return fmt.Sprintf("%s.%s has no member %s", a, b, c)
			}
		}
		return ""
	}
	if mem, ok := x.members[a]; ok && c == "" && !mem[b] {
		return fmt.Sprintf("type %s has no member %s", a, b)
	}
	return ""
}

func indexGo(t *testing.T, root string) goIndex {
	t.Helper()
	x := goIndex{pkgs: map[string]map[string]bool{}, members: map[string]map[string]bool{}, tests: map[string]bool{}}
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		if pkg == "main" {
			// A command declares no API the docs may name, but its tests count.
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasSuffix(path, "_test.go") {
					x.tests[fd.Name.Name] = true
				}
			}
			return nil
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil || len(d.Recv.List) == 0 {
					if strings.HasSuffix(path, "_test.go") {
						x.tests[d.Name.Name] = true
					}
					add(x.pkgs, pkg, d.Name.Name)
					continue
				}
				add(x.members, typeName(d.Recv.List[0].Type), d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(x.pkgs, pkg, n.Name)
						}
					case *ast.TypeSpec:
						add(x.pkgs, pkg, s.Name.Name)
						if x.members[s.Name.Name] == nil {
							x.members[s.Name.Name] = map[string]bool{}
						}
						addMembers(x.members[s.Name.Name], s.Type)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func addMembers(set map[string]bool, e ast.Expr) {
	switch t := e.(type) {
	case *ast.StructType:
		for _, f := range t.Fields.List {
			for _, n := range f.Names {
				set[n.Name] = true
			}
			if len(f.Names) == 0 {
				set[typeName(f.Type)] = true
			}
		}
	case *ast.InterfaceType:
		for _, f := range t.Methods.List {
			for _, n := range f.Names {
				set[n.Name] = true
			}
		}
	}
}

func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.Ident:
		return t.Name
	}
	return ""
}

// repoRoot is the repository's top folder: two up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", wd, err)
	}
	return root
}
