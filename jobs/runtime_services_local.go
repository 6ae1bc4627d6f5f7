package jobs

// Serving is the port service id's process listens on while this process's supervisor runs it
// and it has not exited; false otherwise. The preview proxy uses it to trust a cached service row
// (handlers/preview_cache.go).
func (m *Services) Serving(id string) (int, bool) {
	p, ok := m.sup.Running(id)
	if !ok {
		return 0, false
	}
	return p.Port, true
}
