package terminal

// LiveShells is how many of the registry's sessions have a shell running now (GET /metrics
// berth_terminal_sessions). A session between shells (its shell exited, or its grace period
// passed with no client) is open but not counted.
func (r *Registry) LiveShells() int {
	r.mu.Lock()
	sessions := make([]*Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		sessions = append(sessions, s)
	}
	r.mu.Unlock()
	n := 0
	for _, s := range sessions { // outside r.mu: Live takes the session's own lock
		if s.Live() {
			n++
		}
	}
	return n
}
