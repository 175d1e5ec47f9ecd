package shared

import (
	"testing"

	pluginv1 "github.com/switchyard-router/switchyard/shared/pluginproto/switchyard/plugin/v1"
)

func TestEventKindString(t *testing.T) {
	tests := []struct {
		k    EventKind
		want string
	}{
		{EventSent, "sent"},
		{EventFirstToken, "first_token"},
		{EventCompleted, "completed"},
		{EventAborted, "aborted"},
		{0, "unknown"},
		{EventAborted + 1, "unknown"},
	}
	for _, tt := range tests {
		if got := tt.k.String(); got != tt.want {
			t.Errorf("EventKind(%d).String() = %q, want %q", tt.k, got, tt.want)
		}
	}
}

// TestEventKindMatchesProto pins the values to the wire enum, so converters
// can cast.
func TestEventKindMatchesProto(t *testing.T) {
	pairs := []struct {
		k EventKind
		p pluginv1.EventKind
	}{
		{EventSent, pluginv1.EventKind_EVENT_KIND_SENT},
		{EventFirstToken, pluginv1.EventKind_EVENT_KIND_FIRST_TOKEN},
		{EventCompleted, pluginv1.EventKind_EVENT_KIND_COMPLETED},
		{EventAborted, pluginv1.EventKind_EVENT_KIND_ABORTED},
	}
	for _, p := range pairs {
		if int32(p.k) != int32(p.p) {
			t.Errorf("%v = %d, proto %v = %d", p.k, p.k, p.p, p.p)
		}
	}
}
