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
func (f *PolicyFile) ReplayDecisionLatency(policy string) time.Duration {
	for _, d := range f.Decls {
		if d.Name != policy {
			continue
		}
		var sum time.Duration
		prev := ""
		for _, c := range d.Components {
			src := f.callSource(c)
			if src != "" && src != prev {
				sum += f.pluginLatency(src)
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
func (f *PolicyFile) ReplayClassifierLatency() time.Duration {
	if f.Classifier == nil {
		return 0
	}
	return f.pluginLatency(f.callSource(f.Classifier))
}

// callSource is the name of the plugin a call of c goes to, "" when c
// makes no plugin call (built in, or an unavailable placeholder).
func (f *PolicyFile) callSource(c *Component) string {
	if !c.OutOfProcess || c.Unavailable {
		return ""
	}
	name, _ := strings.CutPrefix(c.Source, "plugin ")
	return name
}

// pluginLatency is the replay_decision_latency of the plugin called name;
// 0 for "" or an undeclared name.
func (f *PolicyFile) pluginLatency(name string) time.Duration {
	if name == "" {
		return 0
	}
	for i := range f.Plugins {
		if f.Plugins[i].Name == name {
			return f.Plugins[i].ReplayDecisionLatency
		}
	}
	return 0
}
