package pluginv1_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/switchyard-router/switchyard/shared"
	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

// protocolDoc is docs/plugin-protocol.md of the repository, relative to this
// package (shared/pluginproto/switchyard/plugin/v1).
var protocolDoc = filepath.Join("..", "..", "..", "..", "..", "docs", "plugin-protocol.md")

// codeSpan matches a markdown code span.
var codeSpan = regexp.MustCompile("`([^`\n]+)`")

// protoName matches a code span that names a switchyard.plugin.v1
// identifier, by the document's convention: optionally the package, then a
// CamelCase name with at least one lower-case letter (a message, enum or
// service), then any number of `.member` (a field, oneof, enum value or
// method) or `/Method` parts. ALL_CAPS spans (environment variables,
// signals, bare enum values) and names starting in lower case (Go
// identifiers such as shared.Serve, go-plugin's plugin.GRPCController) are
// not proto names; the document writes enum values as `Kind.KIND_FILTER`.
var protoName = regexp.MustCompile(`^(switchyard\.plugin\.v1\.)?[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*([./][A-Za-z_][A-Za-z0-9_]*)*$`)

// apiVersionLine is the document's statement of the API version it
// describes.
var apiVersionLine = regexp.MustCompile(`This document describes API version (\d+)\b`)

// resolve reports whether name (without the package prefix) names a
// service, method, message, field, oneof, enum or enum value of fd, and
// returns the full name of what it resolved to. A bare CamelCase name that
// is no message, enum or service may name an RPC (`Decide`).
func resolve(fd protoreflect.FileDescriptor, name string) (protoreflect.FullName, error) {
	parts := strings.FieldsFunc(name, func(r rune) bool { return r == '.' || r == '/' })
	top, rest := parts[0], parts[1:]
	if s := fd.Services().ByName(protoreflect.Name(top)); s != nil {
		if len(rest) == 0 {
			return s.FullName(), nil
		}
		if len(rest) == 1 {
			if m := s.Methods().ByName(protoreflect.Name(rest[0])); m != nil {
				return m.FullName(), nil
			}
		}
		return "", fmt.Errorf("service %s has no method %q", s.FullName(), strings.Join(rest, "."))
	}
	if e := fd.Enums().ByName(protoreflect.Name(top)); e != nil {
		if len(rest) == 0 {
			return e.FullName(), nil
		}
		if len(rest) == 1 {
			if v := e.Values().ByName(protoreflect.Name(rest[0])); v != nil {
				return v.FullName(), nil
			}
		}
		return "", fmt.Errorf("enum %s has no value %q", e.FullName(), strings.Join(rest, "."))
	}
	m := fd.Messages().ByName(protoreflect.Name(top))
	if m == nil && len(rest) == 0 {
		// A bare RPC name (`Decide`) is a method of the file's service.
		svcs := fd.Services()
		for i := range svcs.Len() {
			if md := svcs.Get(i).Methods().ByName(protoreflect.Name(top)); md != nil {
				return md.FullName(), nil
			}
		}
	}
	if m == nil {
		return "", fmt.Errorf("no service, method, message or enum %q", top)
	}
	full := m.FullName()
	for i, p := range rest {
		if f := m.Fields().ByName(protoreflect.Name(p)); f != nil {
			full = f.FullName()
			// A field of message type may be followed by its own fields.
			if f.Message() != nil && i < len(rest)-1 && !f.IsMap() {
				m = f.Message()
				continue
			}
			if i < len(rest)-1 {
				return "", fmt.Errorf("field %s has no member %q", f.FullName(), rest[i+1])
			}
			break
		}
		if o := m.Oneofs().ByName(protoreflect.Name(p)); o != nil && i == len(rest)-1 {
			full = o.FullName()
			break
		}
		return "", fmt.Errorf("message %s has no field %q", m.FullName(), p)
	}
	return full, nil
}

// TestProtocolDocNamesExist checks docs/plugin-protocol.md against the
// compiled plugin.proto: every proto identifier the document names in a
// code span exists (a misspelt field fails the test), the document names
// every RPC and message of the protocol, and the API version it states is
// the SDK's shared.APIVersion.
func TestProtocolDocNamesExist(t *testing.T) {
	b, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	fd := pluginv1.File_switchyard_plugin_v1_plugin_proto

	m := apiVersionLine.FindStringSubmatch(doc)
	if m == nil {
		t.Errorf("%s does not say %q", protocolDoc, "This document describes API version N")
	} else if m[1] != fmt.Sprint(shared.APIVersion) {
		t.Errorf("%s describes API version %s; the SDK speaks %d (shared.APIVersion)", protocolDoc, m[1], shared.APIVersion)
	}

	named := make(map[protoreflect.FullName]bool)
	checked := 0
	for i, line := range strings.Split(doc, "\n") {
		for _, sm := range codeSpan.FindAllStringSubmatch(line, -1) {
			span := sm[1]
			if !protoName.MatchString(span) {
				continue
			}
			checked++
			full, err := resolve(fd, strings.TrimPrefix(span, string(fd.Package())+"."))
			if err != nil {
				t.Errorf("%s:%d: `%s`: %v", protocolDoc, i+1, span, err)
				continue
			}
			named[full] = true
		}
	}
	t.Logf("%d proto names checked, %d distinct", checked, len(named))

	svcs := fd.Services()
	for i := range svcs.Len() {
		ms := svcs.Get(i).Methods()
		for j := range ms.Len() {
			if !named[ms.Get(j).FullName()] {
				t.Errorf("%s never names the RPC %s", protocolDoc, ms.Get(j).FullName())
			}
		}
	}
	msgs := fd.Messages()
	for i := range msgs.Len() {
		md := msgs.Get(i)
		if !named[md.FullName()] && !namedMember(named, md.FullName()) {
			t.Errorf("%s never names the message %s", protocolDoc, md.FullName())
		}
		fs := md.Fields()
		for j := range fs.Len() {
			if !named[fs.Get(j).FullName()] {
				t.Errorf("%s never names the field %s", protocolDoc, fs.Get(j).FullName())
			}
		}
	}
}

// namedMember reports whether some member of msg was named.
func namedMember(named map[protoreflect.FullName]bool, msg protoreflect.FullName) bool {
	for n := range named {
		if strings.HasPrefix(string(n), string(msg)+".") {
			return true
		}
	}
	return false
}

// TestResolveRejectsMisspellings keeps the document check honest: a
// misspelt field, method or enum value does not resolve.
func TestResolveRejectsMisspellings(t *testing.T) {
	fd := pluginv1.File_switchyard_plugin_v1_plugin_proto
	for _, name := range []string{"DecideResult.kept", "Plugin/Decide", "Plugin.Classify", "Kind.KIND_PICKER", "Events",
		"DecideTask.request.block_hashes", "Value.kind", "ClassifyRequest.events_through"} {
		if _, err := resolve(fd, name); err != nil {
			t.Errorf("resolve(%q): %v", name, err)
		}
	}
	for _, name := range []string{"DecideResult.keep", "Plugin/Decides", "Kind.KIND_ROUTER", "Nope", "Decides",
		"DecideTask.request.block_hash", "DecideResult.kept.x", "ClassifyRequest.event_through"} {
		if full, err := resolve(fd, name); err == nil {
			t.Errorf("resolve(%q) = %s, want an error", name, full)
		}
	}
	if !protoName.MatchString("switchyard.plugin.v1.DecideResult.kept") || protoName.MatchString("SWITCHYARD_PLUGIN") ||
		protoName.MatchString("shared.Serve") {
		t.Error("protoName does not follow the document's convention")
	}
}
