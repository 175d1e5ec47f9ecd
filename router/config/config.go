package config

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/json"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/inputfile"
	"github.com/switchyard-router/switchyard/router/policy"
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
	// DefaultReplayDecisionLatency is the simulated time router replay
	// charges for one call into a plugin (Plugin.ReplayDecisionLatency):
	// 100 us, the measured p50 of one plugin Decide round trip on loopback
	// (80 us; p99 168 us), rounded up (BENCHMARKS.md, "Out-of-process
	// plugins").
	DefaultReplayDecisionLatency = 100 * time.Microsecond
	// MaxReplayDecisionLatency bounds replay_decision_latency: 1 s, far
	// above any routing decision, so that a slip of unit ("100ms" for
	// "100us") is still accepted but a value that would stall every
	// simulated request by minutes is not.
	MaxReplayDecisionLatency = time.Second
	// DefaultFallback is the fallback of a policy that names none: the
	// built-in least-loaded picker.
	DefaultFallback = "least-loaded"
	// DefaultPolicyName names the built-in default policy; it is reserved.
	DefaultPolicyName = catalog.ReservedName
	// DefaultScorerType and DefaultPickerType make up the default policy.
	DefaultScorerType = "kv-affinity"
	DefaultPickerType = "min-cost"
)

// Roles lists the worker roles in the order worker_selection documents them.
var Roles = []shared.Role{shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode}

// PolicyFile is what a policy file resolves to: the router settings, the
// declared plugins, every policy instantiated, the policy serving each role,
// the queue, the worker blocks and the request classifier. It is data: the
// running form of the file (compiled policies, the plugin Host) is
// loader.Bundle, which loader.LoadBundle builds from it.
type PolicyFile struct {
	// Filename is the name the file was loaded under; diagnostics and
	// ranges refer to it.
	Filename string
	// BlockSize is router.block_size, the tokens per KV block for prefix
	// hashing (> 0; DefaultBlockSize when unset): the override of the
	// engines' own block size when BlockSizeSet, the size of router
	// replay's trace and of requests whose engines report none otherwise.
	BlockSize int
	// BlockSizeSet is true when the file sets router.block_size (to any
	// value, 512 included): the live router then keys every model at
	// BlockSize; false keys each model at its engines' block size.
	BlockSizeSet bool
	// Seed fixes the random draws of seeded components for reproducible
	// replays; nil when unset.
	Seed *int64
	// Plugins are the decoded plugin blocks, in file order. When the load
	// had a PluginHost, a plugin whose Start failed has Failed set.
	Plugins []Plugin
	// Catalog is the catalog the file was resolved against: the caller's,
	// or, when plugins were started, a clone of it holding their types too.
	Catalog *catalog.Catalog
	// Policies holds one instance of each policy by name, for callers that
	// want a policy rather than a role's view of it: for a policy some role
	// reaches, the instance of the first such role in Roles order
	// (aggregated, prefill, decode); for a policy no role reaches, the
	// instance built with an empty role, but only when all its components
	// are built in (out-of-process components of unused policies are never
	// configured). The built-in default policy is under DefaultPolicyName
	// when the catalog registers its types. Each policy's Fallback points
	// at its fallback's instance for the same role.
	Policies map[string]*policy.Policy
	// Roles maps each worker role to its own instance of its policy: the
	// one worker_selection names, or the default policy. Each role gets its
	// own instances even when roles name the same policy (components learn
	// their role at construction), and its Fallback chain holds that role's
	// instances of the fallbacks.
	Roles map[shared.Role]*policy.Policy
	// RolePolicies maps each role to the name of its policy.
	RolePolicies map[shared.Role]string
	// Queue is the file's queue block, or DefaultQueue when it has none.
	Queue Queue
	// Cluster is the file's cluster block (replicas sharing over NATS),
	// nil when it has none.
	Cluster *Cluster
	// Workers are the file's worker blocks, in file order (see Worker).
	Workers []Worker
	// Tokenizers are the file's tokenizer blocks, in file order (see
	// Tokenizer); a model without one is keyed by characters.
	Tokenizers []Tokenizer
	// Classifier is the request classifier, or nil when the file has none.
	Classifier *Component
	// Decls describes each policy as declared (components, their sources
	// and ranges, the fallback), in file order with the default policy
	// last: the material of `router validate`.
	Decls []*PolicyDecl
}

