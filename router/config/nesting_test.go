package config

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// nestShape is a file shape whose depth the test controls: gen(d) is a
// file nested exactly d deep, and at d = MaxNesting+1 the first token past
// the limit is the nth occurrence of tok in it.
type nestShape struct {
	name, file string
	gen        func(d int) string
	tok        string
	nth        int
}

var rep = strings.Repeat

// nestShapes are the shapes of every kind of level: brackets, templates,
// directives, and each operator HCL's parser or evaluator recurses on.
func nestShapes() []nestShape {
	const L = MaxNesting
	// templates: `"${` is two levels; an odd depth adds a parenthesis first.
	twoLevels := func(open, mid, close string) func(int) string {
		return func(d int) string {
			p := rep("(", d%2)
			return "a = " + p + rep(open, d/2) + mid + rep(close, d/2) + rep(")", d%2) + "\n"
		}
	}
	var ops []nestShape
	for _, op := range []string{"+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||"} {
		ops = append(ops, nestShape{"operator " + op, "p.hcl", func(d int) string { return "a = x" + rep(" "+op+" x", d) + "\n" }, op + " x", L + 1})
	}
	return append(ops, []nestShape{
		{"brackets", "p.hcl", func(d int) string { return "a = " + rep("[", d) + rep("]", d) + "\n" }, "[", L + 1},
		{"parentheses", "p.hcl", func(d int) string { return "a = " + rep("(", d) + "1" + rep(")", d) + "\n" }, "(", L + 1},
		{"objects", "p.hcl", func(d int) string { return "a = " + rep("{b = ", d) + "1" + rep("}", d) + "\n" }, "{", L + 1},
		{"blocks", "p.hcl", func(d int) string { return rep("b {\n", d) + rep("}\n", d) }, "{", L + 1},
		{"function calls", "p.hcl", func(d int) string { return "a = " + rep("max(", d) + "1" + rep(")", d) + "\n" }, "(", L + 1},
		{"unary minus", "p.hcl", func(d int) string { return "a = " + rep("- ", d) + "1\n" }, "-", L + 1},
		{"not", "p.hcl", func(d int) string { return "a = " + rep("!", d) + "true\n" }, "!", L + 1},
		{"conditionals, false branch", "p.hcl", func(d int) string { return "a = " + rep("true ? 1 : ", d) + "1\n" }, "?", L + 1},
		{"conditionals, true branch", "p.hcl", func(d int) string { return "a = " + rep("true ? ", d) + "1" + rep(" : 1", d) + "\n" }, "?", L + 1},
		// 1 paren, then `"` at levels 2, 4, ... and `${` at 3, 5, ...
		{"string templates", "p.hcl", twoLevels(`"${`, "1", `}"`), "${", L / 2},
		{"heredocs", "p.hcl", twoLevels("<<E\n${", "1", "}\nE\n"), "${", L / 2},
		// the string, d-2 directives, and a %{ sequence inside them.
		{"template if directives", "p.hcl", func(d int) string {
			return `a = "` + rep("%{ if true }", d-2) + "x" + rep("%{ endif }", d-2) + "\"\n"
		}, "%{ endif", 1},
		// the string, d-3 directives, a %{ sequence, its [.
		{"template for directives", "p.hcl", func(d int) string {
			return `a = "` + rep("%{ for x in [1] }", d-3) + "x" + rep("%{ endfor }", d-3) + "\"\n"
		}, "[", L - 2},
		// each index nests the ones before; the last adds [ and (.
		{"index chains", "p.hcl", func(d int) string { return "a = x" + rep("[(0)]", d-2) + "\n" }, "[", L - 1},
		{"splat chains", "p.hcl", func(d int) string { return "a = x" + rep("[*]", d-2) + "\n" }, "[", L - 1},
		// an object for expression reads across newlines, as HCL does.
		{"for expression over lines", "p.hcl", func(d int) string {
			return "a = {for k, v in x : k => 1" + rep(" +\n1", d-1) + "}\n"
		}, "+", L},
		{"JSON arrays", "p.json", func(d int) string { return `{"a": ` + rep("[", d-1) + rep("]", d-1) + "}" }, "[", L},
		// {, {, the string, its ${, then parentheses.
		{"JSON string templates", "p.json", func(d int) string {
			return `{"router": {"block_size": "${` + rep("(", d-4) + "1" + rep(")", d-4) + `}"}}`
		}, "(", L - 3},
	}...)
}

