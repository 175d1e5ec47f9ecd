package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/policy"
	"github.com/switchyard-router/switchyard/shared"
)

// Block and attribute names of the policy file.
const (
	blockRouter     = "router"
	blockPlugin     = "plugin"
	blockPolicy     = "policy"
	blockSelection  = "worker_selection"
	blockClassifier = "request_classifier"
)

var fileSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{
		{Type: blockRouter},
		{Type: blockPlugin, LabelNames: []string{"name"}},
		{Type: blockPolicy, LabelNames: []string{"name"}},
		{Type: blockSelection},
		{Type: blockClassifier},
		{Type: blockQueue},
		{Type: blockCluster},
		{Type: blockWorker, LabelNames: []string{"name"}},
		{Type: blockTokenizer, LabelNames: []string{"model"}},
	},
}

var routerSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "block_size"},
		{Name: "seed"},
	},
}

var pluginSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "command", Required: true},
		{Name: "args"},
		{Name: "env"},
		{Name: "pass_env"},
		{Name: "sha256"},
		{Name: "sha256_files"},
		{Name: "start_timeout"},
		{Name: "call_timeout"},
		{Name: "replay_decision_latency"},
		{Name: "on_start_failure"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "restart"}},
}

var restartSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "max_restarts"},
		{Name: "window"},
		{Name: "backoff_min"},
		{Name: "backoff_max"},
	},
}

var selectionSchema = func() *hcl.BodySchema {
	s := &hcl.BodySchema{}
	for _, r := range Roles {
		s.Attributes = append(s.Attributes, hcl.AttributeSchema{Name: string(r)})
	}
	return s
}()

// loader holds the state of one Load call.
type loader struct {
	filename string
	cat      *catalog.Catalog
	diags    hcl.Diagnostics
	file     *PolicyFile

	plugins []*pluginDecl
	started bool // a host was given: plugins were started
	// usedSources are the catalog sources of the types that component
	// blocks and fallbacks name, also of blocks that have errors;
	// unresolved counts the component blocks whose type is unknown or
	// unreadable, which may have meant any plugin's type.
	usedSources map[string]bool
	unresolved  int
	// syntaxErrors: the file did not parse cleanly, so HCL may have dropped
	// any part of it (a broken one-line block swallows the rest of the
	// file): what looks missing or unused may be in the dropped part.
	syntaxErrors bool
	// badSelection: a role in worker_selection names no usable policy, the
	// block has errors (a misspelled role), there is no worker_selection
	// block but the file has a top-level error (a misspelled
	// worker_selection block), or a policy's shadow is in error, so which
	// policies are in use is not known.
	badSelection bool

	// pluginAt, workerAt and tokenizerAt are the declarations kept so
	// far by name (a tokenizer's by model), for the duplicate checks: a
	// map, not a scan of the list, so a file of many blocks loads in
	// linear time.
	pluginAt    map[string]*pluginDecl
	workerAt    map[string]hcl.Range
	tokenizerAt map[string]hcl.Range
	// workerURLAt is the first loaded worker by its (normalised) url,
	// for the same-URL warning (sameURL).
	workerURLAt map[string]*Worker

	// queueErrors: the queue block has errors, so its classes may be
	// incomplete and the classifier's class names are not checked.
	queueErrors bool

	decls      []*policyDecl
	byName     map[string]*policyDecl
	def        *policyDecl // the built-in default policy; nil when unavailable
	classifier *compDecl
	opts       Options
}

// pluginDecl is one plugin block while the loader resolves it.
type pluginDecl struct {
	Plugin
	blockErrors bool // the block has errors: the plugin is not started
}

func newLoader(filename string, cat *catalog.Catalog) *loader {
	return &loader{
		filename: filename,
		cat:      cat,
		file: &PolicyFile{
			Filename:     filename,
			BlockSize:    DefaultBlockSize,
			Policies:     make(map[string]*policy.Policy),
			Roles:        make(map[shared.Role]*policy.Policy),
			RolePolicies: make(map[shared.Role]string),
			Queue:        DefaultQueue(),
		},
		byName:      make(map[string]*policyDecl),
		usedSources: make(map[string]bool),
		pluginAt:    make(map[string]*pluginDecl),
		workerAt:    make(map[string]hcl.Range),
		tokenizerAt: make(map[string]hcl.Range),
		workerURLAt: make(map[string]*Worker),
	}
}

