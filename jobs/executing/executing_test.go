package executing

import (
	"context"
	"strings"
	"testing"
	"time"

	"berth/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestRegistry: a run is this process's while any of its registrations lasts; the client id
// names the node, and only an id of this node (not one that merely starts with its name) is
// owned; a nil registry knows nothing and owns nothing.
func TestRegistry(t *testing.T) {
	t.Parallel()
	e := New("n1")
	if id := e.ClientID(); !strings.HasPrefix(id, "n1@") || len(id) != len("n1@")+12 || New("n1").ClientID() == id {
		t.Fatalf("client id %q", id)
	}
	first, second := e.Add("r"), e.Add("r")
	first()
	if !e.Has("r") {
		t.Fatal("a run still registered once is not had")
	}
	second()
	if e.Has("r") {
		t.Fatal("a run no longer registered is had")
	}
	for holder, want := range map[string]bool{"n1@abc": true, e.ClientID(): true, "n10@abc": false, "n2@abc": false, "n1": false} {
		if got := e.OwnsHolder(holder); got != want {
			t.Errorf("OwnsHolder(%q) = %v, want %v", holder, got, want)
		}
	}
	var none *Registry
	none.Add("r")()
	if none.Has("r") || none.OwnsHolder("n1@x") || none.ClientID() != "" {
		t.Fatal("a nil registry knows something")
	}
	none.Close()
}

// TestWhileSole: a process that never claimed is never sole; one that claimed is sole while it is
// the only claimant of its node id, not while a second process of that id holds its claim, and
// sole again once that one has closed (the server ends its session a moment later). Another
// node's claim does not count.
func TestWhileSole(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := context.Background()
	sole := func(e *Registry) bool {
		t.Helper()
		var got bool
		if err := e.WhileSole(ctx, func(s bool) error { got = s; return nil }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	me, other, elsewhere := New("n1"), New("n1"), New("n2")
	if sole(me) {
		t.Fatal("sole without a claim")
	}
	for _, e := range []*Registry{me, elsewhere} {
		if err := e.Claim(ctx, pool); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
	}
	if !sole(me) {
		t.Fatal("the only claimant of n1 is not sole")
	}
	if err := other.Claim(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if sole(me) || sole(other) {
		t.Fatal("sole while another process claims the node id")
	}
	other.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !sole(me) {
		if time.Now().After(deadline) {
			t.Fatal("not sole after the other claimant closed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	me.Close()
	if sole(me) {
		t.Fatal("sole after the claim was given back")
	}
}