// FailedPlugins returns the plugins whose start failed, in file order.
func (f *PolicyFile) FailedPlugins() []Plugin {
	var out []Plugin
	for _, p := range f.Plugins {
		if p.Failed != nil {
			out = append(out, p)
		}
	}
	return out
}

// Values of a plugin block's on_start_failure.
const (
	// OnStartFailureError makes a plugin that fails to start an error: the
	// file does not load. The default.
	OnStartFailureError = "error"
	// OnStartFailureFallback makes it a warning: the components whose types
	// the plugin would have provided become unavailable placeholders
	// failing with ErrPluginUnavailable, so their policies decide by their
	// fallbacks.
	OnStartFailureFallback = "fallback"
)

// RestartPolicy is a plugin block's `restart { max_restarts, window,
// backoff_min, backoff_max }`: a plugin that exits or is killed is
// restarted after an exponential backoff with jitter from BackoffMin
// doubling to BackoffMax; past MaxRestarts restarts within Window it is
// crash-looping: its policies decide by fallback while the host keeps
// retrying it with a delay doubling on up to 5 minutes
// (supervisor.CrashLoopBackoffMax), until a start succeeds. The
// supervisor's RestartPolicy documents the details.
type RestartPolicy struct {
	MaxRestarts int           // restarts within Window before the crash-loop backoff; 0 never restarts
	Window      time.Duration // the sliding window MaxRestarts counts in
	BackoffMin  time.Duration // first delay
	BackoffMax  time.Duration // delay cap outside a crash loop
}

// DefaultRestartPolicy is 5 restarts per minute, backing off from 100 ms to
// 10 s: a one-off crash costs a tenth of a second, and a crash-looping
// plugin moves to the slower crash-loop backoff within about 3 s.
// (Nomad's task restart default is 2 attempts in 30 min with a 15 s delay;
// a routing plugin sits on the request path, so it is retried sooner and
// more often.)
func DefaultRestartPolicy() RestartPolicy {
	return RestartPolicy{MaxRestarts: 5, Window: time.Minute, BackoffMin: 100 * time.Millisecond, BackoffMax: 10 * time.Second}
}

