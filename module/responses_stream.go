package module

import (
	"encoding/json"
	"net/http"

	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/responses"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// A background response's stream is written by internal/responses (docs/responses.md); a
// respCall is the responses.Store it reads through: this call's storage, the runner here, and
// the block's budget of bytes held in memory.

// finalObjects keeps the final objects of finished responses for every call of the process.
var finalObjects = responses.NewObjects()

// responseKeepAlive is how often a response's stream writes an SSE comment.
var responseKeepAlive = responses.KeepAlive

// reader is the call's reader of responses, made on first use.
func (a *respCall) reader() *responses.Reader {
	if a.rd == nil {
		a.rd = &responses.Reader{Store: a, Clock: a.h.clock, Context: a.r.Context(), Objects: finalObjects, KeepAlive: responseKeepAlive}
	}
	return a.rd
}

// GetOperation is the operation id as stored now.
func (a *respCall) GetOperation(id string) (*store.Operation, error) { return a.st.GetOperation(id) }

// Live is the running attempt's stream of op, here or on another replica; nil when none has
// begun.
func (a *respCall) Live(op *store.Operation) streams.Source {
	if s := a.run.StreamOf(op.ID); s != nil {
		return s
	}
	if f, _ := a.run.FollowStored(op); f != nil {
		return f
	}
	return nil
}

// AwaitAnswer waits as a follower of an operation's stream does (awaitAnswer).
func (a *respCall) AwaitAnswer(op *store.Operation) *store.Operation {
	op, _ = a.h.awaitAnswer(&opsRequest{w: a.w, r: a.r, st: a.st, run: a.run, caller: a.caller, log: a.log}, op, a.h.now().Add(streamWaitMax))
	return op
}

// writeStored writes a stored answer.
func writeStored(w http.ResponseWriter, resp store.Response) { capture.WriteResponse(w, resp) }

// jsonBody is v as an answer's JSON body.
func jsonBody(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}
