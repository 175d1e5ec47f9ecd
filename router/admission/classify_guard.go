package admission

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/switchyard-router/switchyard/shared"
)

// ClassifyError is a classifier's failure on one request: an error it
// returned or a panic the router recovered (SafeClassify). It fails only
// that request.
type ClassifyError struct {
	// Classifier names the classifier instance (or type) that failed.
	Classifier string
	// RequestID is the failed request's id, for logs; Error leaves it
	// out, so that the same failure on many requests reads the same.
	RequestID string
	// Err is the error Classify returned; nil after a panic.
	Err error
	// Panic is the recovered panic value, and Stack the goroutine's stack at
	// the panic; both nil when Classify returned an error.
	Panic any
	Stack []byte
}

// Error implements error as "classifier NAME: CAUSE" or "classifier NAME:
// panic: VALUE", without the request's id (RequestID holds it): callers
// group and count failures by their text, and answer it to clients.
func (e *ClassifyError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("classifier %s: panic: %v", e.Classifier, e.Panic)
	}
	return fmt.Sprintf("classifier %s: %v", e.Classifier, e.Err)
}

// Unwrap returns the error Classify returned, or nil after a panic.
func (e *ClassifyError) Unwrap() error { return e.Err }

// SafeClassify calls c.Classify and turns both a returned error and a panic
// into a *ClassifyError naming the classifier and the request, so one
// request's failure never takes down the caller. It also refuses a negative
// SchedulingCostTokens. It adds no allocation on success.
func SafeClassify(ctx context.Context, name string, c shared.Classifier, req *shared.Request) (cl shared.Classification, err error) {
	var id string
	if req != nil {
		id = req.ID
	}
	defer func() {
		if v := recover(); v != nil {
			cl, err = shared.Classification{}, &ClassifyError{Classifier: name, RequestID: id, Panic: v, Stack: debug.Stack()}
		}
	}()
	cl, err = c.Classify(ctx, req)
	if err != nil {
		return shared.Classification{}, &ClassifyError{Classifier: name, RequestID: id, Err: err}
	}
	if cl.SchedulingCostTokens < 0 {
		return shared.Classification{}, &ClassifyError{Classifier: name, RequestID: id,
			Err: fmt.Errorf("scheduling cost %d tokens is negative", cl.SchedulingCostTokens)}
	}
	return cl, nil
}