// Plugin is one decoded plugin block. The loader validates it and, when
// given a PluginHost, has the host start it; launching and supervising the
// binary is the host's job.
type Plugin struct {
	// Name is the block label.
	Name string
	// Command is the binary to run, as written in the file.
	Command string
	// Path is the binary the host runs and SHA256 checks: Command looked
	// up on the router's PATH at load when it has no slash
	// (ResolveCommand), Command as written otherwise. The host runs
	// Command when Path is empty.
	Path string
	// Args are the command's arguments, passed as written: a relative path
	// among them is relative to the plugin's working directory, which is
	// the router's.
	Args []string
	// Env is the plugin's environment, with the PassEnv variables; the
	// host's is never passed otherwise.
	Env map[string]string
	// PassEnv names variables of the router's environment passed on to the
	// plugin, read at each start; one the router does not have is left
	// unset. A name is never in both Env and PassEnv (a load error).
	PassEnv []string
	// SHA256 is the expected checksum of Path in lowercase hex, or ""
	// when the binary is not pinned.
	SHA256 string
	// SHA256Files pins the files the plugin runs besides its command (the
	// script an interpreter runs, a module it loads): the block's
	// sha256_files, by path as written there (relative to the router's
	// working directory, like args) to the file's SHA-256 in lowercase
	// hex; nil when none is pinned. The host hashes each (up to
	// MaxPluginFileSize) before every start and refuses the start, never
	// retried, when one differs or cannot be read.
	SHA256Files map[string]string `json:",omitempty"`
	// StartTimeout bounds the start and handshake (DefaultStartTimeout).
	StartTimeout time.Duration
	// CallTimeout bounds one call (DefaultCallTimeout).
	CallTimeout time.Duration
	// ReplayDecisionLatency is the simulated time router replay charges
	// for each call a decision makes into this plugin, between the
	// decision and the request reaching its worker; 0 to
	// MaxReplayDecisionLatency (DefaultReplayDecisionLatency). Serve does
	// not use it. See PolicyFile.ReplayDecisionLatency.
	ReplayDecisionLatency time.Duration
	// OnStartFailure is OnStartFailureError (the default) or
	// OnStartFailureFallback.
	OnStartFailure string
	// Restart is the block's restart policy (DefaultRestartPolicy when it
	// has no restart block).
	Restart RestartPolicy
	// Failed is why the plugin did not start, or nil when it started or no
	// PluginHost was given. With OnStartFailureFallback the file still
	// loads and the plugin's components are unavailable placeholders.
	Failed error
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
	// "plugin NAME". For an unavailable placeholder it names the plugins
	// that failed to start ("plugin NAME", or "plugins A, B").
	Source string
	// OutOfProcess is true for types served by a plugin binary, including
	// unavailable placeholders.
	OutOfProcess bool
	// Unavailable is true for a placeholder standing in for a component
	// whose type no started plugin provides while a plugin with
	// on_start_failure = "fallback" failed to start: its parameters are not
	// checked and every call fails with ErrPluginUnavailable.
	Unavailable bool
	// Weight is a scorer's weight (finite, >= 0; default 1); 0 otherwise.
	Weight float64
	// Params are the decoded parameters with the schema's defaults applied
	// (and a derived seed, see SeedParam).
	Params shared.Params
	// InstanceName is the InstanceInfo.Name the instance was created under,
	// "ROLE/POLICY/BLOCK", or "POLICY/BLOCK" for a policy no role reaches.
	InstanceName string
	// Instance is what the type's constructor returned; it implements the
	// interface matching Kind. It is nil for an out-of-process component of
	// a policy no role reaches: such components are decoded against their
	// schema but not configured.
	Instance shared.Component
	// Range is the block's definition; zero for components of the built-in
	// default policy.
	Range hcl.Range
}

// PolicyDecl describes one policy of a PolicyFile as declared.
type PolicyDecl struct {
	// Name is the policy name.
	Name string
	// Builtin is true for the default policy, which no file declares.
	Builtin bool
	// Range is the policy block's definition; zero for the default policy.
	Range hcl.Range
	// Components are the filters, scorers and the picker, in that order,
	// each group in file order, as instantiated for Policy.
	Components []*Component
	// Fallback names the resolved fallback: a policy name, or a picker type
	// when FallbackPicker is set; "" when the policy has none.
	Fallback string
	// FallbackPicker is true when Fallback is a picker type run as a
	// picker-only policy with default parameters.
	FallbackPicker bool
	// Shadow names the policy asked beside this one on every decision of
	// the roles that select it, whose answer is only compared (the
	// policy's `shadow`); "" when it has none.
	Shadow string
	// Used is true when some role reaches the policy, directly, through
	// fallbacks, or as the shadow of a role's policy.
	Used bool
	// Roles are the roles that reach the policy, in Roles order.
	Roles []shared.Role
	// Policy is the instance PolicyFile.Policies holds (the first role's, or
	// the empty role's for an unused policy); nil for an unused policy with
	// out-of-process components.
	Policy *policy.Policy
	// Instances holds the policy's instance for each role in Roles; for an
	// unused policy with only built-in components, its one instance under
	// the empty role.
	Instances map[shared.Role]*policy.Policy
}

// LoadFile reads and loads the policy file at path; see Load and
// readFile for what files are read.
func LoadFile(path string, cat *catalog.Catalog) (*PolicyFile, hcl.Diagnostics) {
	return LoadFileWith(path, cat, Options{})
}

