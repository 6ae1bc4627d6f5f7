// Package views holds Berth's templ components: the page frame, one file per resource with its
// page and the partials htmx swaps. Views take plain structs and never query.
package views

import "strings"

// Frame is what every full page needs besides its own content.
type Frame struct {
	Title string
	// Flash is the one-time confirmation of the form that led here ("" when none).
	Flash   string
	Active  string // nav key of the current section: "dashboard", "projects", "environments", …
	Email   string // signed-in user's email; empty on public pages
	IsAdmin bool
	Version string
	Assets  AssetURLs
	// Company is the company the page belongs to; nil on instance-level pages (dashboard).
	Company *CompanyNav
	// Events is the page's GET /events URL (docs/live.md): the body subscribes to it and the
	// page's live fragments re-fetch on its events; "" for a page that is not live.
	Events string
	// Help is the page's section of the documentation (/help/…), linked from the navigation.
	Help string
	// ProjectID is the project the page belongs to, if any: `g t` opens its tasks.
	ProjectID string
}

// CompanyNav is the company a page belongs to, and the caller's standing in it.
type CompanyNav struct {
	ID        string
	Name      string
	Slug      string
	Role      string // board, viewer, or "" for an instance admin who is not a member
	CanManage bool   // board member
	IsAdmin   bool   // instance admin
}

// AssetURLs are the content-hashed URLs of the front-end files a page loads.
type AssetURLs struct {
	CSS     string
	HTMX    string
	App     string
	Favicon string
	SSE     string // htmx's SSE extension (htmx-ext-sse)
	Theme   string // js/theme.js: applies the chosen theme before the first paint (not deferred)
}

// NavItem is one entry of the top navigation.
type NavItem struct {
	Key   string
	Label string
	Href  string
}

// Nav is the section navigation: the dashboard, and on a company page the company's sections
// (Leases filtered to that company); the instance admin's tools are AdminNav's.
func Nav(f Frame) []NavItem {
	items := []NavItem{{Key: "dashboard", Label: "Dashboard", Href: "/"}}
	if c := f.Company; c != nil {
		base := "/companies/" + c.ID
		items = append(items,
			NavItem{Key: "projects", Label: "Projects", Href: base},
			NavItem{Key: "workspaces", Label: "Workspaces", Href: base + "/workspaces"},
			NavItem{Key: "environments", Label: "Environments", Href: base + "/environments"},
			NavItem{Key: "leases", Label: "Leases", Href: "/leases?company_id=" + c.ID},
			NavItem{Key: "agents", Label: "Agents", Href: base + "/agents"},
			NavItem{Key: "members", Label: "Members", Href: base + "/members"},
			NavItem{Key: "audit", Label: "Audit", Href: base + "/audit"},
		)
	} else {
		items = append(items, NavItem{Key: "leases", Label: "Leases", Href: "/leases"})
	}
	return items
}

// AdminNav is the instance administrator's tools, one menu in the navigation: River's job UI,
// unmanaged directories, nodes and source roots. Empty for everyone else.
func AdminNav(f Frame) []NavItem {
	if !f.IsAdmin {
		return nil
	}
	return []NavItem{
		{Key: "admin-jobs", Label: "Jobs", Href: "/admin/jobs"},
		{Key: "admin-workspaces", Label: "Unmanaged dirs", Href: "/admin/workspaces"},
		{Key: "admin-nodes", Label: "Nodes", Href: "/admin/nodes"},
		{Key: "admin-source-roots", Label: "Source roots", Href: "/admin/source-roots"},
	}
}

func adminActive(f Frame, items []NavItem) bool {
	for _, it := range items {
		if it.Key == f.Active {
			return true
		}
	}
	return false
}

// Shortcut is one `g <key>` keyboard shortcut: the page it opens.
type Shortcut struct {
	Key   string
	Label string
	Href  string
}

// Shortcuts are the `g` shortcuts of a page: those whose target exists from here (a company's
// sections only inside a company, its tasks only inside a project).
func Shortcuts(f Frame) []Shortcut {
	out := []Shortcut{{Key: "d", Label: "Dashboard", Href: "/"}}
	if c := f.Company; c != nil {
		base := "/companies/" + c.ID
		out = append(out, Shortcut{Key: "p", Label: "Projects", Href: base})
		if f.ProjectID != "" {
			out = append(out, Shortcut{Key: "t", Label: "Tasks of this project", Href: "/projects/" + f.ProjectID + "/tasks"})
		}
		out = append(out,
			Shortcut{Key: "w", Label: "Workspaces", Href: base + "/workspaces"},
			Shortcut{Key: "e", Label: "Environments", Href: base + "/environments"},
			Shortcut{Key: "l", Label: "Leases", Href: "/leases?company_id=" + c.ID})
	} else {
		out = append(out, Shortcut{Key: "l", Label: "Leases", Href: "/leases"})
	}
	out = append(out, Shortcut{Key: "s", Label: "Settings", Href: "/settings"}, Shortcut{Key: "h", Label: "Help", Href: "/help"})
	return out
}

// initial is the avatar letter of an email.
func initial(email string) string {
	for _, r := range email {
		return strings.ToUpper(string(r))
	}
	return "?"
}