func (l *loader) load(body hcl.Body) {
	content, diags := body.Content(fileSchema)
	l.diags = append(l.diags, diags...)

	singles := make(map[string]*hcl.Block)
	var (
		selection *hcl.Block
		policies  []*hcl.Block
	)
	for _, blk := range content.Blocks {
		switch blk.Type {
		case blockRouter, blockSelection, blockClassifier, blockQueue, blockCluster:
			if first, ok := singles[blk.Type]; ok {
				l.errorf(blk.DefRange, "Duplicate "+blk.Type+" block",
					"Only one %s block is allowed; the first is at %s. Merge them.", blk.Type, pos(first.DefRange))
				continue
			}
			singles[blk.Type] = blk
		}
		switch blk.Type {
		case blockRouter:
			if singles[blk.Type] == blk {
				l.routerBlock(blk)
			}
		case blockPlugin:
			l.pluginBlock(blk)
		case blockWorker:
			l.workerBlock(blk)
		case blockTokenizer:
			l.tokenizerBlock(blk)
		case blockPolicy:
			policies = append(policies, blk)
		case blockSelection:
			if singles[blk.Type] == blk {
				selection = blk
			}
		case blockQueue:
			if singles[blk.Type] == blk {
				l.queueBlock(blk)
			}
		case blockCluster:
			if singles[blk.Type] == blk {
				l.clusterBlock(blk)
			}
		}
	}

	if l.opts.Seed != nil {
		seed := *l.opts.Seed
		l.file.Seed = &seed
	} else if l.file.Seed == nil && l.opts.DefaultSeed != nil {
		seed := *l.opts.DefaultSeed
		l.file.Seed = &seed
	}
	if l.file.Seed != nil && l.opts.SeedOffset != 0 {
		seed := *l.file.Seed + l.opts.SeedOffset
		l.file.Seed = &seed
	}

	// Decode and resolve everything first: which roles reach which policy
	// decides how each is instantiated.
	l.startPlugins()
	l.file.Catalog = l.cat
	l.buildDefault()
	for _, blk := range policies {
		l.policyBlock(blk)
	}
	for _, d := range l.decls {
		l.resolveFallback(d)
	}
	for _, d := range l.decls {
		l.resolveShadow(d)
	}
	for _, d := range l.decls {
		l.resolveCanary(d)
	}
	l.checkCycles()
	if l.syntaxErrors || selection == nil && diags.HasErrors() {
		l.badSelection = true // an unsupported top-level block may have meant it
	}
	l.selectRoles(selection)
	if blk := singles[blockClassifier]; blk != nil {
		l.classifier = l.decodeComponent(shared.KindClassifier, blk, "", "the request_classifier")
	}
	l.markUsed()
	l.checkPluginsUsed()

	// Then instantiate: each policy once per role that reaches it.
	l.instantiateAll()
	if l.classifier != nil {
		l.file.Classifier = l.instantiate(l.classifier, "", "request_classifier", true)
		l.checkClassifierClasses()
	}
	l.finish()
}

func (l *loader) routerBlock(blk *hcl.Block) {
	content, diags := blk.Body.Content(routerSchema)
	l.diags = append(l.diags, diags...)
	if attr, ok := content.Attributes["block_size"]; ok {
		if v, ok := l.intAttr(attr); ok {
			if v <= 0 || v > 1<<30 {
				l.attrErrorf(attr, "Invalid block_size",
					"block_size is the tokens per KV block and must be between 1 and %d, got %d; the Mooncake traces use %d.",
					1<<30, v, DefaultBlockSize)
			} else {
				l.file.BlockSize, l.file.BlockSizeSet = int(v), true
			}
		}
	}
	if attr, ok := content.Attributes["seed"]; ok {
		if v, ok := l.intAttr(attr); ok {
			l.file.Seed = &v
		}
	}
}

