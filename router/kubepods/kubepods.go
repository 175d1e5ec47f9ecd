// Package kubepods makes Kubernetes pods workers: it watches the pods of
// one namespace that match a label selector (what a Gateway API
// InferencePool names: spec.selector and a target port) with a client-go
// informer, and turns the ready ones into config.Worker values built from
// a Template. serve.Daemon takes a *Pods as its DaemonOptions.Pods
// membership source.
package kubepods

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/switchyard-router/switchyard/router/catalog"
	"github.com/switchyard-router/switchyard/router/config"
	"github.com/switchyard-router/switchyard/shared"
)

const (
	// DefaultMaxPods is Options.MaxPods' default: the most pods that are
	// workers at once. The pods beyond it (by name) are left out and
	// logged.
	DefaultMaxPods = 4096
	// DefaultDebounce is Options.Debounce's default: a burst of pod events
	// within it becomes one change.
	DefaultDebounce = 100 * time.Millisecond
	// ServiceAccountNamespaceFile is where a pod reads its own namespace
	// (DefaultNamespace).
	ServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)

// Errors of New; callers (flag checks) branch on them with errors.Is.
var (
	// ErrBadSelector: the label selector does not parse, or is empty (it
	// would select every pod of the namespace).
	ErrBadSelector = errors.New("invalid label selector")
	// ErrBadPort: a port outside 1..65535 (Template.Port is required; the
	// other ports are 0 when unused).
	ErrBadPort = errors.New("port must be a number from 1 to 65535")
)

// Template is what the workers made from pods share; a pod adds its name
// and its IP. The engine type (vLLM or SGLang) is not set here: the router
// tells it from the engine's metrics, as for worker blocks.
type Template struct {
	// Port is the engine's HTTP port on each pod (the InferencePool's
	// target port), 1 to 65535: the worker's URL is http://PODIP:Port,
	// its metrics http://PODIP:Port/metrics.
	Port int
	// Role is the workers' role; "" is shared.RoleAggregated.
	Role shared.Role
	// Models are the model names every pod serves; nil asks each engine
	// (GET /v1/models), as a worker block without models does.
	Models []string
	// KVEventsPort, when not 0, is the port of each engine's KV-event PUB
	// socket (1 to 65535): the worker's kv_events endpoint is
	// tcp://PODIP:KVEventsPort. 0: no KV events.
	KVEventsPort int
	// KVEventsTopic is the KV-event subscription's topic prefix; ""
	// subscribes to every topic. Used only with KVEventsPort.
	KVEventsTopic string
	// KVEventsReplayPort, when not 0, is the port of each engine's
	// KV-event replay (ROUTER) socket, tcp://PODIP:KVEventsReplayPort.
	// Used only with KVEventsPort.
	KVEventsReplayPort int
}

// Options configure New.
type Options struct {
	// Client lists and watches the pods of Namespace (required): what
	// NewClient returns, or CoreV1().Pods(Namespace) of a client-go
	// clientset (the fake one in tests).
	Client PodsClient
	// Namespace is the pods' namespace (required; DefaultNamespace gives
	// the usual default): pods of another namespace are never workers.
	Namespace string
	// Selector is a label selector in Kubernetes' syntax, such as
	// "app=vllm,tier in (gpu)" (required, not empty).
	Selector string
	// Template builds each pod's worker.
	Template Template
	// MaxPods bounds the workers (DefaultMaxPods when 0).
	MaxPods int
	// Debounce is how long a first pod event waits for the ones after it
	// before the workers are recomputed (DefaultDebounce when 0).
	Debounce time.Duration
	// Logger receives the membership's logs; nil discards them.
	Logger hclog.Logger
}

