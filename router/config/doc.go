// Package config loads Switchyard policy files: HCL documents that declare
// the router settings, plugin binaries, policies (filters, scorers, a picker
// and a fallback), which policy serves each worker role, and an optional
// request classifier. See docs/policy-file.md for the file format.
//
// Load decodes a file against a catalog of component types in these steps,
// after Caddy's module lifecycle:
//
//  1. strict structural decode: unknown blocks and attributes are errors;
//  2. with a PluginHost (LoadWith, Options.Plugins), each plugin block is
//     started and the types it declares are registered in a clone of the
//     catalog, never in the caller's;
//  3. per component, the attributes other than type and weight are decoded
//     against the parameter schema its type declares (hcldec), so misspelt
//     parameters get HCL's own "Did you mean" suggestions;
//  4. names are resolved: fallbacks (with cycle detection), worker roles,
//     the built-in default policy, and which roles reach each policy;
//  5. each policy is instantiated once per role reaching it: the schema's
//     defaults are applied and the type's constructor (for a plugin type,
//     the plugin's Configure) validates the values; a refused parameter is
//     reported at its attribute.
//
// Every problem is an *hcl.Diagnostic with a Subject range, reported once,
// and Load reports all of them rather than stopping at the first.
// FormatDiagnostics renders them one per line as
// "file:line:col: error: summary; detail".
package config
