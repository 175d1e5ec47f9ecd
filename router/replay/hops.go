package replay

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/router/prefix"
	"github.com/switchyard-router/switchyard/router/replay/report"
	"github.com/switchyard-router/switchyard/router/sim"
	"github.com/switchyard-router/switchyard/shared"
)

// A request's hops, as admission.Path walks them: each hop is admitted
// (classified, placed, or queued until capacity frees), sent to its
// worker after the decision latency (and, for a decode hop, the prompt's
// KV transfer), told its first token, and ended when its worker completes
// it (Handle.End with admission.Completed) or when it fails. The request
// is over when a hop that admission.Hop.Ends completes.

// arrive admits the next request of the trace, arriving now, for its
// first hop, and takes the record after it.
func (d *driver) arrive() error {
	rec, i := d.arriving, d.next
	if i == 0 {
		d.firstArrival = rec.Arrival
	}
	d.next++
	st := &request{rec: rec}
	d.reqs = append(d.reqs, st)
	now := rec.Arrival
	prompt, hit := d.ref.add(rec)
	d.tl.arrival(now, prompt, hit)
	d.now = now
	st.arrival = now
	st.out = Outcome{Index: i, ArrivalMs: report.Millis(now), Worker: -1, InputLength: rec.InputLength, OutputLength: rec.OutputLength}
	if d.decode != nil {
		st.out.DecodeWorker = -1
	}
	h, err := d.admit(i, firstHop)
	var cl shared.Classification
	if h != nil {
		cl = h.Classification()
	}
	d.classified(i, &cl)
	d.admitted(i, firstHop, h, err, now)
	return d.take()
}

// admit admits hop k of request i at d.now.
func (d *driver) admit(i, k int) (*admission.Handle, error) {
	d.deliver(d.now)
	t0 := time.Now()
	h, err := d.replicaOf(i).adm.Admit(d.ctx, d.request(i, k))
	d.decisionTime += time.Since(t0)
	d.decisions++
	return h, err
}

// request is the request hop k of trace request i admits
// (admission.Hop.Request): its id (with DecodeIDSuffix for the decode
// hop), prompt tokens, chained block hashes when the hop carries them,
// session and classifier metadata.
func (d *driver) request(i, k int) *shared.Request {
	rec := d.req(i).rec
	hop := d.path.Hop(k)
	base := shared.Request{ID: strconv.Itoa(i), PromptTokens: rec.InputLength, BlockSize: d.blockSize, SessionID: rec.SessionID}
	if k == decodeHop {
		base.ID += DecodeIDSuffix
	}
	if hop.PrefixHashes {
		base.BlockHashes = prefix.ChainHashes(make([]uint64, 0, len(rec.HashIDs)), rec.HashIDs)
		if d.kv != nil {
			// The simulated engines' block hashes are these (KVEvent.Hash).
			base.Prompt = &prefix.HashKey{Hashes: base.BlockHashes, BlockSize: d.blockSize}
		}
	}
	if rec.HasPriority || rec.PolicyClass != "" {
		base.Metadata = make(map[string]string, 2)
		if rec.HasPriority {
			base.Metadata[MetadataPriority] = strconv.Itoa(rec.Priority)
		}
		if rec.PolicyClass != "" {
			base.Metadata[MetadataPolicyClass] = rec.PolicyClass
		}
	}
	return hop.Request(&base)
}

// admitted records the admission of hop k of request i at `at`: refused
// (h may be an ended handle), queued, or placed.
func (d *driver) admitted(i, k int, h *admission.Handle, err error, at time.Duration) {
	hp := &d.req(i).hops[k]
	switch {
	case err != nil:
		d.reject(i, k, rejectReason(err, i, k))
	case h.Queued():
		hp.h, hp.queued = h, true
		d.waiting++
		d.tl.queue(at, d.waiting)
		if k == decodeHop {
			d.decodeWaiting++
		}
	default:
		hp.h = h
		dec := h.Decision()
		d.placed(i, k, &dec, at)
	}
}

// classified records request i's classification in its outcome.
func (d *driver) classified(i int, cl *shared.Classification) {
	st := d.req(i)
	st.priority, st.class = cl.Priority, cl.PolicyClass
	if st.class == "" {
		st.class = d.defaultClass
	}
	if d.classify {
		st.out.Priority = &st.priority
		st.out.PolicyClass = st.class
	}
}