// posOf is the position of the nth (from 1) occurrence of tok in src, an
// ASCII text.
func posOf(t *testing.T, src, tok string, nth int) hcl.Pos {
	t.Helper()
	off := -1
	for range nth {
		i := strings.Index(src[off+1:], tok)
		if i < 0 {
			t.Fatalf("fewer than %d %q in the file", nth, tok)
		}
		off += 1 + i
	}
	line := 1 + strings.Count(src[:off], "\n")
	return hcl.Pos{Line: line, Column: off - strings.LastIndexByte(src[:off], '\n'), Byte: off}
}

// TestCheckNestingLimit: at MaxNesting-1 and MaxNesting levels each shape
// is accepted, and measured exactly that deep; at MaxNesting+1 it is refused
// with one error at the file:line:col of the first token past the limit.
func TestCheckNestingLimit(t *testing.T) {
	for _, s := range nestShapes() {
		t.Run(s.name, func(t *testing.T) {
			for _, d := range []int{MaxNesting - 1, MaxNesting} {
				src := s.gen(d)
				n := scanNesting(s.file, []byte(src))
				if n.err != nil || n.deepest != d {
					t.Errorf("%d deep: measured %d, error %v; want %d and no error", d, n.deepest, n.err, d)
				}
				if diags := CheckNesting(s.file, []byte(src)); diags != nil {
					t.Errorf("%d deep: %s", d, FormatDiagnostics(diags))
				}
				// HCL parses and evaluates it (with errors of other kinds).
				if _, diags := Load(s.file, []byte(src), nil); strings.Contains(FormatDiagnostics(diags), "Nesting") {
					t.Errorf("%d deep, Load: %s", d, FormatDiagnostics(diags))
				}
			}
			src := s.gen(MaxNesting + 1)
			diags := CheckNesting(s.file, []byte(src))
			want := posOf(t, src, s.tok, s.nth)
			if len(diags) != 1 || diags[0].Subject == nil {
				t.Fatalf("%d deep: diagnostics %v, want one error", MaxNesting+1, diags)
			}
			d := diags[0]
			if d.Severity != hcl.DiagError || d.Summary != "Nesting too deep" || d.Subject.Start != want || d.Subject.Filename != s.file {
				t.Errorf("%d deep: %s\nwant an error \"Nesting too deep\" at %s:%d:%d (byte %d), %q #%d",
					MaxNesting+1, FormatDiagnostics(diags), s.file, want.Line, want.Column, want.Byte, s.tok, s.nth)
			}
			if got := FormatDiagnostics(diags); !strings.HasPrefix(got, fmt.Sprintf("%s:%d:%d: error: Nesting too deep; The file nests deeper than 256 levels here", s.file, want.Line, want.Column)) {
				t.Errorf("formatted: %s", got)
			}
		})
	}
}

