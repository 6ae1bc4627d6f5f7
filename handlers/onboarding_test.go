package handlers

import (
	"context"
	"strings"
	"testing"
)

// TestOnboardingChecklist: an instance admin's dashboard has the getting-started checklist with
// the host's findings; steps check off as the instance fills; nobody else sees it.
func TestOnboardingChecklist(t *testing.T) {
	t.Parallel()
	checks := func(context.Context) []HostCheck {
		return []HostCheck{{Name: "Command jail (bubblewrap)", OK: false, Detail: "missing", Fix: "apt-get install bubblewrap"}}
	}
	e := setup(t, func(d *Deps) { d.HostChecks = checks })
	admin := e.actorWith("root@instance.test", true, "", "")
	_, body := e.getPage(e.browser(admin), "/", nil)
	if !strings.Contains(body, `id="onboarding"`) || !strings.Contains(body, "0 of 5 steps done") || !strings.Contains(body, "apt-get install bubblewrap") {
		t.Fatalf("a fresh instance's checklist:\n%s", body)
	}
	w := newTaskWorldOn(e) // a company, a local environment, a project
	_, body = e.getPage(e.browser(admin), "/", nil)
	if !strings.Contains(body, "2 of 5 steps done") { // company and project; the environment needs a working jail
		t.Errorf("after company and project the checklist says:\n%s", body[strings.Index(body, `id="onboarding"`):][:400])
	}
	w.exec(`INSERT INTO runs (company_id, status, command) VALUES ($1, 'succeeded', 'true')`, w.r.A.ID)
	_, body = e.getPage(e.browser(admin), "/", nil)
	if !strings.Contains(body, "3 of 5 steps done") {
		t.Errorf("after a successful run the checklist says:\n%s", body[strings.Index(body, `id="onboarding"`):][:400])
	}
	for _, a := range []actor{w.r.Board, w.r.Viewer} {
		if _, body := e.getPage(e.browser(a), "/", nil); strings.Contains(body, `id="onboarding"`) {
			t.Errorf("%s sees the instance checklist", a.User.Email)
		}
	}
}

// TestHelpPages: the documents render with heading anchors, every page links its section, and an
// unknown document is a 404; help needs a session.
func TestHelpPages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	c := e.browser(r.Viewer)
	code, body := e.getPage(c, "/help/pages", nil)
	if code != 200 || !strings.Contains(body, `id="the-layout-check"`) || !strings.Contains(body, "<h1") {
		t.Fatalf("/help/pages = %d", code)
	}
	if code, body := e.getPage(c, "/help", nil); code != 200 || !strings.Contains(body, `href="/help/runs"`) {
		t.Errorf("/help = %d", code)
	}
	if code, _ := e.getPage(c, "/help/nope", nil); code != 404 {
		t.Errorf("unknown document = %d, want 404", code)
	}
	if code, _ := e.getPage(e.client(), "/help/pages", nil); code != 303 {
		t.Errorf("help without a session = %d, want the sign-in redirect", code)
	}
	if _, body := e.getPage(c, "/companies/"+r.A.ID+"/members", nil); !strings.Contains(body, `href="/help/decisions#tenancy-and-roles-docsapimd"`) {
		t.Error("the members page does not link its help section")
	}
	for path, want := range map[string]string{"/runs/x": "/help/runs#flow", "/tasks/x/files": "/help/security#file-browser-and-git-internals",
		"/companies/x/audit": "/help/security", "/companies/x": "/help/decisions#projects-and-workspaces", "/help/pages": ""} {
		if got := helpFor(path); got != want {
			t.Errorf("helpFor(%s) = %q, want %q", path, got, want)
		}
	}
	// Every help link of every page names a document and a heading that exist.
	for _, h := range append(helpSections, struct{ prefix, help string }{"/", "/help/pages"}) {
		doc, anchor, _ := strings.Cut(h.help, "#")
		code, body := e.getPage(c, doc, nil)
		if code != 200 || anchor != "" && !strings.Contains(body, `id="`+anchor+`"`) {
			t.Errorf("%s links %s: document %d, or no heading #%s", h.prefix, h.help, code, anchor)
		}
	}
}
