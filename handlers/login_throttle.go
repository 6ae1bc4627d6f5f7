package handlers

import (
	"time"

	"berth/db"
)

// LoginLimit is the sign-in throttle: after Free failures (per account, per address) each further
// failure doubles the wait before the next attempt is checked, from one second up to MaxDelay.
// There is no lockout: the wait always ends, and a correct password from an address that has not
// been failing is checked even while the account is being slowed down.
type LoginLimit struct {
	PerAccount int           // failures per account before delays start (default 5)
	PerAddress int           // failures per client address before delays start (default 20)
	Window     time.Duration // how far back failures count (default 1 h; at least MaxDelay)
	MaxDelay   time.Duration // the longest wait (default 15 min)
}

// withDefaults fills in the zero fields.
func (l LoginLimit) withDefaults() LoginLimit {
	if l.PerAccount <= 0 {
		l.PerAccount = 5
	}
	if l.PerAddress <= 0 {
		l.PerAddress = 20
	}
	if l.MaxDelay <= 0 {
		l.MaxDelay = 15 * time.Minute
	}
	if l.Window <= 0 {
		l.Window = time.Hour
	}
	l.Window = max(l.Window, l.MaxDelay)
	return l
}

// loginDelay is the wait after n failures when free of them cost nothing: 1 s, 2 s, 4 s, …,
// capped at maxDelay.
func loginDelay(n, free int, maxDelay time.Duration) time.Duration {
	if n < free {
		return 0
	}
	shift := n - free
	if shift >= 30 {
		return maxDelay
	}
	return min(time.Second<<shift, maxDelay)
}

// loginWait is how long the caller must still wait before its password is checked (zero: check
// it now). The address's own delay always applies; the account's applies only to addresses that
// have been failing, so an attacker elsewhere cannot keep the owner out.
func (l LoginLimit) loginWait(f db.LoginFailures) time.Duration {
	wait := loginDelay(f.Address, l.PerAddress, l.MaxDelay) - f.AddressSince
	if f.Address > 0 {
		wait = max(wait, loginDelay(f.Account, l.PerAccount, l.MaxDelay)-f.AccountSince)
	}
	return max(wait, 0)
}
