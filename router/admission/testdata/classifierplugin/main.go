// Command classifierplugin serves the router's built-in request
// classifiers out of process, for the admission package's parity test
// (classifier_parity_test.go): session-affinity, prompt-length-class and
// header-priority, each unchanged but for its name, which gets the prefix
// "oop-" (a plugin may not declare a built-in type's name).
package main

import (
	"github.com/switchyard-router/switchyard/builtin"
	"github.com/switchyard-router/switchyard/shared"
)

func main() {
	types := []shared.TypeInfo{builtin.SessionAffinityType(), builtin.PromptLengthClassType(), builtin.HeaderPriorityType()}
	for i := range types {
		types[i].Name = "oop-" + types[i].Name
	}
	shared.Serve(shared.ServeOpts{Version: "test", Types: types})
}