// LoadFileWith is LoadFile with options (see LoadWith).
func LoadFileWith(path string, cat *catalog.Catalog, o Options) (*PolicyFile, hcl.Diagnostics) {
	src, diags := readFile(path, "policy")
	if diags != nil {
		return nil, diags
	}
	return LoadWith(path, src, cat, o)
}

// readFile reads the policy or workers file (what) at path for LoadFile
// and LoadWorkers: a regular file, symbolic links followed, of at most
// inputfile.MaxConfigSize bytes (router/inputfile). Anything else (a
// missing file, a directory, a named pipe, a device such as /dev/zero, a
// file over the limit) is one error diagnostic at path:1:1, "Failed to
// read policy file", whose detail says why and names the file. "-" is not
// standard input here: a policy or workers file is read again on reload,
// so it must be a file; the diagnostic says so.
func readFile(path, what string) ([]byte, hcl.Diagnostics) {
	var (
		src []byte
		err error
	)
	if path == "-" {
		err = errors.New(`"-" is not standard input here: a ` + what + ` file is read from a named file (write ./- for a file named -)`)
	} else {
		src, err = inputfile.ReadFile(path, inputfile.MaxConfigSize)
	}
	if err != nil {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Failed to read " + what + " file",
			Detail:   err.Error() + ".",
			Subject:  &hcl.Range{Filename: path, Start: hcl.InitialPos, End: hcl.InitialPos},
		}}
	}
	return src, nil
}

// Load parses src as a policy file named filename and resolves it against
// the component types of cat (a nil cat is an empty catalog). A filename
// ending in ".json" is read as HCL's JSON syntax, anything else as native
// HCL.
//
// On success the PolicyFile is non-nil and the diagnostics hold only warnings
// (unused policies or plugins, deprecated inputs). When any error is
// reported it is nil; every error is reported, not only the first.
// Load never panics on malformed input, and refuses a file nested deeper
// than MaxNesting (CheckNesting) before HCL parses it.
func Load(filename string, src []byte, cat *catalog.Catalog) (*PolicyFile, hcl.Diagnostics) {
	return LoadWith(filename, src, cat, Options{})
}

// PluginHost starts the plugin binaries a policy file declares.
type PluginHost interface {
	// Start launches the plugin of block p, checks and describes it, and
	// returns the component types it provides. Each TypeInfo.New configures
	// an instance in that plugin process (Configure); it returns
	// *shared.ParamError values (several joined with errors.Join) for
	// parameters the plugin refused, other errors for the whole block.
	Start(ctx context.Context, p Plugin) ([]shared.TypeInfo, error)
}

// Options adjust a load.
type Options struct {
	// Plugins starts the file's plugin blocks, in file order, and the
	// types they return are registered, in a clone of the catalog, under
	// the source "plugin NAME". When nil, no plugin is started and a
	// component using a type that is not in the catalog while the file
	// declares plugins is an error ("Plugin types not available"): the
	// router command always passes a host; tests may not. LoadWith never
	// stops plugins: the host owns their processes, also when the load
	// fails.
	Plugins PluginHost
	// Context bounds the plugins' starts and configurations; nil means
	// context.Background().
	Context context.Context
	// Seed, when set, replaces the file's router.seed (or supplies one), as
	// `router replay --seed` does.
	Seed *int64
	// DefaultSeed, when set, is the seed used when neither Seed nor the
	// file's router.seed gives one: replays use it so that they repeat
	// exactly by default.
	DefaultSeed *int64
	// SeedOffset is added to the router seed (whichever of Seed,
	// router.seed and DefaultSeed gives it) and to every seed a component
	// block sets itself: `router replay --seeds N` loads run k with offset
	// k, so that each run draws new random sequences everywhere while run
	// 0 is the file's own. 0 changes nothing.
	SeedOffset int64
}

