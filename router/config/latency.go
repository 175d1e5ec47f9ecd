package config

import (
	"strings"
	"time"
)

// ReplayDecisionLatency is the simulated time one decision of the policy
// named policy spends in plugin calls, as router replay charges it: the
// replay_decision_latency of the plugin of each call the decision makes.
// Consecutive components served by one plugin are one call (the pipeline
// fuses them into one Decide message: filters, then scorers, then the
// picker, in declared order); built-in components and unavailable
// placeholders (a plugin that failed to start) make none. 0 for a policy
// of built-in components only and for a name the file does not declare (a
// picker-type fallback is built in). The policy's fallback is not
// included: it runs only when the policy fails, and is charged then.
func (b *Bundle) ReplayDecisionLatency(policy string) time.Duration {
	for _, d := range b.Decls {
		if d.Name != policy {
			continue
		}
		var sum time.Duration
		prev := ""
		for _, c := range d.Components {
			src := b.callSource(c)
			if src != "" && src != prev {
				sum += b.pluginLatency(src)
			}
			prev = src
		}
		return sum
	}
	return 0
}

// ReplayClassifierLatency is the simulated time router replay charges for
// each call of the request classifier: its plugin's
// replay_decision_latency when the classifier runs out of process, else 0.
func (b *Bundle) ReplayClassifierLatency() time.Duration {
	if b.Classifier == nil {
		return 0
	}
	return b.pluginLatency(b.callSource(b.Classifier))
}

// callSource is the name of the plugin a call of c goes to, "" when c
// makes no plugin call (built in, or an unavailable placeholder).
func (b *Bundle) callSource(c *Component) string {
	if !c.OutOfProcess || c.Unavailable {
		return ""
	}
	name, _ := strings.CutPrefix(c.Source, "plugin ")
	return name
}

// pluginLatency is the replay_decision_latency of the plugin called name;
// 0 for "" or an undeclared name.
func (b *Bundle) pluginLatency(name string) time.Duration {
	if name == "" {
		return 0
	}
	for i := range b.Plugins {
		if b.Plugins[i].Name == name {
			return b.Plugins[i].ReplayDecisionLatency
		}
	}
	return 0
}
