package admission

import (
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// MissWindow is how many of the latest requests with a TTFT target
// shared.SLO.MissShare covers: the requests, in the order they reached
// their first token (or ended without one after their target passed).
const MissWindow = 128

// missWindowMax bounds the window (SCREENING: the env override).
const missWindowMax = 1024

// missWindow is the TTFT outcome of the latest requests with a TTFT
// target: a ring of slots (0 empty, 1 met, 2 missed), the next slot's
// sequence number, and the count of missed slots. Lock-free: record swaps
// one slot and adjusts the count by the change, so the count equals the
// missed slots once concurrent records are done.
type missWindow struct {
	size   uint64
	any    bool // SCREENING: a miss of either target, TPOT judged at the end
	next   atomic.Uint64
	missed atomic.Int64
	slots  [missWindowMax]atomic.Uint32
}

func (w *missWindow) init() {
	w.size = MissWindow
	if v, err := strconv.Atoi(os.Getenv("SWITCHYARD_MISS_WINDOW")); err == nil && v > 0 && v <= missWindowMax {
		w.size = uint64(v)
	}
	w.any = os.Getenv("SWITCHYARD_MISS_MODE") == "any"
}

// record adds one request's outcome.
func (w *missWindow) record(missed bool) {
	v := uint32(1)
	if missed {
		v = 2
	}
	i := w.next.Add(1) - 1
	old := w.slots[i%w.size].Swap(v)
	var d int64
	if old == 2 {
		d--
	}
	if missed {
		d++
	}
	if d != 0 {
		w.missed.Add(d)
	}
}

// share is the missed share of the slots filled, 0 to 1; 0 when none is.
func (w *missWindow) share() float64 {
	n := min(w.next.Load(), w.size)
	if n == 0 {
		return 0
	}
	m := w.missed.Load()
	return min(max(float64(m)/float64(n), 0), 1)
}

// recordTTFT records h's TTFT outcome at now: at its first token, or at
// its end without one. Only for a request with a TTFT target; one without
// a first token is recorded only once its target has passed (ended
// earlier, it says nothing of the fleet). At most once per request.
func (h *Handle) recordTTFT(now time.Time, first bool) {
	t := h.req.SLO.TTFT
	if t <= 0 || h.ttftRecorded {
		return
	}
	late := now.Sub(h.start) > t
	if !first && !late {
		return
	}
	if first && !late && h.c.misses.any && h.req.SLO.TPOT > 0 {
		h.firstTok = now // judged at the end
		return
	}
	h.ttftRecorded = true
	h.c.misses.record(late)
}

// recordEnd (SCREENING, any mode): a completed request whose TTFT was met
// and that has a TPOT target records whether its mean gap met it.
func (h *Handle) recordEnd(now time.Time, contextTokens int64) {
	if h.ttftRecorded || h.firstTok.IsZero() {
		return
	}
	h.ttftRecorded = true
	out := contextTokens - int64(h.req.PromptTokens)
	late := false
	if out >= 2 {
		late = now.Sub(h.firstTok)/time.Duration(out-1) > h.req.SLO.TPOT
	}
	h.c.misses.record(late)
}
