// Package loader reads a policy file into what a Router decides with:
// LoadBundle resolves the file against the catalog (router/config), starts
// and configures its plugins under a plugin Host of their own
// (router/supervisor) and compiles each role's policy into a
// router.Bundle; the returned Bundle also answers what the rest of the
// file says (workers, queue, classifier, cluster, the plugins' state,
// replay's simulated plugin latency). A Reloader swaps a newly loaded
// file into a running Router (Router.Apply), drains the old bundle and
// stops its plugins, counting switchyard_policy_reloads_total.
//
// Every command that runs a policy file loads it here (`router validate`,
// `replay`, `serve`, `epp` and their reloads), so they accept and refuse
// the same files; `router kv-relay`, which needs only the cluster and
// worker blocks, reads them with config.LoadClusterWorkers, starting no
// plugin.
//
// Floors: loader imports the selection core (router) and its parts
// (router/config, router/catalog, router/supervisor, router/policy); the
// core never imports it. What decides when to reload (SIGHUP, the policy
// file's watch) is the live runtime's wiring above it.
package loader
