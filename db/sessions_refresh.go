package db

import (
	"crypto/sha256"
	"sync"
	"time"
)

// scs saves a session on every request when an idle timeout is set, only to move its expiry a
// few seconds on: a write, and a WAL flush, per page view. The store skips a save whose data is
// what this process last saw of the session (loaded or written) and whose expiry moves on by less
// than sessionRefreshEvery from the one it last wrote. The stored expiry then lags the idle
// deadline by under a minute: a session idle for its whole timeout may end that much early.
// Anything else (new data, a session another process changed, a first save) is written.
const sessionRefreshEvery = time.Minute

// sessionSeen is what this process last saw of one session.
type sessionSeen struct {
	sum     [32]byte  // of its data
	written time.Time // the expiry this process wrote with that data; zero when only loaded
}

// sessionMemory is the store's bounded memory of sessions (by stored key).
type sessionMemory struct {
	mu   sync.Mutex
	seen map[string]sessionSeen
}

const sessionMemoryMax = 10000

// loaded records the data a find returned.
func (m *sessionMemory) loaded(key string, data []byte) {
	sum := sha256.Sum256(data)
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.seen[key]; ok && s.sum == sum {
		return // what this process wrote: its written expiry still holds
	}
	m.put(key, sessionSeen{sum: sum})
}

// skip reports whether saving data with expiry may be left out.
func (m *sessionMemory) skip(key string, data []byte, expiry time.Time) bool {
	sum := sha256.Sum256(data)
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seen[key]
	return ok && s.sum == sum && !s.written.IsZero() && !expiry.Before(s.written) &&
		expiry.Sub(s.written) < sessionRefreshEvery
}

// wrote records a save.
func (m *sessionMemory) wrote(key string, data []byte, expiry time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.put(key, sessionSeen{sum: sha256.Sum256(data), written: expiry})
}

// forget drops a deleted session.
func (m *sessionMemory) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.seen, key)
}

// put stores s under key; callers hold the lock.
func (m *sessionMemory) put(key string, s sessionSeen) {
	if m.seen == nil || len(m.seen) >= sessionMemoryMax {
		m.seen = map[string]sessionSeen{}
	}
	m.seen[key] = s
}
