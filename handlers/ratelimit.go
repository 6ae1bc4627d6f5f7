package handlers

import (
	"math"
	"sync"
	"time"
)

// rateLimiter is a token bucket per key (a user id) held in this process's memory: each node of a
// scaled-out deployment counts on its own, so a caller spread over N web nodes may make up to N
// times the rate. A bucket holds burst tokens, starts full and refills evenly over window.
//
// It is kept as the generic cell rate algorithm: per key, only the time at which the bucket will
// be full again (tat), in exact integer durations, so no rounding ever grants or refuses a token
// it should not. Buckets that are full again are swept once the map grows, so memory follows the
// active callers.
type rateLimiter struct {
	interval time.Duration // time to refill one token: window / burst
	window   time.Duration // time to refill the whole bucket
	now      func() time.Time

	mu        sync.Mutex
	tat       map[string]time.Time
	lastSweep time.Time
}

// rateSweepAt is the number of keys above which allow drops the buckets that are full again.
const rateSweepAt = 1024

// newRateLimiter allows burst requests per window per key, refilled evenly over the window; now is
// the clock (time.Now outside tests).
func newRateLimiter(burst int, window time.Duration, now func() time.Time) *rateLimiter {
	burst = max(burst, 1)
	window = max(window, time.Second)
	return &rateLimiter{interval: window / time.Duration(burst), window: window, now: now, tat: map[string]time.Time{}}
}

// allow takes one token from key's bucket. When the bucket is empty it takes nothing and reports
// how long until a token is available.
func (l *rateLimiter) allow(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.sweep(now)
	tat := l.tat[key]
	if tat.Before(now) {
		tat = now // a full bucket: unused time does not accumulate beyond the burst
	}
	// The bucket lacks tat-now worth of refill; one more token may be taken while that stays
	// within the bucket's size minus the token itself.
	if wait := tat.Sub(now) - (l.window - l.interval); wait > 0 {
		return false, wait
	}
	l.tat[key] = tat.Add(l.interval)
	return true, 0
}

// sweep drops the buckets that are full again (a missing key starts full anyway), at most once
// per window and only when the map is large.
func (l *rateLimiter) sweep(now time.Time) {
	if len(l.tat) < rateSweepAt || now.Sub(l.lastSweep) < l.window {
		return
	}
	l.lastSweep = now
	for k, tat := range l.tat {
		if !tat.After(now) {
			delete(l.tat, k)
		}
	}
}

// retryAfterSeconds is a wait as the whole seconds of a Retry-After header (at least 1).
func retryAfterSeconds(d time.Duration) int {
	return max(int(math.Ceil(d.Seconds())), 1)
}
