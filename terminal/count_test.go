package terminal

import (
	"testing"
	"time"
)

// TestLiveShells counts open sessions whose shell runs: not a session between shells, not a
// closed one.
func TestLiveShells(t *testing.T) {
	t.Parallel()
	reg := NewRegistry(Options{})
	if n := reg.LiveShells(); n != 0 {
		t.Fatalf("empty registry: %d", n)
	}
	shells := map[string]*fakePty{}
	for _, id := range []string{"a", "b"} {
		p := newYes()
		shells[id] = p
		if _, err := reg.Open(id, func() (Pty, error) { return p, nil }, time.Time{}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close(id, ReasonCancelled) })
	}
	if n := reg.LiveShells(); n != 2 {
		t.Fatalf("two open shells: %d", n)
	}
	shells["a"].Close() // the shell exits: the session stays open, between shells
	waitFor(t, func() bool { return reg.LiveShells() == 1 }, "the exited shell to stop counting")
	if reg.Get("a") == nil {
		t.Fatal("the session closed with its shell")
	}
	reg.Close("b", ReasonCancelled)
	if n := reg.LiveShells(); n != 0 {
		t.Fatalf("after closing b: %d", n)
	}
}
