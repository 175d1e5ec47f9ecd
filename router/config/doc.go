// Package config loads Switchyard policy files: HCL documents that declare
// the router settings, plugin binaries, policies (filters, scorers, a picker
// and a fallback), which policy serves each worker role, and an optional
// request classifier. See docs/policy-file.md for the file format.
//
// Load decodes a file against a catalog of component types in four steps,
// after Caddy's module lifecycle:
//
//  1. strict structural decode: unknown blocks and attributes are errors;
//  2. per component, the attributes other than type and weight are decoded
//     against the parameter schema its type declares (hcldec), so misspelt
//     parameters get HCL's own "Did you mean" suggestions;
//  3. the schema's defaults are applied and the type's constructor validates
//     the values; a refused parameter is reported at its attribute;
//  4. names are resolved: fallbacks (with cycle detection), worker roles, and
//     the built-in default policy.
//
// Every problem is an *hcl.Diagnostic with a Subject range, and Load reports
// all of them rather than stopping at the first. FormatDiagnostics renders
// them one per line as "file:line:col: error: summary; detail".
package config