// placed records hop k of request i, placed by dec at `at`, and sends it
// on its way: a first hop reaches its worker after the decision latency
// (at once when there is none), a decode hop after the decision latency
// and its prompt's KV transfer. The decode worker is chosen before the
// transfer (the KV needs a destination), so its booking covers the
// transfer too.
func (d *driver) placed(i, k int, dec *router.Decision, at time.Duration) {
	st := d.req(i)
	rec, out := st.rec, &st.out
	id := d.indexOf(dec.Worker.ID)
	st.hops[k].worker = int32(id - d.base[k])
	out.Fallback = out.Fallback || dec.Fallback
	canaryPlaced(st, dec)
	d.selected(d.policy[k], dec)
	d.mirrorPlaced(i, k, dec.Worker.ID, at)
	charge := d.chargeFor(k, dec)
	if charge > 0 {
		st.charged += charge
		out.DecisionMs = report.Millis(st.charged)
	}
	if k == firstHop {
		out.Worker = id
		out.OverlapBlocks = dec.OverlapBlocks
		if sh := dec.Shadow; sh.Result != "" {
			out.Shadow = string(sh.Result)
			if sh.Result == router.ShadowAgree || sh.Result == router.ShadowDisagree {
				w := d.indexOf(sh.Worker)
				out.ShadowWorker = &w
			}
		}
		if charge == 0 {
			d.submit(i, k, at)
		} else {
			d.starts.Push(due{at: at + charge, index: i})
		}
		return
	}
	out.DecodeWorker = id
	xfer := KVTransferTime(max(rec.InputLength, 1), d.bandwidth)
	out.KVTransferMs = report.Millis(xfer)
	d.transfers.Push(due{at: at + charge + xfer, index: i})
}

// chargeFor is the decision latency of hop k's placement dec (see
// Options.DecisionLatency).
func (d *driver) chargeFor(k int, dec *router.Decision) time.Duration {
	c := d.classifierCharge
	if !dec.Target {
		c += d.charge[k]
	}
	if dec.Fallback {
		c += d.policyCharge[dec.Policy]
	}
	return c
}

// selected counts a selection that placed a request, by policy (the
// role's), tallies its cause when its fallback decided, and counts its
// shadow's result.
func (d *driver) selected(policy string, dec *router.Decision) {
	d.selections++
	if dec.Fallback {
		d.fell.add(policy, dec.FallbackCause)
	}
	if r := dec.Shadow.Result; r != "" {
		if d.shadow == nil {
			d.shadow = make(map[router.ShadowResult]int64)
		}
		d.shadow[r]++
		if r == router.ShadowFailed && d.shadowFirstErr == "" && dec.Shadow.Err != nil {
			d.shadowFirstErr = dec.Shadow.Err.Error()
		}
	}
}

// submit sends hop k of request i to its worker at `at`: the prompt (at
// least 1 token) with its block hashes, to generate the first token
// (prefill) or the whole output; a decode hop's prompt KV was transferred.
// A worker that refuses it ends the hop.
func (d *driver) submit(i, k int, at time.Duration) {
	st := d.req(i)
	rec, hp := st.rec, &st.hops[k]
	hop := d.path.Hop(k)
	r := sim.Request{ID: i, InputLength: max(rec.InputLength, 1), OutputLength: hop.OutputTokens(rec.OutputLength),
		KVTransferred: k == decodeHop, Generated: st.generated}
	if hop.PrefixHashes {
		r.PrefixHashes, r.PrefixBlockTokens = hp.h.Request().BlockHashes, d.blockSize
	}
	c, w := d.clusters[k], int(hp.worker)
	if d.faults.isDown(d.base[k] + w) {
		// Placed before its worker failed, on its way since: cut before
		// it reached the engine.
		d.cut(i, st.generated, d.base[k]+w, at)
		return
	}
	if err := c.Submit(at, w, &r); err != nil {
		d.now = at
		d.end(i, k, admission.Aborted(err.Error())) // releases the booking
		d.reject(i, k, err.Error())
	}
	d.observe(c, w, d.base[k]+w, at)
}

// end ends hop k of request i with o, once.
func (d *driver) end(i, k int, o admission.Outcome) {
	hp := &d.req(i).hops[k]
	if hp.h != nil {
		hp.h.End(o)
		hp.h = nil
		d.mirrorReleased(i, k, d.now)
	}
}

// RejectNoHeadroom is the rejection reason (Outcome.Status "rejected:
// ...", Report.RejectionReasons) of a request refused because no worker
// was predicted to meet its latency targets and its on_miss is reject (a
// *shared.NoHeadroomError): one reason, whatever the predictions.
const RejectNoHeadroom = "slo_no_headroom: no worker predicted to meet the latency targets"