// PodsClient lists and watches the pods of one namespace: client-go's
// corev1client.PodInterface is one; NewClient returns one.
type PodsClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Pods is the membership made of the ready pods that match a selector.
// Start it, then read Workers after each value on Changes. Its methods
// are safe for concurrent use.
type Pods struct {
	o        Options
	selector labels.Selector
	log      hclog.Logger
	informer cache.SharedIndexInformer

	started atomic.Bool
	changes chan struct{}
	kick    chan struct{}
	done    chan struct{} // closed when the goroutines Start started ended

	mu      sync.Mutex
	workers []config.Worker
}

// New checks o and returns the Pods; nothing runs before Start. A
// selector that does not parse or is empty is an error wrapping
// ErrBadSelector; a port out of range one wrapping ErrBadPort.
func New(o Options) (*Pods, error) {
	sel, err := ParseSelector(o.Selector)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Client == nil:
		return nil, errors.New("kubepods: no client")
	case o.Namespace == "":
		return nil, errors.New("kubepods: no namespace")
	case o.MaxPods < 0:
		return nil, fmt.Errorf("kubepods: MaxPods %d, want > 0 (0: %d)", o.MaxPods, DefaultMaxPods)
	}
	if err := o.Template.check(); err != nil {
		return nil, err
	}
	if o.MaxPods == 0 {
		o.MaxPods = DefaultMaxPods
	}
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Template.Role == "" {
		o.Template.Role = shared.RoleAggregated
	}
	o.Template.Models = slices.Clone(o.Template.Models)
	pods := o.Client
	selector := sel.String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, lo metav1.ListOptions) (runtime.Object, error) {
			lo.LabelSelector = selector
			return pods.List(ctx, lo)
		},
		WatchFuncWithContext: func(ctx context.Context, lo metav1.ListOptions) (watch.Interface, error) {
			lo.LabelSelector = selector
			return pods.Watch(ctx, lo)
		},
	}
	// A plain list then watch, which every API server (and the fake
	// clientset) serves, rather than a streamed list: one namespace's
	// selected pods are a small list.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, noWatchList{}), &corev1.Pod{}, 0, cache.Indexers{})
	// Only what makes a pod a worker is kept in the cache.
	if err := inf.SetTransform(trim); err != nil {
		return nil, err
	}
	p := &Pods{
		o: o, selector: sel, log: o.Logger.Named("pods"), informer: inf,
		changes: make(chan struct{}, 1), kick: make(chan struct{}, 1), done: make(chan struct{}),
	}
	kick := func() {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}); err != nil {
		return nil, err
	}
	return p, nil
}

// ParseSelector parses a label selector in Kubernetes' syntax
// (labels.Parse). An empty one, which would select every pod, is refused;
// errors wrap ErrBadSelector.
func ParseSelector(s string) (labels.Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: empty; name the pods' labels, such as app=vllm", ErrBadSelector)
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrBadSelector, s, err)
	}
	if sel.Empty() {
		return nil, fmt.Errorf("%w %q: it selects every pod; name the pods' labels, such as app=vllm", ErrBadSelector, s)
	}
	return sel, nil
}

// check checks t's ports and role.
func (t Template) check() error {
	for _, p := range []struct {
		name     string
		v        int
		optional bool
	}{{"port", t.Port, false}, {"KV events port", t.KVEventsPort, true}, {"KV events replay port", t.KVEventsReplayPort, true}} {
		if (p.v != 0 || !p.optional) && (p.v < 1 || p.v > 65535) {
			return fmt.Errorf("kubepods: %s %d: %w", p.name, p.v, ErrBadPort)
		}
	}
	if t.Role != "" && !t.Role.Valid() {
		return fmt.Errorf("kubepods: role %q: want %q, %q or %q", t.Role, shared.RoleAggregated, shared.RolePrefill, shared.RoleDecode)
	}
	for i, m := range t.Models {
		if strings.TrimSpace(m) == "" || slices.Contains(t.Models[:i], m) {
			return fmt.Errorf("kubepods: models %q: want distinct, non-empty names", t.Models)
		}
	}
	if t.Models != nil && len(t.Models) == 0 {
		return errors.New("kubepods: an empty models list (nil: from each engine)")
	}
	if t.KVEventsPort == 0 && t.KVEventsReplayPort != 0 {
		return errors.New("kubepods: a KV events replay port without a KV events port")
	}
	return nil
}