// parse parses src as HCL, or as HCL's JSON syntax when filename ends in
// ".json", after CheckNesting: a file nested deeper than MaxNesting is
// refused (nil and its diagnostic) before HCL's recursive parser sees it.
// Every load of a policy or workers file parses through here.
func parse(filename string, src []byte) (*hcl.File, hcl.Diagnostics) {
	if diags := CheckNesting(filename, src); diags != nil {
		return nil, diags
	}
	if strings.HasSuffix(filename, ".json") {
		return json.Parse(src, filename)
	}
	return hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
}

// LoadPluginBlocks reads the policy file at path (as LoadFile does) and
// decodes its plugin blocks only, as Load does (the command looked up on
// PATH, the attributes checked), without starting them: what `router
// plugins describe --policy` launches. The rest of the file is not
// checked. The diagnostics are the plugin blocks' and the syntax's; a
// block with an error is left out of the result.
func LoadPluginBlocks(path string) ([]Plugin, hcl.Diagnostics) {
	src, diags := readFile(path, "policy")
	if diags != nil {
		return nil, diags
	}
	file, diags := parse(path, src)
	if file == nil || file.Body == nil {
		return nil, diags
	}
	content, _, more := file.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: blockPlugin, LabelNames: []string{"name"}}}})
	l := newLoader(path, nil)
	l.diags = append(diags, more...)
	for _, blk := range content.Blocks {
		l.pluginBlock(blk)
	}
	var out []Plugin
	for _, p := range l.plugins {
		if !p.blockErrors {
			out = append(out, p.Plugin)
		}
	}
	return out, l.diags
}

// LoadClusterWorkers reads the policy file at path (as LoadFile does)
// and decodes its cluster block and worker blocks only, as Load does,
// starting no plugin and resolving no policy: what `router kv-relay`
// needs, on a host that may lack the plugins' binaries. The rest of the
// file is not checked. The cluster is nil when the file has no cluster
// block; the workers are in file order. The diagnostics are those
// blocks' and the syntax's; on an error the results are nil.
func LoadClusterWorkers(path string) (*Cluster, []Worker, hcl.Diagnostics) {
	src, diags := readFile(path, "policy")
	if diags != nil {
		return nil, nil, diags
	}
	file, diags := parse(path, src)
	if file == nil || file.Body == nil {
		return nil, nil, diags
	}
	content, _, more := file.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: blockCluster}, {Type: blockWorker, LabelNames: []string{"name"}},
	}})
	l := newLoader(path, nil)
	l.diags = append(diags, more...)
	var cluster *hcl.Block
	for _, blk := range content.Blocks {
		switch {
		case blk.Type == blockWorker:
			l.workerBlock(blk)
		case cluster != nil:
			l.errorf(blk.DefRange, "Duplicate "+blk.Type+" block",
				"Only one %s block is allowed; the first is at %s. Merge them.", blk.Type, pos(cluster.DefRange))
		default:
			cluster = blk
			l.clusterBlock(blk)
		}
	}
	l.diags = dedupe(l.diags)
	if l.diags.HasErrors() {
		return nil, nil, l.diags
	}
	return l.file.Cluster, l.file.Workers, l.diags
}

// LoadWith is Load with options.
func LoadWith(filename string, src []byte, cat *catalog.Catalog, o Options) (*PolicyFile, hcl.Diagnostics) {
	if cat == nil {
		cat = catalog.New()
	}
	file, diags := parse(filename, src)
	// HCL returns a usable body alongside most syntax errors (a redefined
	// attribute, say): keep loading it so every problem is reported in one
	// run, not the first only.
	if file == nil || file.Body == nil {
		return nil, diags
	}
	if o.Context == nil {
		o.Context = context.Background()
	}
	l := newLoader(filename, cat)
	l.opts = o
	l.diags = diags
	l.syntaxErrors = diags.HasErrors()
	l.load(file.Body)
	l.diags = dedupe(l.diags)
	if l.diags.HasErrors() {
		return nil, l.diags
	}
	return l.file, l.diags
}
