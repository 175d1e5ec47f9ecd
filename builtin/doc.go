// Package builtin holds Switchyard's built-in component types: the
// round-robin, random, least-loaded, power-of-two and min-cost pickers, the
// kv-affinity and kv-cost scorers, the busy filter, and the header-priority,
// session-affinity and prompt-length-class request classifiers. README.md
// documents each type's
// formula, inputs and parameters; router/catalog registers them.
//
// Every instance is safe for concurrent use. Randomised types own their
// generator (see the seed parameter); none shares a global one.
package builtin