// Start lists the pods, waits until the list is in (or ctx ends: then it
// returns ctx's error; an unreachable API server is retried until then),
// and keeps watching them until ctx ends: ctx is the watch's life, not
// only Start's. Done is closed once the watch stopped. Workers holds the first list's workers
// when Start returns nil. Start runs once.
func (p *Pods) Start(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("kubepods: Start called twice")
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.informer.RunWithContext(ctx) })
	synced := cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced)
	if synced {
		p.update()
		wg.Go(func() { p.coalesce(ctx) })
	}
	go func() {
		wg.Wait()
		close(p.done)
	}()
	if !synced {
		return fmt.Errorf("kubepods: listing the pods of namespace %s: %w", p.o.Namespace, context.Cause(ctx))
	}
	p.log.Info("watching pods", "namespace", p.o.Namespace, "selector", p.selector.String(), "workers", len(p.Workers()))
	return nil
}

// Done is closed once the goroutines of Start ended (after its ctx
// ended).
func (p *Pods) Done() <-chan struct{} { return p.done }

// Changes receives a value after the workers changed (one value for any
// number of changes not yet read); read Workers then.
func (p *Pods) Changes() <-chan struct{} { return p.changes }

// Workers returns the current workers, sorted by name: one per matching
// pod that is Running, Ready, has an IP and is not being deleted, at most
// MaxPods. The caller may keep and modify the slice.
func (p *Pods) Workers() []config.Worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]config.Worker, len(p.workers))
	for i, w := range p.workers {
		w.Models = slices.Clone(w.Models)
		w.Labels = maps.Clone(w.Labels)
		if w.KVEvents != nil {
			k := *w.KVEvents
			w.KVEvents = &k
		}
		out[i] = w
	}
	return out
}

// coalesce recomputes the workers after pod events, at most once per
// Debounce however many events come, until ctx ends.
func (p *Pods) coalesce(ctx context.Context) {
	t := time.NewTimer(0)
	<-t.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		t.Reset(p.o.Debounce)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		// The events of the wait are in this recomputation.
		select {
		case <-p.kick:
		default:
		}
		p.update()
	}
}

// update recomputes the workers from the informer's cache and signals
// Changes when they changed. Linear in the pods cached, plus a sort.
func (p *Pods) update() {
	objs := p.informer.GetStore().List()
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok && p.member(pod) {
			pods = append(pods, pod)
		}
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	if len(pods) > p.o.MaxPods {
		p.log.Error("more ready pods match the selector than the router takes; those after the first by name are left out",
			"namespace", p.o.Namespace, "selector", p.selector.String(), "ready_pods", len(pods), "max", p.o.MaxPods,
			"first_left_out", pods[p.o.MaxPods].Name)
		pods = pods[:p.o.MaxPods]
	}
	ws := make([]config.Worker, len(pods))
	for i, pod := range pods {
		ws[i] = p.worker(pod)
	}
	p.mu.Lock()
	same := slices.EqualFunc(ws, p.workers, config.Worker.Equal)
	if !same {
		p.workers = ws
	}
	p.mu.Unlock()
	if same {
		return
	}
	p.log.Debug("pod workers changed", "workers", len(ws))
	select {
	case p.changes <- struct{}{}:
	default:
	}
}

