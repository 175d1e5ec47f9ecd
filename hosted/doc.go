// Package hosted is Switchyard's hosted fast path: a picker-only policy whose
// picker is in-process and reads at most ACTIVE_REQUESTS runs here with no
// scheduler, no lock and no allocation per request.
//
// The router builds a WorkerInputView on the stack for each request from the
// sorted worker ids of the candidate set, the set's key, and an accessor for
// the in-flight request counts, then calls Select:
//
//	v := hosted.NewWorkerInputView(ids, key, active, blockSize)
//	row, err := hosted.Select(picker, &v)
//
// IntoHosted decides, once per loaded policy, whether a policy qualifies.
package hosted