// TestCheckNestingSkipsTextAndCounts: brackets inside strings, comments,
// heredoc bodies and escaped template sequences are not levels, and a comma
// or a newline that ends an item ends the operators' count; but an
// unterminated /* is no comment (HCL reads what follows), and a newline in
// a for expression or a bracket does not end an item.
func TestCheckNestingSkipsTextAndCounts(t *testing.T) {
	const many = 5 * MaxNesting
	for _, tt := range []struct {
		name, file, src string
		deepest         int // the depth measured; -1: refused
	}{
		{"quoted string", "p.hcl", `a = "` + rep(`([{\"`, many) + "\"\n", 1},
		{"escaped template sequences", "p.hcl", `a = "` + rep("$${ %%{ (", many) + "\"\n", 1},
		{"hash comment", "p.hcl", "# " + rep("([{", many) + "\na = 1\n", 0},
		{"slash comment", "p.hcl", "a = 1 // " + rep("([{", many) + "\n", 0},
		{"block comment", "p.hcl", "a = /* " + rep("([{\n", many) + " */ 1\n", 0},
		{"heredoc body", "p.hcl", "a = <<EOT\n" + rep("([{ }\n", many) + "EOT\n", 1},
		{"indented heredoc body", "p.hcl", "a = <<-EOT\n" + rep("  ([{ %%{ $${\n", many) + "  EOT\n", 1},
		{"unterminated block comment", "p.hcl", "a = /* " + rep("(", many), -1},
		{"unterminated string", "p.hcl", `a = "` + rep("(", many), 1},
		{"tuple items", "p.hcl", "a = [" + rep("1 + 1 * 2, ", many) + "]\n", 3},
		{"block items", "p.hcl", "b {\n" + rep("  a = 1 + 1 * 2 # c\n", many) + "}\n", 3},
		{"object items", "p.hcl", "a = {\n" + rep("  b = -1 + 1\n", many) + "}\n", 3},
		{"object items, comma", "p.hcl", "a = {" + rep("b = !x || y, ", many) + "}\n", 3},
		// the string, a directive, the %{ endif } sequence inside it.
		{"template parts", "p.hcl", `a = "` + rep("${x}%{ if y }z%{ endif }", many) + "\"\n", 3},
		{"chain over lines in brackets", "p.hcl", "a = (1" + rep(" +\n1", many) + ")\n", -1},
		{"chain over commented lines in brackets", "p.hcl", "a = (1" + rep(" + # c\n1", many) + ")\n", -1},
		{"JSON strings", "p.json", `{"a": "` + rep(`[{\"`, many) + `"}`, 1},
		{"JSON string escapes", "p.json", `{"a": "\\", "b": ` + rep("[", many) + `1}`, -1},
		{"JSON escaped template", "p.json", `{"a": "` + rep(`\u0024{`, many) + `"}`, -1},
		{"JSON array items", "p.json", `{"a": [` + rep("[1], ", many) + `[1]]}`, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := scanNesting(tt.file, []byte(tt.src))
			switch {
			case tt.deepest < 0 && n.err == nil:
				t.Errorf("not refused (measured %d)", n.deepest)
			case tt.deepest >= 0 && (n.err != nil || n.deepest != tt.deepest):
				t.Errorf("measured %d, error %v; want %d and no error", n.deepest, n.err, tt.deepest)
			}
		})
	}
}

// TestCheckNestingBoundsTheTree: for random expressions of every kind of
// level mixed, the tree HCL parses is never deeper than 2 nodes per level
// measured (plus the body, its attributes, the attribute and the
// expression at the top), so the
// measure bounds the parser's and the evaluator's recursion. A measure
// that missed a kind of level (an operator not counted, a newline taken
// to end an item where HCL reads on) fails this.
func TestCheckNestingBoundsTheTree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 1500 {
		// Two kinds or so mixed, so that one kind's levels are not hidden
		// among many others; and every kind mixed.
		kinds := []int{rng.IntN(20), rng.IntN(20)}
		if i%4 == 0 {
			kinds = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}
		}
		budget := 60
		src := "a = " + randomExpr(rng, &budget, kinds) + "\n"
		n := scanNesting("p.hcl", []byte(src))
		f, diags := hclsyntax.ParseConfig([]byte(src), "p.hcl", hcl.InitialPos)
		if diags.HasErrors() {
			t.Fatalf("case %d does not parse: %s\n%s", i, FormatDiagnostics(diags), src)
		}
		if n.err != nil {
			continue
		}
		if d := treeDepth(f.Body.(*hclsyntax.Body)); d > 2*n.deepest+4 {
			t.Fatalf("case %d: a tree %d deep measured %d levels:\n%s", i, d, n.deepest, src)
		}
	}
}

