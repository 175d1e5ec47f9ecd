package live

import (
	"context"
	"fmt"
	"time"

	"github.com/switchyard-router/switchyard/router"
	"github.com/switchyard-router/switchyard/router/admission"
	"github.com/switchyard-router/switchyard/shared"
)

// PrefillHop is the prefill hop of a disaggregated request that Place
// placed: the worker that computes the prompt's KV and the first token,
// for the decode worker to fetch (vLLM's disaggregated-serving protocol,
// whose prefill request the decode side's sidecar sends; see router/pd).
type PrefillHop struct {
	// Handle books the prefill on its worker; EndPrefill (or FirstByte,
	// or Finish) ends it exactly once.
	Handle *admission.Handle
	// Decision is the prefill hop's placement (the prefill role's
	// policy).
	Decision router.Decision
	// URL is the prefill worker's engine base URL (Workers.URL), without
	// a trailing "/".
	URL string

	ended bool
}

// Disaggregated reports whether model is served in prefill and decode
// hops: no aggregated worker of the fleet serves it and a prefill worker
// does (the rule serve's HTTP face applies).
func (rt *Runtime) Disaggregated(model string) bool {
	return len(rt.r.Workers(model, shared.RoleAggregated)) == 0 && len(rt.r.Workers(model, shared.RolePrefill)) > 0
}

// decodeFollowUp is the one hop of a disaggregated model's Responses
// follow-up (previous_response_id): on the decode worker that answered
// the previous response, which alone stores it (a prefill engine does
// not: a prefill hop would answer 404), computing the whole prompt
// itself, as a vLLM decode engine does for a request without
// kv_transfer_params; so its request carries the prompt's block hashes.
var decodeFollowUp = admission.Hop{Role: shared.RoleDecode, PrefixHashes: true, Final: true}

// FollowUpHop is the hop a Responses follow-up of model runs in, on
// both faces: one hop on the decode worker holding the previous response
// when the model is served disaggregated (Disaggregated), else the
// aggregated path's one hop.
func (rt *Runtime) FollowUpHop(model string) admission.Hop {
	if rt.Disaggregated(model) {
		return decodeFollowUp
	}
	return admission.Aggregated.Hop(0)
}

// placeDisaggregated places req on admission.Disaggregated's two hops, as
// serve walks them, but both before anything is sent: the prefill hop
// (tag "#", role prefill, the prompt's block hashes) is admitted and
// placed first, then the decode hop (tag "#d", role decode, no block
// hashes: its KV arrives by transfer). opts apply to both. The Placed is
// the decode hop's, its meter reading the decode answer, with Prefill
// set. Errors as Place's; shared.ErrNoWorkers (wrapped) when no decode
// worker serves the model. On an error both handles have ended.
func (rt *Runtime) placeDisaggregated(ctx context.Context, req *Request, refused Placed, opts []admission.Option) (Placed, error) {
	if len(rt.r.Workers(req.Model, shared.RoleDecode)) == 0 {
		return refused, fmt.Errorf("%w: no ready decode worker for model %q: it is served disaggregated (it has prefill workers but no aggregated one)",
			shared.ErrNoWorkers, req.Model)
	}
	ph, pd, purl, err := rt.placeHop(ctx, req, admission.Disaggregated.Hop(0), "#", opts)
	if err != nil {
		return refused, err
	}
	dh, dd, durl, err := rt.placeHop(ctx, req, admission.Disaggregated.Hop(1), "#d", opts)
	if err != nil {
		rt.End(ph, admission.Aborted("decode hop not placed: "+err.Error()))
		return refused, err
	}
	p := refused
	p.Handle, p.Decision, p.URL, p.PromptTokens = dh, dd, durl, req.Tokens
	p.Prefill = &PrefillHop{Handle: ph, Decision: pd, URL: purl}
	p.meter = rt.Meter(dh, dd, req, true, 0)
	// The decode engine answers the client, and so stores the response:
	// its id is bound to the decode worker (FollowUpHop runs the
	// follow-up there).
	p.bind = req.API == APIResponses
	return p, nil
}

// placeHop admits one hop of req and waits for its placement; on an
// error its handle has ended.
func (rt *Runtime) placeHop(ctx context.Context, req *Request, hop admission.Hop, tag string, opts []admission.Option) (*admission.Handle, router.Decision, string, error) {
	h, err := rt.Admit(ctx, req, hop, tag, opts...)
	if err != nil {
		return nil, router.Decision{}, "", err
	}
	d, err := h.Wait(ctx)
	if err != nil {
		rt.End(h, admission.Aborted("not placed: "+err.Error()))
		return nil, router.Decision{}, "", err
	}
	url, ok := rt.workers.URL(d.Worker.Name)
	if !ok {
		rt.End(h, admission.Aborted("worker unknown"))
		return nil, router.Decision{}, "", fmt.Errorf("live: placed on worker %q, which the workers do not know", d.Worker.Name)
	}
	return h, d, url, nil
}

// EndPrefill ends p's prefill hop, once: completed when ok (its first
// token counted, admission.Handle.FirstToken, and the prompt plus that
// one token as its context, as serve ends a prefill that answered its
// kv_transfer_params), else aborted with reason. The EPP calls it when
// the decode answer starts (its status: an error status means the
// prefill, or the decode, failed) since the prefill's own answer goes to
// the decode side's sidecar, not through the proxy. A no-op for an
// aggregated Placed or a prefill already ended.
func (rt *Runtime) EndPrefill(p *Placed, ok bool, reason string) {
	ph := p.Prefill
	if ph == nil || ph.ended {
		return
	}
	ph.ended = true
	if !ok {
		rt.End(ph.Handle, admission.Aborted(reason))
		return
	}
	ph.Handle.FirstToken()
	if d := ph.Decision; d.Canary != nil {
		rt.r.CanaryTTFT(d, time.Since(p.start)) // the prefill role's canary
	}
	rt.End(ph.Handle, admission.Completed(admission.Disaggregated.Hop(0).ContextTokens(p.PromptTokens, 1)))
}
