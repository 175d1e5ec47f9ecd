package kubepods

import (
	"fmt"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// BenchmarkUpdate is one recomputation of the workers from the cache:
// what a burst of pod events costs once coalesced, at DefaultMaxPods
// ready pods.
func BenchmarkUpdate(b *testing.B) {
	p, err := New(Options{Client: fake.NewClientset().CoreV1().Pods(ns), Namespace: ns, Selector: "app=vllm", Template: Template{Port: 8000, KVEventsPort: 5557}})
	if err != nil {
		b.Fatal(err)
	}
	for i := range DefaultMaxPods {
		pd, _ := trim(pod(fmt.Sprintf("vllm-%04d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)))
		if err := p.informer.GetStore().Add(pd); err != nil {
			b.Fatal(err)
		}
	}
	p.update()
	if n := len(p.Workers()); n != DefaultMaxPods {
		b.Fatalf("%d workers, want %d", n, DefaultMaxPods)
	}
	b.ReportAllocs()
	for b.Loop() {
		p.update()
	}
}