// randomExpr is a random HCL expression of at most about *budget nodes,
// of the kinds (cases of its switch, 0 to 19) given, with runs of each
// operator (a chain of ?: or of [i], say).
func randomExpr(rng *rand.Rand, budget *int, kinds []int) string {
	*budget--
	if *budget <= 0 || rng.IntN(10) == 0 {
		return []string{"1", "x", "true", `"s"`}[rng.IntN(4)]
	}
	e := func() string { return randomExpr(rng, budget, kinds) }
	run := func(f func() string) string {
		var b strings.Builder
		for range 1 + rng.IntN(8) {
			b.WriteString(f())
		}
		return b.String()
	}
	chain := func(sep string) string {
		parts := make([]string, 1+rng.IntN(8))
		for i := range parts {
			parts[i] = e()
		}
		return strings.Join(parts, sep)
	}
	op := func() string {
		return []string{" + ", " - ", " * ", " / ", " % ", " == ", " != ", " < ", " <= ", " > ", " >= ", " && ", " || "}[rng.IntN(13)]
	}
	switch kinds[rng.IntN(len(kinds))] {
	case 0:
		return "(" + e() + ")"
	case 1:
		return "[" + chain(", ") + "]"
	case 2:
		return "{b = " + e() + "\nc = " + e() + "}"
	case 3:
		return "{for k, v in " + e() + " : k => " + chain(op()+"\n") + "}"
	case 4:
		return "[for v in " + e() + " : " + e() + " if " + e() + "]"
	case 5:
		return run(func() string { return "-" }) + e()
	case 6:
		return run(func() string { return "!" }) + e()
	case 7:
		return chain(op())
	case 8:
		return "(" + chain(op()+"\n") + ")"
	case 9:
		return run(func() string { return e() + " ? " + e() + " : " }) + e()
	case 10:
		return `"a${` + e() + `}b"`
	case 11:
		return `"%{ if ` + e() + ` }${` + e() + `}%{ else }x%{ endif }"`
	case 12:
		return `"%{ for v in ` + e() + ` }${v}%{ endfor }"`
	case 13:
		return "(<<E\n${" + e() + "}\nE\n)"
	case 14:
		return "(" + e() + ")" + run(func() string { return "[" + e() + "]" })
	case 15:
		return "(" + e() + ")" + run(func() string { return "[*].a" })
	case 16:
		return "(" + e() + ").*.b"
	case 17:
		return "max(" + chain(", ") + ")"
	case 18:
		return "(" + e() + ")" + run(func() string { return ".a[" + e() + "]" })
	default: // c ? c ? c ? x : y : y : y
		k := 1 + rng.IntN(8)
		var b strings.Builder
		for range k {
			b.WriteString(e() + " ? ")
		}
		b.WriteString(e())
		for range k {
			b.WriteString(" : " + e())
		}
		return b.String()
	}
}

// treeDepth is the depth of the syntax tree under body, in nodes.
func treeDepth(body *hclsyntax.Body) int {
	w := &depthWalker{}
	hclsyntax.Walk(body, w)
	return w.deepest
}

type depthWalker struct{ depth, deepest int }

func (w *depthWalker) Enter(hclsyntax.Node) hcl.Diagnostics {
	w.depth++
	w.deepest = max(w.deepest, w.depth)
	return nil
}

func (w *depthWalker) Exit(hclsyntax.Node) hcl.Diagnostics {
	w.depth--
	return nil
}

// TestRealFilesNestShallowly: the example policies (the peer baselines of
// examples/policies/peers/ among them) and the test policies are far from
// the limit (docs/policy-file.md says how far).
func TestRealFilesNestShallowly(t *testing.T) {
	files, err := filepath.Glob("../../examples/policies/*.hcl")
	if err != nil {
		t.Fatal(err)
	}
	peers, _ := filepath.Glob("../../examples/policies/peers/*.hcl")
	if len(peers) < 4 {
		t.Fatalf("only %d peer policies: %v", len(peers), peers)
	}
	more, _ := filepath.Glob("testdata/*.hcl*")
	files = append(append(files, peers...), more...)
	if len(files) < 10 {
		t.Fatalf("only %d files", len(files))
	}
	deepest := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := scanNesting(f, src)
		if n.err != nil {
			t.Errorf("%s: %v", f, n.err)
		}
		deepest = max(deepest, n.deepest)
	}
	if deepest > 5 {
		t.Errorf("the deepest file nests %d deep; docs/policy-file.md says 5 at most", deepest)
	}
}

