package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"
)

const sumA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// sha256_files decodes to Plugin.SHA256Files (lowercase, keyed as
// written); each bad key or value is an error at its own file:line:col.
func TestSHA256Files(t *testing.T) {
	h := &fakeHost{}
	f, diags := loadWithHost(t, h, `plugin "p" {
  command      = "bin/p"
  args         = ["plugin.py"]
  sha256_files = { "plugin.py" = "`+strings.ToUpper(sumA)+`", "lib/util.py" = "`+sumA+`" }
}
`)
	if diags.HasErrors() {
		t.Fatal(FormatDiagnostics(diags))
	}
	want := map[string]string{"plugin.py": sumA, "lib/util.py": sumA}
	if diff := cmp.Diff(want, f.Plugins[0].SHA256Files); diff != "" {
		t.Errorf("SHA256Files (-want +got):\n%s", diff)
	}
	if len(h.started) != 1 || h.started[0].SHA256Files["lib/util.py"] != sumA {
		t.Errorf("the host started %+v, want plugin p with its sha256_files", h.started)
	}

	_, diags = loadWithHost(t, &fakeHost{}, `plugin "p" {
  command      = "bin/p"
  sha256_files = {
    "plugin.py"   = "abc"
    ""            = "`+sumA+`"
    "./plugin.py" = "`+sumA+`"
    "x.py"        = 3
  }
}
plugin "q" {
  command      = "bin/q"
  sha256_files = ["plugin.py"]
}
`)
	wantErrs := []string{
		"t.hcl:4:21: Invalid sha256_files checksum",
		"t.hcl:5:5: Invalid sha256_files path",
		"t.hcl:6:5: Duplicate sha256_files path",
		"t.hcl:7:21: Invalid sha256_files checksum",
		"t.hcl:12:18: Incorrect attribute value type",
	}
	if diff := cmp.Diff(wantErrs, short(diags, hcl.DiagError)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\n%s", diff, FormatDiagnostics(diags))
	}
	txt := FormatDiagnostics(diags)
	for _, w := range []string{`The checksum of "plugin.py" must be the 64 hexadecimal digits`, `"./plugin.py" names the file`, "already pinned at t.hcl:4:5", `the value for "x.py" is not a string`} {
		if !strings.Contains(txt, w) {
			t.Errorf("diagnostics lack %q:\n%s", w, txt)
		}
	}
}

// Plugin.Files lists the executable, the args naming regular files (not
// flags, directories or missing files) and the sha256_files paths, each
// once, absolute.
func TestPluginFiles(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, f := range []string{"plugin.py", "conf.json"} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir("sub", 0o755); err != nil {
		t.Fatal(err)
	}
	p := Plugin{Command: "python3", Path: "/usr/bin/python3",
		Args:        []string{"-u", "plugin.py", "sub", "missing.py", "--conf", "conf.json", "./plugin.py"},
		SHA256Files: map[string]string{"plugin.py": sumA, "lib/z.py": sumA, "lib/a.py": sumA}}
	want := []string{"/usr/bin/python3", filepath.Join(dir, "plugin.py"), filepath.Join(dir, "conf.json"),
		filepath.Join(dir, "lib/a.py"), filepath.Join(dir, "lib/z.py")}
	if got := p.Files(); !slices.Equal(got, want) {
		t.Errorf("Files() = %v, want %v", got, want)
	}
}