func (l *loader) pluginBlock(blk *hcl.Block) {
	name := blk.Labels[0]
	nameOK := l.checkName("plugin", name, blk.LabelRanges[0])
	if first := l.pluginAt[name]; nameOK && first != nil {
		l.errorf(blk.LabelRanges[0], "Duplicate plugin",
			"Plugin %q is already declared at %s; rename or remove one of them.", name, pos(first.Range))
		nameOK = false
	}
	p := &pluginDecl{Plugin: Plugin{
		Name:                  name,
		StartTimeout:          DefaultStartTimeout,
		CallTimeout:           DefaultCallTimeout,
		ReplayDecisionLatency: DefaultReplayDecisionLatency,
		OnStartFailure:        OnStartFailureError,
		Restart:               DefaultRestartPolicy(),
		Range:                 blk.DefRange,
		AttrRanges:            make(map[string]hcl.Range),
	}}
	errorsBefore := len(l.diags.Errs())
	defer func() { p.blockErrors = len(l.diags.Errs()) > errorsBefore }()
	content, diags := blk.Body.Content(pluginSchema)
	l.diags = append(l.diags, diags...)
	for n, attr := range content.Attributes {
		p.AttrRanges[n] = attr.Range
	}
	if attr, ok := content.Attributes["command"]; ok {
		if s, ok := l.stringAttr(attr); ok {
			if strings.TrimSpace(s) == "" || strings.ContainsRune(s, 0) {
				l.attrErrorf(attr, "Invalid plugin command", "command must name the plugin binary to run, a path such as \"bin/my-plugin\".")
			} else if path, err := ResolveCommand(s); errors.Is(err, ErrCommandIsDirectory) {
				l.attrErrorf(attr, "Plugin command is a directory", "%v. Give the path of the plugin binary (or of its interpreter) to run.", err)
			} else if err != nil {
				l.attrErrorf(attr, "Plugin command not found", "%v. Give the binary's path (with a slash), or install it on the router's PATH.", err)
			} else {
				p.Path = path
			}
			p.Command = s
		}
	}
	if attr, ok := content.Attributes["args"]; ok {
		if v, ok := l.decodeAttr(attr, cty.List(cty.String)); ok && !v.IsNull() {
			for _, e := range v.AsValueSlice() {
				if e.IsNull() {
					l.attrErrorf(attr, "Invalid plugin argument", "args must be a list of strings without null elements.")
					break
				}
				p.Args = append(p.Args, e.AsString())
			}
		}
	}
	if attr, ok := content.Attributes["env"]; ok {
		l.duplicateKeys(attr, "environment variable")
		if v, ok := l.decodeAttr(attr, cty.Map(cty.String)); ok && !v.IsNull() {
			p.Env = make(map[string]string)
			for k, e := range v.AsValueMap() {
				switch {
				case !ValidEnvName(k):
					l.attrErrorf(attr, "Invalid environment variable name",
						"Environment variable name %q must be non-empty and contain neither '=' nor NUL.", k)
				case e.IsNull() || strings.ContainsRune(e.AsString(), 0):
					l.attrErrorf(attr, "Invalid environment variable value",
						"The value of %q must be a string without NUL bytes.", k)
				default:
					p.Env[k] = e.AsString()
				}
			}
		}
	}
	if attr, ok := content.Attributes["pass_env"]; ok {
		l.passEnv(attr, p)
	}
	if attr, ok := content.Attributes["sha256"]; ok {
		if s, ok := l.stringAttr(attr); ok {
			b, err := hex.DecodeString(s)
			if err != nil || len(b) != 32 {
				l.attrErrorf(attr, "Invalid sha256",
					"sha256 must be the 64 hexadecimal digits of the binary's SHA-256 checksum (as printed by sha256sum), got %d characters.", len(s))
			} else {
				p.SHA256 = strings.ToLower(s)
			}
		}
	}
	if attr, ok := content.Attributes["sha256_files"]; ok {
		l.sha256Files(attr, p)
	}
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{{"start_timeout", &p.StartTimeout}, {"call_timeout", &p.CallTimeout}} {
		attr, ok := content.Attributes[f.name]
		if !ok {
			continue
		}
		d, ok := l.durationAttr(attr)
		if !ok {
			continue
		}
		if d <= 0 {
			l.attrErrorf(attr, "Invalid "+f.name, "%s must be a positive duration such as \"5s\" or \"20ms\", got %q.", f.name, d.String())
			continue
		}
		*f.dst = d
	}
	if attr, ok := content.Attributes["replay_decision_latency"]; ok {
		if d, ok := l.durationAttr(attr); ok {
			if d < 0 || d > MaxReplayDecisionLatency {
				l.attrErrorf(attr, "Invalid replay_decision_latency",
					"replay_decision_latency must be a duration from \"0s\" to %q, such as \"100us\" (the default), got %q.",
					MaxReplayDecisionLatency.String(), d.String())
			} else {
				p.ReplayDecisionLatency = d
			}
		}
	}
	if attr, ok := content.Attributes["on_start_failure"]; ok {
		if s, ok := l.stringAttr(attr); ok {
			switch s {
			case OnStartFailureError, OnStartFailureFallback:
				p.OnStartFailure = s
			default:
				l.attrErrorf(attr, "Invalid on_start_failure",
					"on_start_failure must be %q (a plugin that cannot start stops the load; the default) or %q (warn, and let the policies using it decide by their fallbacks), got %q.",
					OnStartFailureError, OnStartFailureFallback, s)
			}
		}
	}
	var restart *hcl.Block
	for _, rb := range content.Blocks {
		if restart != nil {
			l.errorf(rb.DefRange, "Duplicate restart block",
				"Plugin %q already has a restart block at %s; merge them.", name, pos(restart.DefRange))
			continue
		}
		restart = rb
		l.restartBlock(rb, &p.Restart)
	}
	if nameOK {
		l.plugins = append(l.plugins, p)
		l.pluginAt[name] = p
	}
}

