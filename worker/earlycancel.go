package worker

import "time"

// earlyCancels remembers, for a while, the cancels that found nothing
// running here by their id. A session call is marked running in the store
// (where the API reads it) a moment before its worker registers the call's
// cancel (cancels.calls): a cancel sent in that moment must still reach the
// call. Every worker hears every cancel, most of them for runs elsewhere,
// so what is kept is bounded by age and count. Guarded by cancels.mu.
type earlyCancels struct {
	at    map[string]time.Time
	order []earlyCancel // in the order they came, for dropping the oldest
}

// earlyCancel is one note: an id and when it was heard.
type earlyCancel struct {
	id string
	at time.Time
}

const (
	// earlyCancelKeep is how long an early cancel is remembered: far longer
	// than the moment between a call's start in the store and here.
	earlyCancelKeep = time.Minute
	// earlyCancelMax bounds what is remembered at once.
	earlyCancelMax = 4096
)

// note remembers the cancel of id, heard at now.
func (e *earlyCancels) note(id string, now time.Time) {
	if e.at == nil {
		e.at = make(map[string]time.Time)
	}
	for len(e.order) > 0 {
		old := e.order[0]
		if now.Sub(old.at) < earlyCancelKeep && len(e.order) < earlyCancelMax {
			break
		}
		if t, ok := e.at[old.id]; ok && t.Equal(old.at) {
			delete(e.at, old.id) // not a later note of the same id
		}
		e.order = e.order[1:]
	}
	e.order = append(e.order, earlyCancel{id, now})
	e.at[id] = now
}

// take reports whether id was canceled within earlyCancelKeep before now,
// and forgets it.
func (e *earlyCancels) take(id string, now time.Time) bool {
	t, ok := e.at[id]
	if !ok {
		return false
	}
	delete(e.at, id)
	return now.Sub(t) < earlyCancelKeep
}
