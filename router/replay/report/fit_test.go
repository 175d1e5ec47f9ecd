package report

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// readmeCells reads the --report JSON of one of the README's replay
// commands (testdata, written by bin/router replay ... --report) into
// the table's cells: consecutive runs of one policy on one fleet make a
// cell, one run per seed.
//
//	readme-default.json  bin/router replay
//	readme-sweep.json    bin/router replay --compare examples/policies/round-robin.hcl,examples/policies/kv-affinity.hcl \
//	                       --workers 4,8,16 --seeds 3 --baseline round-robin --slo ttft=2s,tpot=100ms --goodput-target 90
func readmeCells(t *testing.T, file string) []Cell {
	t.Helper()
	b, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var reps []*Report
	if b[0] == '{' {
		reps = []*Report{{}}
		err = json.Unmarshal(b, reps[0])
	} else {
		err = json.Unmarshal(b, &reps)
	}
	if err != nil {
		t.Fatal(err)
	}
	var cells []Cell
	for _, r := range reps {
		if n := len(cells); n > 0 && cells[n-1].Runs[0].Policy == r.Policy && cells[n-1].Runs[0].Workers == r.Workers {
			cells[n-1].Runs = append(cells[n-1].Runs, r)
			continue
		}
		cells = append(cells, Cell{Runs: []*Report{r}})
	}
	return cells
}

// headers is the header line's column names: the header split where
// two spaces or more part its names (a name such as "TTFT p90" has one).
func headers(line string) []string {
	var out []string
	for _, f := range strings.Split(line, "  ") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// With the README's inputs, the default columns fit 100 terminal
// columns, every line of the table and its legend included; at 200 the
// table shows more columns; without a width, every default column.
// Every column shown is explained in the legend ("NAME =", or its first
// word's: "TTFT =" for TTFT p90), and so are the columns folded into
// the "every row:" line and those left out are named.
func TestTableFitsTheWidth(t *testing.T) {
	goodput, _ := MetricByName("goodput")
	for _, tt := range []struct {
		file string
		cmp  Comparison
	}{
		{"readme-default.json", Comparison{}},
		{"readme-sweep.json", Comparison{Baseline: "round-robin", BaselineMetric: goodput, GoodputTarget: 90}},
	} {
		cells := readmeCells(t, tt.file)
		if len(cells) == 0 || len(cells[len(cells)-1].Runs) != len(cells[0].Runs) {
			t.Fatalf("%s: %d cells, want whole cells", tt.file, len(cells))
		}
		shown := map[int][]string{}
		for _, width := range []int{0, 100, 200} {
			cmp := tt.cmp
			cmp.Width = width
			var buf bytes.Buffer
			if err := WriteComparison(&buf, cells, cmp); err != nil {
				t.Fatal(err)
			}
			out := strings.TrimSuffix(buf.String(), "\n")
			lines := strings.Split(out, "\n")
			for i, l := range lines {
				if n := utf8.RuneCountInString(l); width > 0 && n > width {
					t.Errorf("%s at width %d: line %d is %d wide:\n%s", tt.file, width, i, n, l)
				}
			}
			head := headers(lines[0])
			shown[width] = head
			legend := "\n" + strings.Join(lines[1+len(cells):], "\n")
			for _, h := range head {
				first, _, _ := strings.Cut(h, " ")
				if !strings.Contains(legend, "\n"+h+" =") && !strings.Contains(legend, "\n"+first+" =") {
					t.Errorf("%s at width %d: column %q is not in the legend:\n%s", tt.file, width, h, out)
				}
			}
			if width == 0 && strings.Contains(out, "left out to fit") {
				t.Errorf("%s without a width: columns left out:\n%s", tt.file, out)
			}
			if width == 100 {
				t.Logf("%s at 100 columns:\n%s", tt.file, out)
			}
		}
		if len(shown[200]) <= len(shown[100]) || len(shown[0]) < len(shown[200]) {
			t.Errorf("%s: %d columns at width 100, %d at 200, %d without a width; want more on wider terminals",
				tt.file, len(shown[100]), len(shown[200]), len(shown[0]))
		}
		for _, h := range shown[100] {
			if !slices.Contains(shown[0], h) {
				t.Errorf("%s: column %q at width 100 is not a default column %q", tt.file, h, shown[0])
			}
		}
		if !slices.Contains(shown[100], "TTFT p90") {
			t.Errorf("%s: at width 100 the table lost TTFT p90, the most important column: %q", tt.file, shown[100])
		}
	}
}

// A table of the default columns that fits is written whole; one that
// does not moves the count columns equal on every row to one line, then
// leaves out columns last in FitOrder first, naming them; a column
// given in Columns is never left out.
func TestFitFoldsThenDrops(t *testing.T) {
	cells := readmeCells(t, "readme-sweep.json")
	cmp := Comparison{Width: 100}
	var buf bytes.Buffer
	if err := WriteComparison(&buf, cells, cmp); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"\nevery row: requests 12031, completed 12031, rejected 0, fallbacks 0\n",
		"\nleft out to fit 100 columns: TTFT p50, TTFT p99,"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if got := headers(strings.SplitN(out, "\n", 2)[0]); !slices.Equal(got[:3], []string{"policy", "workers", "TTFT p90"}) {
		t.Errorf("header %q, want policy, workers, TTFT p90 first", got)
	}
	cols, _ := ParseColumns("default")
	buf.Reset()
	if err := WriteComparison(&buf, cells, Comparison{Width: 100, Columns: cols}); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); strings.Contains(out, "left out") || strings.Contains(out, "every row:") ||
		len(headers(strings.SplitN(out, "\n", 2)[0])) != 2+len(TableColumns(cells, Comparison{})) {
		t.Errorf("columns given: want every one shown:\n%s", out)
	}
}

func TestWrap(t *testing.T) {
	for _, tt := range []struct {
		in    string
		width int
		want  string
	}{
		{"a bb ccc", 0, "a bb ccc"},
		{"a bb ccc", 8, "a bb ccc"},
		{"a bb ccc dd", 8, "a bb ccc\n  dd"},
		{"aaaaaaaaaa b", 4, "aaaaaaaaaa\n  b"},
		{"Δ é ü", 3, "Δ é\n  ü"},
	} {
		if got := Wrap(tt.in, tt.width); got != tt.want {
			t.Errorf("Wrap(%q, %d) = %q, want %q", tt.in, tt.width, got, tt.want)
		}
	}
}