// passEnv decodes a plugin's pass_env list into p.PassEnv: names of
// environment variables, each at most once and not also in env.
func (l *loader) passEnv(attr *hcl.Attribute, p *pluginDecl) {
	v, ok := l.decodeAttr(attr, cty.List(cty.String))
	if !ok || v.IsNull() {
		return
	}
	for _, e := range v.AsValueSlice() {
		switch {
		case e.IsNull():
			l.attrErrorf(attr, "Invalid environment variable name", "pass_env must be a list of strings without null elements.")
			continue
		case !ValidEnvName(e.AsString()):
			l.attrErrorf(attr, "Invalid environment variable name",
				"pass_env names variables of the router's environment; %q is not a name: it must be non-empty and contain neither '=' nor NUL.", e.AsString())
			continue
		case slices.Contains(p.PassEnv, e.AsString()):
			l.attrErrorf(attr, "Duplicate environment variable",
				"pass_env lists %q more than once.", e.AsString())
			continue
		}
		name := e.AsString()
		if _, both := p.Env[name]; both {
			l.attrErrorf(attr, "Environment variable set twice",
				"%q is in both env and pass_env: env gives the plugin a fixed value, pass_env the router's own. Keep it in one of them.", name)
			continue
		}
		p.PassEnv = append(p.PassEnv, name)
	}
}

// restartBlock decodes a plugin's restart block into r (which holds the
// defaults).
func (l *loader) restartBlock(blk *hcl.Block, r *RestartPolicy) {
	content, diags := blk.Body.Content(restartSchema)
	l.diags = append(l.diags, diags...)
	if attr, ok := content.Attributes["max_restarts"]; ok {
		if n, ok := l.intAttr(attr); ok {
			if n < 0 || n > 1000 {
				l.attrErrorf(attr, "Invalid max_restarts", "max_restarts must be between 0 (never restart) and 1000, got %d.", n)
			} else {
				r.MaxRestarts = int(n)
			}
		}
	}
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{{"window", &r.Window}, {"backoff_min", &r.BackoffMin}, {"backoff_max", &r.BackoffMax}} {
		attr, ok := content.Attributes[f.name]
		if !ok {
			continue
		}
		if d, ok := l.durationAttr(attr); ok {
			if d <= 0 {
				l.attrErrorf(attr, "Invalid "+f.name, "%s must be a positive duration such as \"1s\", got %q.", f.name, d.String())
				continue
			}
			*f.dst = d
		}
	}
	if r.BackoffMin > r.BackoffMax {
		l.errorf(blk.DefRange, "Invalid restart backoff",
			"backoff_min (%s) must not exceed backoff_max (%s).", r.BackoffMin, r.BackoffMax)
	}
}

