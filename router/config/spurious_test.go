package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// diagLines renders diags as FormatDiagnostics orders them, one
// "FILE:LINE:COL: SEVERITY: SUMMARY" per diagnostic.
func diagLines(diags string) []string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(diags), "\n") {
		if line == "" {
			continue
		}
		head, _, _ := strings.Cut(line, "; ")
		out = append(out, head)
	}
	return out
}

// A file with an error gets that error, not diagnostics that only follow
// from it: no "Unused plugin" for a plugin whose type a broken component
// block names (or may have meant), no "Missing picker" before the error of
// a misspelled picker block, no "Unused policy" for a policy a broken role
// selection may have meant, none of these after a syntax error (the parser
// may have dropped the rest of the file). The real warnings and errors of the same
// kinds stay. Each case lists every diagnostic of the file, in order.
func TestNoSpuriousDiagnostics(t *testing.T) {
	const pd = "plugin \"pd\" {\n  command = \"bin/pd\"\n}\n" // lines 1-3
	tests := []struct {
		name, file, src string
		want            []string
		spurious        []string // summaries that must not appear
	}{
		{name: "misspelled parameter of a plugin type", src: pd + `policy "p" {
  filter "f" {
    type                     = "min-overlap"
    min_device_overlap_blcks = 2
  }
  picker "pick" { type = "min-cost" }
}
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:7:5: error: Unsupported argument"},
			spurious: []string{"Unused plugin"}},
		{name: "parameter of the wrong type", src: pd + `policy "p" {
  filter "f" {
    type                      = "min-overlap"
    min_device_overlap_blocks = "two"
  }
  picker "pick" { type = "min-cost" }
}
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:7:33: error: Incorrect attribute value type"},
			spurious: []string{"Unused plugin"}},
		{name: "parameter value the plugin refuses", src: pd + `policy "p" {
  filter "f" {
    type                      = "min-overlap"
    min_device_overlap_blocks = -1
  }
  picker "pick" { type = "min-cost" }
}
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:7:33: error: Invalid parameter value"},
			spurious: []string{"Unused plugin"}},
		{name: "bad weight on the plugin's only scorer", src: pd + `policy "p" {
  scorer "s" {
    type   = "prefill-cost"
    weight = -1
  }
  picker "pick" { type = "min-cost" }
}
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:7:14: error: Invalid weight"},
			spurious: []string{"Unused plugin"}},
		{name: "misspelled plugin type", src: pd + `policy "p" {
  scorer "s" { type = "prefil-cost" }
  picker "pick" { type = "min-cost" }
}
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:5:23: error: Unknown scorer type"},
			spurious: []string{"Unused plugin"}},
		{name: "component block without a type", src: pd + `policy "p" {
  scorer "s" {
    weight = 2
  }
  picker "pick" { type = "min-cost" }
}
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:5:14: error: Missing required argument"},
			spurious: []string{"Unused plugin"}},
		{name: "plugin used only as the fallback picker", src: pd + `policy "p" {
  picker "pick" { type = "min-cost" }
  fallback = "lowest-cost"
}
worker_selection { prefill = "p" }`,
			spurious: []string{"Unused plugin"}},
		{name: "unused plugin is still reported", src: pd + `policy "p" {
  picker "pick" { type = "min-cost" }
}
worker_selection { prefill = "p" }`,
			want: []string{"t.hcl:1:1: warning: Unused plugin"}},
		{name: "misspelled picker block", src: `policy "p" {
  scorer "s" { type = "kv-cost" }
  pickr "pick" {
    type = "min-cost"
  }
}
worker_selection { aggregated = "p" }`,
			want:     []string{"t.hcl:3:3: error: Unsupported block type"},
			spurious: []string{"Missing picker"}},
		{name: "misspelled picker block of a plugin policy", src: pd + `policy "p" {
  scorer "s" { type = "prefill-cost" }
  pickr "pick" { type = "lowest-cost" }
}
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:6:3: error: Unsupported block type"},
			spurious: []string{"Missing picker", "Unused plugin"}},
		{name: "picker in a broken one-line policy block", src: `policy "p" { picker "pick" { type = "min-cost" } }
worker_selection { aggregated = "p" }`,
			want:     []string{"t.hcl:1:14: error: Argument definition required"},
			spurious: []string{"Missing picker"}},
		{name: "plugin type in a broken one-line block", src: pd + `policy "p" { scorer "s" { type = "prefill-cost" } }
worker_selection { prefill = "p" }`,
			want:     []string{"t.hcl:4:14: error: Argument definition required"},
			spurious: []string{"Missing picker", "Unused plugin", "Unused policy"}},
		{name: "picker on a line with a syntax error", src: `policy "p" {
  picker "pick" { type = "min-cost" 
  }
}
worker_selection { aggregated = "p" }`,
			want:     []string{"t.hcl:2:37: error: Invalid single-argument block definition"},
			spurious: []string{"Missing picker"}},
		{name: "picker given as an attribute", src: `policy "p" {
  picker = "min-cost"
}
worker_selection { aggregated = "p" }`,
			want:     []string{"t.hcl:2:3: error: Unsupported argument"},
			spurious: []string{"Missing picker"}},
		{name: "misspelled picker in JSON syntax", file: "t.hcl.json", src: `{
  "policy": {"p": {"pickr": {"pick": {"type": "min-cost"}}}},
  "worker_selection": {"aggregated": "p"}
}`,
			want:     []string{"t.hcl.json:2:20: error: Extraneous JSON object property"},
			spurious: []string{"Missing picker"}},
		{name: "policy without a picker is still an error", src: `policy "p" {
  scorer "s" { type = "kv-cost" }
}
worker_selection { aggregated = "p" }`,
			want: []string{"t.hcl:1:1: error: Missing picker"}},
		{name: "role naming an undeclared policy", src: `policy "kv" {
  picker "pick" { type = "min-cost" }
}
worker_selection { aggregated = "kvv" }`,
			want:     []string{"t.hcl:4:33: error: Unknown policy"},
			spurious: []string{"Unused policy"}},
		{name: "misspelled role in worker_selection", src: `policy "kv" {
  picker "pick" { type = "min-cost" }
}
worker_selection { aggregted = "kv" }`,
			want:     []string{"t.hcl:4:20: error: Unsupported argument"},
			spurious: []string{"Unused policy"}},
		{name: "misspelled worker_selection block", src: `policy "kv" {
  picker "pick" { type = "min-cost" }
}
worker_selectoin { aggregated = "kv" }`,
			want:     []string{"t.hcl:4:1: error: Unsupported block type"},
			spurious: []string{"Unused policy"}},
		{name: "unused policy is still reported beside another misspelled block", src: `policy "kv" {
  picker "pick" { type = "min-cost" }
}
policy "other" {
  picker "pick" { type = "round-robin" }
}
routr { seed = 1 }
worker_selection { aggregated = "kv" }`,
			want: []string{"t.hcl:4:1: warning: Unused policy", "t.hcl:7:1: error: Unsupported block type"}},
		{name: "unused policy is still reported", src: `policy "kv" {
  picker "pick" { type = "min-cost" }
}
policy "other" {
  picker "pick" { type = "round-robin" }
}
worker_selection { aggregated = "kv" }`,
			want: []string{"t.hcl:4:1: warning: Unused policy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := tt.file
			if file == "" {
				file = "t.hcl"
			}
			_, diags := LoadWith(file, []byte(tt.src), testCatalog(t), Options{Plugins: pdHost()})
			out := FormatDiagnostics(diags)
			if diff := cmp.Diff(tt.want, diagLines(out)); diff != "" {
				t.Errorf("diagnostics (-want +got):\n%s\n%s", diff, out)
			}
			for _, s := range tt.spurious {
				if strings.Contains(out, ": "+s+";") {
					t.Errorf("spurious %q:\n%s", s, out)
				}
			}
		})
	}
}