// rejectReason is the rejection reason of hop k of request i's admission
// error: its text, but RejectNoHeadroom for a *shared.NoHeadroomError. The
// reason must read the same for every request refused alike, since
// Report.RejectionReasons counts by it: admission's own errors name no
// request, and a `request "ID": ` naming the hop's id that a plugin
// classifier's answer may carry (the SDK's words) is cut out.
func rejectReason(err error, i, k int) string {
	var nh *shared.NoHeadroomError
	if errors.As(err, &nh) {
		return RejectNoHeadroom
	}
	id := strconv.Itoa(i)
	if k == decodeHop {
		id += DecodeIDSuffix
	}
	return strings.ReplaceAll(err.Error(), "request "+strconv.Quote(id)+": ", "")
}

// reject marks request i rejected at hop k for reason: it is over.
func (d *driver) reject(i, k int, reason string) {
	status := "rejected: "
	if k == decodeHop {
		status += "decode: "
	}
	st := d.req(i)
	st.out.Status = status + reason
	st.done = true
}

// handleFirst feeds back one event of an aggregated or prefill worker:
// the first token ends the request's booked prefill; completion ends the
// hop (releasing its booking) and, when the request has more to generate,
// admits its decode hop.
func (d *driver) handleFirst(e sim.Event) {
	i := e.RequestID
	st := d.req(i)
	defer d.observe(d.first, e.Worker, e.Worker, e.At)
	d.now = e.At
	switch e.Kind {
	case sim.FirstToken:
		if st.cutPending {
			d.continued(st, e.At, e.CachedTokens)
			if st.generated > 0 {
				// The client had its first token from an engine that
				// failed since: only the booking's prefill ends.
				st.hops[firstHop].h.FirstToken()
				d.mirrorFirstToken(i, firstHop, e.At)
				return
			}
		}
		out := &st.out
		out.TTFTMs = report.Millis(e.At - st.arrival)
		out.CachedTokens = e.CachedTokens
		out.QueueMs = report.Millis(e.ScheduledAt - st.arrival)
		d.tl.firstToken(e.At, st.rec.InputLength, e.CachedTokens)
		h := st.hops[firstHop].h
		h.FirstToken() // ends the booked prefill
		d.mirrorFirstToken(i, firstHop, e.At)
		if dec := h.Decision(); dec.Canary != nil {
			d.replicaOf(i).r.CanaryTTFT(dec, e.At-st.arrival)
		}
	case sim.Completed:
		if d.completed(i, firstHop, e.At) {
			return
		}
		h, err := d.admit(i, decodeHop)
		d.admitted(i, decodeHop, h, err, e.At)
	}
}

// handleDecode feeds back decode workers' events: completion ends the
// hop and the request, and dispatches the decode hops waiting for the
// capacity it freed.
func (d *driver) handleDecode(events []sim.Event) {
	for _, e := range events {
		i := e.RequestID
		d.observe(d.decode, e.Worker, d.base[decodeHop]+e.Worker, e.At)
		d.now = e.At
		switch e.Kind {
		case sim.FirstToken:
			st := d.req(i)
			h := st.hops[decodeHop].h
			h.FirstToken() // books no prefill; marks the state
			d.mirrorFirstToken(i, decodeHop, e.At)
			if dec := h.Decision(); dec.Canary != nil {
				// The decode role's canary: the answer's first token
				// reaches the client from the decode worker.
				d.replicaOf(i).r.CanaryTTFT(dec, e.At-st.arrival)
			}
		case sim.Completed:
			d.completed(i, decodeHop, e.At)
			if d.decodeWaiting > 0 {
				d.dispatch(e.At)
			}
		}
	}
}

// completed ends hop k of request i, which its worker completed at `at`,
// and reports whether the request is over (admission.Hop.Ends); then its
// outcome is ok.
func (d *driver) completed(i, k int, at time.Duration) bool {
	st := d.req(i)
	rec := st.rec
	hop := d.path.Hop(k)
	d.end(i, k, admission.Completed(hop.ContextTokens(max(rec.InputLength, 1), rec.OutputLength))) // releases the booking
	if !hop.Ends(rec.OutputLength) {
		return false
	}
	st.out.E2EMs = report.Millis(at - st.arrival)
	st.out.Status = "ok"
	st.done = true
	d.lastAt = max(d.lastAt, at)
	return true
}