// member reports whether pod is a worker: in the namespace, matching the
// selector (the server filters too; this keeps a lax server honest),
// Running, Ready, with an IP, not being deleted, and named as a worker
// may be (a pod named "default" is not).
func (p *Pods) member(pod *corev1.Pod) bool {
	if pod.Namespace != p.o.Namespace || !p.selector.Matches(labels.Set(pod.Labels)) ||
		pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" ||
		net.ParseIP(pod.Status.PodIP) == nil {
		return false
	}
	if err := catalog.ValidName(pod.Name); err != nil {
		p.log.Warn("pod left out: its name is not a valid worker name", "pod", pod.Name, "error", err)
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// worker is pod's worker from the template.
func (p *Pods) worker(pod *corev1.Pod) config.Worker {
	t := p.o.Template
	ip := pod.Status.PodIP
	u := "http://" + net.JoinHostPort(ip, strconv.Itoa(t.Port))
	w := config.Worker{
		Name: pod.Name, URL: u, MetricsURL: u + "/metrics", Role: t.Role,
		Models: slices.Clone(t.Models),
		// The pod's labels, for plugins that declare LABELS (the router's
		// own keys, shared.WorkerLabels, win over a pod label of the same
		// key). Kubernetes bounds them: 253+1+63-byte keys, 63-byte values.
		Labels: maps.Clone(pod.Labels),
	}
	if t.KVEventsPort != 0 {
		w.KVEvents = &config.KVEvents{Endpoint: "tcp://" + net.JoinHostPort(ip, strconv.Itoa(t.KVEventsPort)), Topic: t.KVEventsTopic}
		if t.KVEventsReplayPort != 0 {
			w.KVEvents.ReplayEndpoint = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(t.KVEventsReplayPort))
		}
	}
	return w
}

// trim keeps of a pod only what member and worker read, so the cache of
// a large namespace stays small.
func trim(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown tombstone
	}
	conds := make([]corev1.PodCondition, 0, 1)
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			conds = append(conds, corev1.PodCondition{Type: c.Type, Status: c.Status})
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Labels: pod.Labels,
			ResourceVersion: pod.ResourceVersion, DeletionTimestamp: pod.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP, Conditions: conds},
	}, nil
}

// noWatchList tells an informer not to stream its lists
// (cache.ToListWatcherWithWatchListSemantics).
type noWatchList struct{}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// The pods client's scheme: core/v1 alone, not client-go's scheme of
// every API group (which doubles bin/router's size).
var (
	podScheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		utilruntime.Must(corev1.AddToScheme(s))
		return s
	}()
	podCodecs = serializer.NewCodecFactory(podScheme)
	podParams = runtime.NewParameterCodec(podScheme)
)

// NewClient returns a client of the pods of namespace ns: configured from
// the kubeconfig file at path when path is not ""; else from the pod's
// service account when running in a cluster; else from $KUBECONFIG (or
// ~/.kube/config), as kubectl does.
func NewClient(path, ns string) (PodsClient, error) {
	var (
		cfg *rest.Config
		err error
	)
	switch {
	case path != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	default:
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	// As client-go's core/v1 client sets its REST client up.
	cfg.APIPath = "/api"
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.NegotiatedSerializer = podCodecs.WithoutConversion()
	cfg.UserAgent = "switchyard-router"
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return &restPods{c: rc, ns: ns}, nil
}

// restPods is a PodsClient over the API server's REST API, as client-go's
// typed client calls it.
type restPods struct {
	c  rest.Interface
	ns string
}

func (p *restPods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	err := p.c.Get().Namespace(p.ns).Resource("pods").VersionedParams(&opts, podParams).
		Timeout(timeoutOf(opts)).Do(ctx).Into(out)
	return out, err
}

func (p *restPods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return p.c.Get().Namespace(p.ns).Resource("pods").VersionedParams(&opts, podParams).
		Timeout(timeoutOf(opts)).Watch(ctx)
}

// timeoutOf is opts' TimeoutSeconds; 0 when unset.
func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// DefaultNamespace is the namespace the router's pod runs in (read from
// ServiceAccountNamespaceFile), or "default" outside a cluster.
func DefaultNamespace() string {
	b, err := os.ReadFile(ServiceAccountNamespaceFile)
	if ns := strings.TrimSpace(string(b)); err == nil && ns != "" && len(ns) <= 253 {
		return ns
	}
	return "default"
}
