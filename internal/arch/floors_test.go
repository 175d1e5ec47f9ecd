package arch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// floor is one row of docs/architecture.md's floor table.
type floor struct {
	name  string
	num   int // 0 for a row without a number (plugins)
	paths []string
	may   map[int]bool
}

var floorRow = regexp.MustCompile(`^\|\s*(?:(\d+)\s+)?([a-z][a-z ]*[a-z])\s*\|([^|]*)\|([^|]*)\|`)

// readFloors parses the floor table of docs/architecture.md: a row is
// "| N name | `path`, ... | 1-9 | rule |"; "may import" lists floor numbers
// and ranges.
func readFloors(t *testing.T, root string) []floor {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var floors []floor
	inTable := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "| floor |") {
			inTable = true
			continue
		}
		if !inTable {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		m := floorRow.FindStringSubmatch(line)
		if m == nil {
			continue // the separator row
		}
		fl := floor{name: m[2], may: map[int]bool{}}
		if m[1] != "" {
			fl.num, _ = strconv.Atoi(m[1])
		}
		for _, s := range codeSpan.FindAllStringSubmatch(m[3], -1) {
			fl.paths = append(fl.paths, s[1])
		}
		for _, part := range strings.Split(m[4], ",") {
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			lo, hi, isRange := strings.Cut(part, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 != nil || err2 != nil {
				t.Fatalf("docs/architecture.md: floor %q: cannot read %q as floors", fl.name, part)
			}
			for i := a; i <= b; i++ {
				fl.may[i] = true
			}
		}
		floors = append(floors, fl)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(floors) < 5 {
		t.Fatalf("docs/architecture.md: found %d floors in the table, want the whole map", len(floors))
	}
	return floors
}

type listedPackage struct {
	ImportPath string
	Imports    []string
	Module     *struct{ Path string }
}

// listPackages runs go list in dir and returns the packages with their
// imports, as paths relative to the repository's module path.
func listPackages(t *testing.T, dir, base string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", dir, err, stderr.String())
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listedPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := func(ip string) (string, bool) {
			if ip == base {
				return ".", true
			}
			r, ok := strings.CutPrefix(ip, base+"/")
			return r, ok
		}
		name, ok := rel(p.ImportPath)
		if !ok {
			t.Fatalf("package %s is outside %s", p.ImportPath, base)
		}
		var imps []string
		for _, ip := range p.Imports {
			if r, ok := rel(ip); ok {
				imps = append(imps, r)
			}
		}
		pkgs[name] = imps
	}
	return pkgs
}

// place returns the floor of a package: the row with the longest path that
// is the package or contains it.
func place(floors []floor, pkg string) (floor, string, bool) {
	var best floor
	bestPath, found := "", false
	for _, fl := range floors {
		for _, p := range fl.paths {
			if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) >= len(bestPath) {
				best, bestPath, found = fl, p, true
			}
		}
	}
	return best, bestPath, found
}

// TestFloors holds the code to docs/architecture.md: every package of the
// router module and of the shared module is placed on a floor; a package
// imports only its own floor and the floors its row names; a face imports
// no other face.
func TestFloors(t *testing.T) {
	root := repoRoot(t)
	floors := readFloors(t, root)
	const module = "github.com/switchyard-router/switchyard"
	pkgs := listPackages(t, root, module)
	if _, err := os.Stat(filepath.Join(root, "shared", "go.mod")); err == nil {
		for name, imps := range listPackages(t, filepath.Join(root, "shared"), module) {
			pkgs[name] = imps
		}
	}
	names := make([]string, 0, len(pkgs))
	for name := range pkgs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fl, at, ok := place(floors, name)
		if !ok {
			t.Errorf("%s is on no floor: add it to the table in docs/architecture.md", name)
			continue
		}
		for _, imp := range pkgs[name] {
			tf, tat, ok := place(floors, imp)
			if !ok {
				continue // reported as a package of its own
			}
			switch {
			case tf.name == fl.name && fl.name == "faces" && tat != at:
				t.Errorf("%s imports %s: a face imports no other face", name, imp)
			case tf.name == fl.name:
			case tf.num == 0 || !fl.may[tf.num]:
				t.Errorf("%s (floor %q) imports %s (floor %q), which its floor may not import", name, fl.name, imp, tf.name)
			}
		}
	}
}

// TestFloorsCatchAnUpwardImport checks the check: a core part importing the
// selection core, and a face importing another face, are both reported.
func TestFloorsCatchAnUpwardImport(t *testing.T) {
	floors := readFloors(t, repoRoot(t))
	prefixFloor, _, ok1 := place(floors, "router/prefix")
	coreFloor, _, ok2 := place(floors, "router")
	if !ok1 || !ok2 {
		t.Fatal("router/prefix or router is on no floor")
	}
	if prefixFloor.may[coreFloor.num] || prefixFloor.num >= coreFloor.num {
		t.Errorf("router/prefix (floor %d) may import the core (floor %d)", prefixFloor.num, coreFloor.num)
	}
	serveFloor, serveAt, _ := place(floors, "router/serve")
	eppFloor, eppAt, _ := place(floors, "router/epp/internal")
	if serveFloor.name != "faces" || eppFloor.name != "faces" || serveAt == eppAt {
		t.Errorf("router/serve (%q at %s) and router/epp (%q at %s) are not two faces", serveFloor.name, serveAt, eppFloor.name, eppAt)
	}
}