// deepFile is a 200 KB file nested 100,000 deep, of the kind that crashed
// the router before the limit: a workers file or a policy file.
func deepFile(t testing.TB, dir, name string) string {
	t.Helper()
	src := "worker \"a\" {\n  url = " + rep("[", 100_000) + rep("]", 100_000) + "\n}\n"
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoadersRefuseDeepFiles: every entry point that parses a policy or
// workers file refuses one nested 100,000 deep with the nesting error at
// its file:line:col (before the limit, each ended the process with a
// stack overflow).
func TestLoadersRefuseDeepFiles(t *testing.T) {
	dir := t.TempDir()
	path := deepFile(t, dir, "deep.hcl")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	jsonPath := filepath.Join(dir, "deep.json")
	if err := os.WriteFile(jsonPath, []byte(`{"worker": {"a": {"url": `+rep("[", 100_000)+rep("]", 100_000)+"}}}"), 0o644); err != nil {
		t.Fatal(err)
	}
	// worker { is level 1, the 256th [ level 257.
	want := path + ":2:264: error: Nesting too deep; "
	for _, tt := range []struct {
		name  string
		load  func() hcl.Diagnostics
		wantF string
	}{
		{"LoadFile", func() hcl.Diagnostics { _, d := LoadFile(path, nil); return d }, want},
		{"LoadWith", func() hcl.Diagnostics { _, d := LoadWith(path, src, nil, Options{}); return d }, want},
		{"LoadPluginBlocks", func() hcl.Diagnostics { _, d := LoadPluginBlocks(path); return d }, want},
		{"LoadWorkers", func() hcl.Diagnostics { _, d := LoadWorkers(path); return d }, want},
		{"ParseWorkers", func() hcl.Diagnostics { _, d := ParseWorkers(path, src); return d }, want},
		// {, {, { are levels 1 to 3, the 254th [ level 257.
		{"LoadWorkers JSON", func() hcl.Diagnostics { _, d := LoadWorkers(jsonPath); return d }, jsonPath + ":1:279: error: Nesting too deep; "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := FormatDiagnostics(tt.load()); !strings.HasPrefix(got, tt.wantF) || strings.Count(got, "\n") != 1 {
				t.Errorf("got %s\nwant one line starting %s", got, tt.wantF)
			}
		})
	}
}

// TestLoadAtLimitStack loads a file of each shape nested MaxNesting deep in
// a child process whose goroutine stacks may not grow past 4 MiB
// (debug.SetMaxStack; past it the child dies of a stack overflow): the
// stack docs/policy-file.md says a file at the limit costs at most.
func TestLoadAtLimitStack(t *testing.T) {
	if os.Getenv("SWITCHYARD_NESTING_STACK_CHILD") == "1" {
		debug.SetMaxStack(4 << 20)
		shapes := nestShapes()
		for _, s := range shapes {
			_, _ = Load(s.file, []byte(s.gen(MaxNesting)), nil)
		}
		fmt.Printf("loaded %d files\n", len(shapes))
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoadAtLimitStack$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SWITCHYARD_NESTING_STACK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if want := fmt.Sprintf("loaded %d files\n", len(nestShapes())); err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("the child loading the files with a 4 MiB stack: %v, output (want %q):\n%.3000s", err, want, out)
	}
}

// BenchmarkLoadAtLimit loads a file of each shape nested MaxNesting deep:
// what a file just under the limit costs (docs/policy-file.md gives the
// figures).
//
//	go test -run '^$' -bench LoadAtLimit -benchmem ./router/config/
func BenchmarkLoadAtLimit(b *testing.B) {
	for _, s := range nestShapes() {
		src := []byte(s.gen(MaxNesting))
		b.Run(strings.ReplaceAll(s.name, " ", "_"), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Load(s.file, src, nil)
			}
		})
	}
}

// BenchmarkRefuseDeepFile checks a 200 KB file nested 100,000 deep: what
// refusing the file of the issue costs.
func BenchmarkRefuseDeepFile(b *testing.B) {
	src, err := os.ReadFile(deepFile(b, b.TempDir(), "deep.hcl"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if CheckNesting("deep.hcl", src) == nil {
			b.Fatal("not refused")
		}
	}
}