// selectRoles resolves worker_selection and fills PolicyFile.Roles.
func (l *loader) selectRoles(blk *hcl.Block) {
	names := make(map[shared.Role]string)
	ranges := make(map[shared.Role]*hcl.Attribute)
	if blk != nil {
		content, diags := blk.Body.Content(selectionSchema)
		l.diags = append(l.diags, diags...)
		if diags.HasErrors() {
			l.badSelection = true // a misspelled role may have named any policy
		}
		for _, role := range Roles {
			attr, ok := content.Attributes[string(role)]
			if !ok {
				continue
			}
			s, ok := l.stringAttr(attr)
			if !ok {
				names[role] = "" // reported; skip the default check too
				l.badSelection = true
				continue
			}
			if s != DefaultPolicyName && l.byName[s] == nil {
				l.attrErrorf(attr, "Unknown policy",
					"Role %s names policy %q, which is not declared. %s", role, s, l.policyChoices())
				names[role] = ""
				l.badSelection = true
				continue
			}
			names[role] = s
			ranges[role] = attr
		}
	}
	for _, role := range Roles {
		name, set := names[role]
		if !set {
			name = DefaultPolicyName
		}
		if name == "" {
			continue
		}
		if name == DefaultPolicyName && l.def == nil {
			subject := hcl.Range{Filename: l.filename, Start: hcl.InitialPos, End: hcl.InitialPos}
			if attr := ranges[role]; attr != nil {
				subject = attr.Expr.Range()
			} else if blk != nil {
				subject = blk.DefRange
			}
			l.errorf(subject, "Default policy unavailable",
				"Role %s uses the default policy (%s scorer + %s picker), but the catalog does not register both types; select a declared policy for the role in worker_selection.",
				role, DefaultScorerType, DefaultPickerType)
			continue
		}
		l.file.RolePolicies[role] = name
	}
}

// checkPluginsUsed warns about started plugins no component block or
// fallback names a type of. A component block whose type is not known
// already got an error (naming the plugins when their types may be
// missing), and it may have meant any plugin's type, so the warning is
// left out then, as it is when the file has a syntax error (the parser may
// have dropped the block naming it). A block that names a plugin's type uses the plugin even
// when it has other errors. Without a host, a plugin whose types the
// caller's catalog holds counts as used.
func (l *loader) checkPluginsUsed() {
	if l.unresolved > 0 || l.syntaxErrors {
		return
	}
	used := make(map[string]bool)
	if l.started {
		for src := range l.usedSources {
			if name, ok := strings.CutPrefix(src, "plugin "); ok {
				used[name] = true
			}
		}
	} else {
		for _, e := range l.cat.Entries() {
			if e.OutOfProcess {
				used[strings.TrimPrefix(e.Source, "plugin ")] = true
			}
		}
	}
	for _, p := range l.plugins {
		if p.Failed != nil || p.blockErrors && l.started {
			continue // already reported; its types are unknown
		}
		if !used[p.Name] {
			l.warnf(p.Range, "Unused plugin",
				"Plugin %q is declared but unused: no component uses a type it provides. Remove the block or use one of its types.", p.Name)
		}
	}
}

// checkName reports an invalid or reserved block name and returns whether it
// is usable.
func (l *loader) checkName(what, name string, rng hcl.Range) bool {
	err := catalog.ValidName(name)
	switch {
	case err == nil:
		return true
	case err == catalog.ErrReservedName:
		l.errorf(rng, "Reserved name",
			"The name %q is reserved for the built-in default policy; choose another %s name.", name, what)
	default:
		l.errorf(rng, "Invalid name",
			"%s name %q must be made of letters, digits, '_', '.' and '-'.", capitalize(what), name)
	}
	return false
}

// finish copies the loader's results into the PolicyFile.
func (l *loader) finish() {
	for _, p := range l.plugins {
		l.file.Plugins = append(l.file.Plugins, p.Plugin)
	}
	for _, d := range l.allDecls() {
		if d.policy != nil {
			l.file.Policies[d.name] = d.policy
		}
		l.file.Decls = append(l.file.Decls, d.export())
	}
	for _, role := range Roles {
		name, ok := l.file.RolePolicies[role]
		if !ok {
			continue
		}
		d := l.def
		if name != DefaultPolicyName {
			d = l.byName[name]
		}
		if p := d.instances[role]; p != nil {
			l.file.Roles[role] = p
		}
	}
}

// allDecls returns the declared policies in file order, then the default
// policy when available.
func (l *loader) allDecls() []*policyDecl {
	all := append([]*policyDecl{}, l.decls...)
	if l.def != nil {
		all = append(all, l.def)
	}
	return all
}

// policyChoices is a hint listing the names a role or fallback may use.
func (l *loader) policyChoices() string {
	names := []string{DefaultPolicyName}
	for _, d := range l.decls {
		names = append(names, d.name)
	}
	return fmt.Sprintf("Declared policies: %s.", strings.Join(quoteAll(names), ", "))
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}
