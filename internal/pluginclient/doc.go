// Package pluginclient is the router's side of the switchyard.plugin.v1
// connection: the client (Client) that the supervisor dispenses from each
// plugin process through go-plugin (PluginSets), and the Go shapes of its
// calls (Task, TaskResult, ConfigureRequest, ClassifyCall...). Plugin
// authors never see it: they import the SDK, package shared, which serves
// their components (shared.Serve); the Go internal rule keeps this package
// out of other modules, as Nomad keeps its plugin clients unexported.
//
// Decide calls share one long-lived bidirectional stream and are batched
// under load without a timer: every task that queues while a DecideBatch is
// being sent goes out in the next one (Options.DecideBatch observes the
// batch sizes). Classify is a unary call; lifecycle events go out on a
// second stream, batched and acknowledged (SendEvents).
//
// What both ends must agree on beyond the generated protocol (parameter
// values, the wording of the SDK's panic and over-size answers) is in
// package pluginwire of the SDK module (shared/pluginwire).
package pluginclient
