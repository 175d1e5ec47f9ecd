// Package plugincheck is the conformance check of a plugin binary against
// the plugin protocol (docs/plugin-protocol.md, section 9): what
// `router plugins check` runs and what package plugintest runs inside
// `go test`.
//
// Run starts the binary as the router launches it (router/supervisor),
// then checks the handshake, the schema Describe declares (type names by
// the policy loader's own rule, catalog.ValidName, and no built-in type's
// name; no parameter the policy file's block reserves, no non-finite NUMBER
// default: catalog.ValidParam), Configure (defaults, parameters at their
// type's boundaries, a value of the wrong type, instance inputs within the
// type's), Decide through the router's own client (1, 8 and 4,096 rows, ids
// above 2^53, concurrent calls; only the columns the instance declared, as
// the router's pipeline allocates them) and directly on the wire (several
// tasks in one DecideBatch, answered in any order, with every column set;
// several Decide streams at once),
// latency against call_timeout (a warning, never a failure), Classify and
// Events for the types that declare them, health, the exit at Shutdown,
// stdout after the handshake, and, with a second copy of the plugin, the
// exit and the socket directory's removal when its parent dies. Once the
// plugin process is gone (it is not restarted), the first failure says
// how it went and the checks that need it are reported skipped.
//
// Parent death needs a parent that can be killed: Run re-executes the
// current executable (os.Executable) with the environment variable
// ParentEnv set, and this package's init function turns that process into
// the plugin's parent (it starts the plugin with router/supervisor, prints
// its pid and socket directory, and waits to be killed). Any binary that
// links this package, the router or a `go test` binary importing
// plugintest, can therefore serve as the parent; nothing has to be
// built.
package plugincheck
