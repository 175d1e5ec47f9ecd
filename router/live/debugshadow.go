package live

import "net/http"

// debugShadow answers GET /debug/shadow (on --debug-listen's address) with
// the Router's router.ShadowView: the sample rate and the measured
// capacity behind it, the shadow's results, agreement, failures and
// latency quantiles, and the last router.DefaultShadowRecent shadow
// decisions (request id, live worker, shadow worker, result, time). Its
// size is bounded by that ring.
func (rt *Runtime) debugShadow(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusOK, rt.r.ShadowView())
}
