package live

import (
	"testing"

	"berth/db"
)

// TestEventsDropsSlowSubscriber: a subscriber whose queue is full is dropped, and the others
// still get the event.
func TestEventsDropsSlowSubscriber(t *testing.T) {
	t.Parallel()
	h := New(1)
	slow, fast := h.Subscribe(nil), h.Subscribe(nil)
	for _, s := range []*Subscription{slow, fast} {
		s.SetCompanies(nil, true)
		s.Start("")
	}
	ev := db.Event{CompanyID: "c", Topic: "run", ID: "r"}
	h.Publish(ev)
	<-fast.C()
	h.Publish(ev) // slow's queue is full now
	if _, ok := <-slow.C(); !ok {
		t.Fatal("the first event was lost")
	}
	if _, ok := <-slow.C(); ok {
		t.Fatal("the slow subscriber was not dropped")
	}
	if got := <-fast.C(); got.Change != ev || h.Dropped() != 1 || h.Subscribers() != 1 {
		t.Fatalf("fast got %+v; dropped %d, subscribers %d", got, h.Dropped(), h.Subscribers())
	}
}

// TestCatchUpAndScope: a subscription started at a cursor gets the matching changes of its
// companies published after it, in order; another company's change and a filtered-out one are
// not delivered; a cursor of another process, or one the ring no longer reaches, is a resync.
func TestCatchUpAndScope(t *testing.T) {
	t.Parallel()
	h := New(0)
	start := h.Cursor()
	runs := func(e db.Event) bool { return e.Topic == "run" }
	h.Publish(db.Event{CompanyID: "A", Topic: "run", ID: "1"})
	h.Publish(db.Event{CompanyID: "b", Topic: "run", ID: "2"})
	h.Publish(db.Event{CompanyID: "a", Topic: "lease", ID: "3"})
	h.Publish(db.Event{CompanyID: "a", Topic: "run", ID: "4"})
	sub := h.Subscribe(runs)
	sub.SetCompanies([]string{"A"}, false)
	missed, resync := sub.Start(start)
	defer sub.Stop()
	if resync || len(missed) != 2 || missed[0].Change.ID != "1" || missed[1].Change.ID != "4" {
		t.Fatalf("missed %+v, resync %v; want runs 1 and 4 of company a", missed, resync)
	}
	h.Publish(db.Event{CompanyID: "b", Topic: "run", ID: "5"})
	h.Publish(db.Event{CompanyID: "a", Topic: "run", ID: "6"})
	if got := <-sub.C(); got.Change.ID != "6" {
		t.Fatalf("live: got %+v, want run 6", got)
	}
	for _, cursor := range []string{"other-1", "x"} {
		other := h.Subscribe(nil)
		other.SetCompanies(nil, true)
		if _, resync := other.Start(cursor); !resync {
			t.Errorf("cursor %q: no resync", cursor)
		}
		other.Stop()
	}
	// A listener reconnect between the cursor and now: a resync, whatever else came.
	c := h.Cursor()
	h.Listening()
	again := h.Subscribe(runs)
	again.SetCompanies([]string{"a"}, false)
	if _, resync := again.Start(c); !resync {
		t.Fatal("a gap in listening did not resync")
	}
	again.Stop()
	if got := <-sub.C(); !got.Resync { // the live stream hears of the gap too
		t.Fatalf("live stream after the reconnect got %+v, want a resync", got)
	}
	h.Close()
	if _, ok := <-sub.C(); ok {
		t.Fatal("Close left a stream open")
	}
}
