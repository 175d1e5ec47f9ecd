package config

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/json"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/shared"
)

// Defaults applied when the policy file leaves a setting out.
const (
	// DefaultBlockSize is the tokens per KV block used for prefix hashing:
	// the block size of the Mooncake traces.
	DefaultBlockSize = 512
	// DefaultStartTimeout bounds a plugin's start and handshake.
	DefaultStartTimeout = 5 * time.Second
	// DefaultCallTimeout bounds one call into a plugin.
	DefaultCallTimeout = 20 * time.Millisecond
	// DefaultFallback is the fallback of a policy that names none: the
	// built-in least-loaded picker.
	DefaultFallback = "least-loaded"
	// DefaultPolicyName names the built-in default policy; it is reserved.
	DefaultPolicyName = catalog.ReservedName
	// DefaultScorerType and DefaultPickerType make up the default policy.
	DefaultScorerType = "kv-cost"
	DefaultPickerType = "min-cost"
)

// Roles lists the worker roles in the order worker_selection documents them.
var Roles = []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode}

// Bundle is what a policy file resolves to: the router settings, the
// declared plugins, every policy instantiated, the policy serving each role,
// and the request classifier.
type Bundle struct {
	// Filename is the name the file was loaded under; diagnostics and
	// ranges refer to it.
	Filename string
	// BlockSize is the tokens per KV block for prefix hashing (> 0;
	// DefaultBlockSize when unset).
	BlockSize int
	// Seed fixes the random draws of seeded components for reproducible
	// replays; nil when unset.
	Seed *int64
	// Plugins are the decoded plugin blocks, in file order.
	Plugins []Plugin
	// Policies holds every declared policy by name, plus the built-in
	// default policy under DefaultPolicyName when the catalog registers its
	// types. Each policy's Fallback points at its resolved fallback.
	Policies map[string]*shared.Policy
	// Roles maps each worker role to its policy: the one worker_selection
	// names, or the default policy. Roles naming the same policy share one
	// instance.
	Roles map[shared.Role]*shared.Policy
	// RolePolicies maps each role to the name of its policy.
	RolePolicies map[shared.Role]string
	// Classifier is the request classifier, or nil when the file has none.
	Classifier *Component
	// Decls describes each policy of Policies as declared (components, their
	// sources and ranges, the fallback), in file order with the default
	// policy last: the material of `router validate`.
	Decls []*PolicyDecl
}

// Plugin is one decoded plugin block. The loader validates it; launching
// the binary is the supervisor's job.
type Plugin struct {
	// Name is the block label.
	Name string
	// Command is the binary to run, as written in the file.
	Command string
	// Args are the command's arguments.
	Args []string
	// Env is the plugin's entire environment; the host's is never passed.
	Env map[string]string
	// SHA256 is the expected checksum of Command in lowercase hex, or ""
	// when the binary is not pinned.
	SHA256 string
	// StartTimeout bounds the start and handshake (DefaultStartTimeout).
	StartTimeout time.Duration
	// CallTimeout bounds one call (DefaultCallTimeout).
	CallTimeout time.Duration
	// Range is the block's definition (`plugin "NAME"`).
	Range hcl.Range
	// AttrRanges holds the range of each attribute given, by name, so later
	// stages can report their errors at file:line:col too.
	AttrRanges map[string]hcl.Range
}

// Component is one instantiated filter, scorer, picker or classifier.
type Component struct {
	// Kind is filter, scorer, picker or classifier.
	Kind shared.Kind
	// Name is the block label; empty for the request classifier and for a
	// picker-type fallback, which takes its type's name.
	Name string
	// Type is the component type name.
	Type string
	// Source is the type's catalog source: catalog.SourceBuiltin or
	// "plugin NAME".
	Source string
	// Weight is a scorer's weight (finite, >= 0; default 1); 0 otherwise.
	Weight float64
	// Params are the decoded parameters with the schema's defaults applied.
	Params shared.Params
	// Instance is what the type's constructor returned; it implements the
	// interface matching Kind.
	Instance shared.Component
	// Range is the block's definition; zero for components of the built-in
	// default policy.
	Range hcl.Range
}

// PolicyDecl describes one policy of a Bundle as declared.
type PolicyDecl struct {
	// Name is the policy name.
	Name string
	// Builtin is true for the default policy, which no file declares.
	Builtin bool
	// Range is the policy block's definition; zero for the default policy.
	Range hcl.Range
	// Components are the filters, scorers and the picker, in that order,
	// each group in file order.
	Components []*Component
	// Fallback names the resolved fallback: a policy name, or a picker type
	// when FallbackPicker is set; "" when the policy has none.
	Fallback string
	// FallbackPicker is true when Fallback is a picker type run as a
	// picker-only policy with default parameters.
	FallbackPicker bool
	// Used is true when some role reaches the policy, directly or through
	// fallbacks.
	Used bool
	// Policy is the instantiated policy.
	Policy *shared.Policy
}

// LoadFile reads and loads the policy file at path; see Load.
func LoadFile(path string, cat *catalog.Catalog) (*Bundle, hcl.Diagnostics) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Failed to read policy file",
			Detail:   fmt.Sprintf("Reading %s: %v.", path, err),
			Subject:  &hcl.Range{Filename: path, Start: hcl.InitialPos, End: hcl.InitialPos},
		}}
	}
	return Load(path, src, cat)
}

// Load parses src as a policy file named filename and resolves it against
// the component types of cat (a nil cat is an empty catalog). A filename
// ending in ".json" is read as HCL's JSON syntax, anything else as native
// HCL.
//
// On success the bundle is non-nil and the diagnostics hold only warnings
// (unused policies or plugins, deprecated inputs). When any error is
// reported the bundle is nil; every error is reported, not only the first.
// Load never panics on malformed input.
func Load(filename string, src []byte, cat *catalog.Catalog) (*Bundle, hcl.Diagnostics) {
	return LoadWith(filename, src, cat, Options{})
}

// Options adjust a load.
type Options struct {
	// Seed, when set, replaces the file's router.seed (or supplies one), as
	// `router replay --seed` does.
	Seed *int64
	// DefaultSeed, when set, is the seed used when neither Seed nor the
	// file's router.seed gives one: replays use it so that they repeat
	// exactly by default.
	DefaultSeed *int64
}

// LoadWith is Load with options.
func LoadWith(filename string, src []byte, cat *catalog.Catalog, o Options) (*Bundle, hcl.Diagnostics) {
	if cat == nil {
		cat = catalog.New()
	}
	var (
		file  *hcl.File
		diags hcl.Diagnostics
	)
	if strings.HasSuffix(filename, ".json") {
		file, diags = json.Parse(src, filename)
	} else {
		file, diags = hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	}
	// HCL returns a usable body alongside most syntax errors (a redefined
	// attribute, say): keep loading it so every problem is reported in one
	// run, not the first only.
	if file == nil || file.Body == nil {
		return nil, diags
	}
	l := newLoader(filename, cat)
	l.opts = o
	l.diags = diags
	l.load(file.Body)
	if l.diags.HasErrors() {
		return nil, l.diags
	}
	return l.bundle, l.diags
}
