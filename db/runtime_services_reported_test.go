package db

import (
	"testing"
	"time"
)

// TestRuntimeServiceReported: an accepted start reads starting until the job moves the row on.
func TestRuntimeServiceReported(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	before, after := t0.Add(-time.Second), t0.Add(time.Second)
	cases := []struct {
		name           string
		status, wanted string
		requested      *time.Time
		stopped        *time.Time
		want           string
	}{
		{"never asked", ServiceStopped, DesiredStopped, nil, nil, ServiceStopped},
		{"accepted, never ran", ServiceStopped, DesiredRunning, &t0, nil, ServiceStarting},
		{"accepted after it stopped", ServiceStopped, DesiredRunning, &after, &t0, ServiceStarting},
		{"accepted after it failed", ServiceFailed, DesiredRunning, &after, &t0, ServiceStarting},
		{"failed after the start was accepted", ServiceFailed, DesiredRunning, &before, &t0, ServiceFailed},
		{"stop asked since", ServiceStopped, DesiredStopped, &after, &t0, ServiceStopped},
		{"running is running", ServiceRunning, DesiredRunning, &after, &t0, ServiceRunning},
		{"stopping is stopping", ServiceStopping, DesiredRunning, &after, &t0, ServiceStopping},
	}
	for _, c := range cases {
		s := RuntimeService{Status: c.status, DesiredState: c.wanted, StartRequestedAt: c.requested, StoppedAt: c.stopped}
		if got := s.Reported(); got != c.want {
			t.Errorf("%s: Reported() = %q, want %q", c.name, got, c.want)
		}
	}
}
